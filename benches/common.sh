# Shared set-up of the benchmark scripts (sourced): repository root, peers, binary, a work folder
# removed on exit with every server started in the background. Sets SECS, PEERS, BIN, WORK; defines
# measure, wait_live, write_add_sub, write_mlp, cluster_certs and tls.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-${DEFAULT_SECS:-5}}
PEERS=${PEERS:-.peers}
[ -x "$PEERS/bin/perf_analyzer" ] || bash ../shared/tools/peers.sh "$PEERS" >/dev/null
BIN=target/release/mesh-node
[ -x "$BIN" ] && [ -f target/models/simple/mlp/1/model.onnx ] || { echo "run scripts/setup.sh first" >&2; exit 1; }
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
mkdir -p benches/results

# One perf_analyzer point over gRPC as a markdown row: | model | concurrency | server | infer/s | p50 µs | p99 µs |
measure() {  # server-name port model concurrency
  rm -f "$WORK/pa.csv"
  "$PEERS/bin/perf_analyzer" -m "$3" -u "localhost:$2" -i grpc --concurrency-range "$4" \
    --measurement-interval $((SECS * 1000)) --stability-percentage 25 -f "$WORK/pa.csv" >/dev/null 2>&1 || true
  .venv/bin/python - "$WORK/pa.csv" "$1" "$3" "$4" <<'PY'
import csv, sys
r = list(csv.DictReader(open(sys.argv[1])))[-1]
print(f"| {sys.argv[3]} | {sys.argv[4]} | {sys.argv[2]} | {float(r['Inferences/Second']):.0f} | {r['p50 latency']} | {r['p99 latency']} |")
PY
}

wait_live() {
  for _ in $(seq 120); do curl -sf "localhost:$1/v2/health/ready" >/dev/null && return 0; sleep 0.5; done
  echo "server on $1 did not become ready" >&2; return 1
}

# The inputs of Triton's add_sub example, for configs.
ADD_SUB_IO='input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]'

# Writes Triton's Python add_sub example (FP32 [4] + [4]; one CPU instance) into repository $1.
write_add_sub() {
  mkdir -p "$1/add_sub/1"
  printf 'name: "add_sub"\nbackend: "python"\n%s\noutput [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]\ninstance_group [ { kind: KIND_CPU } ]\n' \
    "$ADD_SUB_IO" > "$1/add_sub/config.pbtxt"
  cat > "$1/add_sub/1/model.py" <<'PY'
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]))
        return out
PY
}

# The small MLP (FP32 [64] -> [16], max_batch_size 32, no dynamic batching, so latency is measured
# unbatched) as model "mlp" in repository $1.
write_mlp() {
  mkdir -p "$1/mlp/1" && cp target/models/simple/mlp/1/model.onnx "$1/mlp/1/"
  printf 'name: "mlp"\nbackend: "onnxruntime"\nmax_batch_size: 32\n%s\n' \
    'input [ { name: "x" data_type: TYPE_FP32 dims: [ 64 ] } ] output [ { name: "y" data_type: TYPE_FP32 dims: [ 16 ] } ]' \
    > "$1/mlp/config.pbtxt"
}

# A cluster CA in $WORK/certs and one certificate per NAME:ROLE argument (mesh-ops certs issue).
cluster_certs() {
  target/release/mesh-ops certs init "$WORK/certs" >/dev/null
  local spec
  for spec in "$@"; do
    target/release/mesh-ops certs issue "$WORK/certs" "${spec%%:*}" --role "${spec##*:}" >/dev/null
  done
}

# The cluster TLS flags of certificate NAME made by cluster_certs.
tls() { echo --cluster-ca "$WORK/certs/ca.pem" --cluster-cert "$WORK/certs/$1.pem" --cluster-key "$WORK/certs/$1.key"; }
