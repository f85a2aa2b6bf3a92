#!/usr/bin/env bash
# The cluster's costs, in one run on this machine:
#   - the router hop: the lean Rust gRPC client (benches/grpc_load.rs) and perf_analyzer against one
#     mesh-node called directly and through mesh-router (mutual TLS on the QUIC link), c=1 and c=8,
#     on the small unbatched MLP;
#   - large tensors: a 16 MiB FP32 identity model, directly and through the router, whose link
#     to the node on this host uses shared memory, and through a second router and node with
#     --cluster-shared-memory false (every byte over QUIC);
#   - the link on its own against a plain gRPC hop over TCP for the same echo call (benches/link.rs).
# Output: a markdown report on stdout and in benches/results/cluster-<host>.md.
# Usage: benches/cluster.sh [SECONDS_PER_POINT]   (needs scripts/setup.sh to have run; ~4 minutes)
DEFAULT_SECS=4
source "$(dirname "$0")/common.sh"
ROUTER=target/release/mesh-router
OPS=target/release/mesh-ops
OUT=benches/results/cluster-$(hostname).md
[ -x "$ROUTER" ] && [ -x "$OPS" ] || { echo "run scripts/setup.sh first" >&2; exit 1; }

# Models: the MLP unbatched (latency), and a 16 MiB identity.
write_mlp "$WORK/repo"
mkdir -p "$WORK/repo/big/1"
.venv/bin/python - "$WORK/repo/big/1/model.onnx" <<'PY'
import sys, onnx
from onnx import helper, TensorProto
n = 4 * 1024 * 1024  # 16 MiB of FP32
g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "big",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
m.ir_version = 8  # what onnxruntime 1.31 reads (the onnx wheel writes a newer one by default)
onnx.save(m, sys.argv[1])
PY
cluster_certs router:router node:node

cargo build -q --release -p mesh-node --bench grpc_load
cargo build -q --release -p mesh-router --bench link
LOAD=$(ls -t target/release/deps/grpc_load-* | grep -v '\.d$' | head -1)

"$ROUTER" --http-port 28300 --grpc-port 28301 --metrics-port 28302 --cluster-port 28303 $(tls router) \
  >"$WORK/router.log" 2>&1 &
"$BIN" --model-repository "$WORK/repo" --http-port 28310 --grpc-port 28311 --metrics-port 28312 \
  --cluster-join 127.0.0.1:28303 --node-name node $(tls node) >"$WORK/node.log" 2>&1 &
# The same pair with the link's shared memory off: tensors cross the link as QUIC packets.
"$ROUTER" --http-port 28320 --grpc-port 28321 --metrics-port 28322 --cluster-port 28323 $(tls router) \
  --cluster-shared-memory false >"$WORK/router-quic.log" 2>&1 &
"$BIN" --model-repository "$WORK/repo" --http-port 28330 --grpc-port 28331 --metrics-port 28332 \
  --cluster-join 127.0.0.1:28323 --node-name node $(tls node) --cluster-shared-memory false \
  >"$WORK/node-quic.log" 2>&1 &
wait_live 28310; wait_live 28300; wait_live 28330; wait_live 28320
for port in 28300 28320; do
  for _ in $(seq 60); do curl -sf "localhost:$port/v2/models/big/ready" >/dev/null && break; sleep 0.5; done
done

lean() {  # label port model concurrency: one markdown row from grpc_load's ModelInfer line
  "$LOAD" "http://127.0.0.1:$2" "$3" "$4" "$SECS" 2>/dev/null | grep ModelInfer \
    | sed "s/| ModelInfer |/| $3 | $4 | $1 |/"
}

{
echo "# The cluster: router hop, large tensors, the link, $(date -u +%F), $(nproc) vCPU $(lscpu | sed -n 's/Model name: *//p' | head -1), $(uname -r)"
echo
echo "One mesh-node on loopback, called directly and through mesh-router (QUIC, mutual TLS)."
echo
echo "## Router hop, lean Rust gRPC client (grpc_load)"
echo "| model | concurrency | path | req/s | p50 µs | p99 µs |"
echo "|---|---|---|---|---|---|"
for c in 1 8; do
  lean direct 28311 mlp "$c"
  lean "through router" 28301 mlp "$c"
done
echo
echo "## Router hop, perf_analyzer (gRPC)"
echo "| model | concurrency | path | infer/s | p50 µs | p99 µs |"
echo "|---|---|---|---|---|---|"
for c in 1 8; do
  measure direct 28311 mlp "$c"
  measure "through router" 28301 mlp "$c"
done
echo
echo "## 16 MiB input and output (identity), grpc_load"
echo "| model | concurrency | path | req/s | p50 µs | p99 µs |"
echo "|---|---|---|---|---|---|"
for c in 1 4; do
  lean direct 28311 big "$c"
  lean "through router (shared memory)" 28301 big "$c"
  lean "through router (QUIC)" 28321 big "$c"
done
echo
echo "## The link alone against a gRPC hop over TCP (benches/link.rs, echo, one process)"
cargo bench -q -p mesh-router --bench link -- "$SECS" 2>/dev/null | grep '^|'
} | tee "$OUT"
