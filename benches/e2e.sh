#!/usr/bin/env bash
# End-to-end benchmark of mesh-node on the small ONNX MLP (target/models/simple/mlp), in one run:
#   - raw in-process ONNX Runtime on the same model (the ceiling), via benches/raw_ort.rs;
#   - perf_analyzer (Triton's own load tool, from ../shared/tools/peers.sh) over gRPC and HTTP at concurrency 1, 4, 16;
#   - the lean Rust gRPC client (benches/grpc_load.rs): ModelInfer next to ServerLive, the transport floor;
#   - real Triton 2.51's ServerLive with the same client, to show the floor is the machine's, not ours.
# Output: a markdown report on stdout and in benches/results/e2e-<host>.md.
# Usage: benches/e2e.sh [SECONDS_PER_POINT]   (needs scripts/setup.sh to have run; ~3 minutes)
DEFAULT_SECS=4
source "$(dirname "$0")/common.sh"
MODEL_DIR=target/models/simple/mlp
OUT=benches/results/e2e-$(hostname).md
# Latency is measured unbatched: dynamic batching would add its queue delay at concurrency 1.
write_mlp "$WORK"
mkdir -p "$WORK/empty"
cargo build -q --release -p mesh-node --benches

# (raw_ort resolves a relative path from its crate dir, so pass an absolute one)
{
echo "# mesh-node end-to-end, $(date -u +%F), $(nproc) vCPU $(lscpu | sed -n 's/Model name: *//p' | head -1), $(uname -r)"
echo
echo "## Raw ONNX Runtime in process (ceiling)"
cargo bench -q -p mesh-node --bench raw_ort -- "$PWD/$MODEL_DIR" 20000 2>/dev/null | grep '^|'
echo
"$BIN" --model-repository "$WORK" --http-port 28100 --grpc-port 28101 --metrics-port 28102 >"$WORK/node.log" 2>&1 &
sleep 3
echo "## perf_analyzer against mesh-node (batch 1)"
echo "| protocol | concurrency | infer/s | p50 µs | p99 µs |"
echo "|---|---|---|---|---|"
for proto in grpc http; do
  port=28101; [ "$proto" = http ] && port=28100
  for c in 1 4 16; do
    "$PEERS/bin/perf_analyzer" -m mlp -u "localhost:$port" -i "$proto" --concurrency-range "$c" \
      --measurement-interval $((SECS * 1000)) --stability-percentage 25 -f "$WORK/pa.csv" >/dev/null 2>&1 || true
    python3 - "$WORK/pa.csv" "$proto" "$c" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
r = rows[-1]
print(f"| {sys.argv[2]} | {sys.argv[3]} | {float(r['Inferences/Second']):.0f} | {r['p50 latency']} | {r['p99 latency']} |")
PY
  done
done
echo
echo "## Lean Rust gRPC client: ModelInfer vs ServerLive (transport floor)"
for c in 1 4 16; do
  cargo bench -q -p mesh-node --bench grpc_load -- http://127.0.0.1:28101 mlp "$c" "$SECS" 2>/dev/null | grep '^|'
  echo
done
kill %1 2>/dev/null || true
"$PEERS/bin/tritonserver" --model-repository "$WORK/empty" --http-port 28200 --grpc-port 28201 --metrics-port 28202 >"$WORK/triton.log" 2>&1 &
for _ in $(seq 60); do curl -sf localhost:28200/v2/health/live >/dev/null && break; sleep 0.5; done
echo "## Real Triton 2.51: ServerLive with the same client"
for c in 1 4 16; do
  cargo bench -q -p mesh-node --bench grpc_load -- http://127.0.0.1:28201 - "$c" "$SECS" 2>/dev/null | grep '^|'
  echo
done
} | tee "$OUT"
