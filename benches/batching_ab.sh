#!/usr/bin/env bash
# Two mesh-node builds side by side on dynamic batching: perf_analyzer over gRPC on the README's MLP
# (configs/example-repo's `mlp`: dynamic batching, 100 µs delay) and the same model without
# dynamic batching, at concurrency 16 (throughput) and 1 (the delay's cost), with the average batch
# each formed; A and B alternating over ROUNDS rounds.
# Usage: benches/batching_ab.sh NODE_A NODE_B [SECONDS_PER_POINT] [ROUNDS]   (build A from a
# worktree of the old commit, with its own target directory; ~4 minutes with the defaults)
A=${1:?usage: benches/batching_ab.sh NODE_A NODE_B [SECONDS_PER_POINT] [ROUNDS]}
B=${2:?usage: benches/batching_ab.sh NODE_A NODE_B [SECONDS_PER_POINT] [ROUNDS]}
A=$(realpath "$A"); B=$(realpath "$B")
ROUNDS=${4:-2}
DEFAULT_SECS=4
set -- "${3:-4}"
source "$(dirname "$0")/common.sh"
.venv/bin/python scripts/gen_models.py --out "$WORK/models" >/dev/null
mkdir -p "$WORK/repo"
cp -r "$WORK/models/simple/mlp" "$WORK/repo/mlp"
cp -r "$WORK/models/simple/mlp" "$WORK/repo/mlp_plain"
sed -i 's/^name: "mlp"/name: "mlp_plain"/; /^dynamic_batching/,/^}/d' "$WORK/repo/mlp_plain/config.pbtxt"

point() {  # binary label model concurrency: one markdown row
  "$1" --model-repository "$WORK/repo" --http-port 28600 --grpc-port 28601 --metrics-port 28602 \
    >"$WORK/node.log" 2>&1 &
  local pid=$! row batch
  wait_live 28600
  rm -f "$WORK/pa.csv"
  "$PEERS/bin/perf_analyzer" -m "$3" -u localhost:28601 -i grpc --concurrency-range "$4" \
    --measurement-interval $((SECS * 1000)) --stability-percentage 50 -f "$WORK/pa.csv" >/dev/null 2>&1 || true
  row=$(.venv/bin/python -c "import csv;r=list(csv.DictReader(open('$WORK/pa.csv')))[-1];print(round(float(r['Inferences/Second'])), '|', r['p50 latency'], '|', r['p99 latency'])" 2>/dev/null || echo "- | - | -")
  batch=$(curl -s "localhost:28600/v2/models/$3/stats" | .venv/bin/python -c "import json,sys;s=json.load(sys.stdin)['model_stats'][0];print(f\"{int(s['inference_count'])/max(1,int(s['execution_count'])):.1f}\")")
  echo "| $2 | $3 | $4 | $row | $batch |"
  kill "$pid"; wait "$pid" 2>/dev/null
}

echo "# benches/batching_ab.sh, $(date -u +%F), $(nproc) vCPU, $SECS s a point: A=$A B=$B"
echo
echo "| build | model | concurrency | infer/s | p50 µs | p99 µs | average batch |"
echo "|---|---|---|---|---|---|---|"
for round in $(seq "$ROUNDS"); do
  for point in "mlp 16" "mlp_plain 16" "mlp 1"; do
    set -- $point
    point "$A" A "$1" "$2"
    point "$B" B "$1" "$2"
  done
done
