#!/usr/bin/env bash
# Two mesh-node builds side by side on gRPC streams: perf_analyzer --streaming on the small MLP
# (dynamic batching) and the ONNX add_sub, concurrency 1 and 8, A and B alternating over two rounds.
# Usage: benches/stream_ab.sh NODE_A NODE_B [SECONDS_PER_POINT]   (build A from a worktree of the
# old commit, with its own target directory; ~3 minutes)
A=${1:?usage: benches/stream_ab.sh NODE_A NODE_B [SECONDS_PER_POINT]}
B=${2:?usage: benches/stream_ab.sh NODE_A NODE_B [SECONDS_PER_POINT]}
A=$(realpath "$A"); B=$(realpath "$B")
DEFAULT_SECS=4
set -- "${3:-4}"
source "$(dirname "$0")/common.sh"
.venv/bin/python scripts/gen_models.py --out "$WORK/models" >/dev/null

point() {  # binary label model concurrency: one markdown row
  "$1" --model-repository "$WORK/models/simple" --http-port 28500 --grpc-port 28501 --metrics-port 28502 \
    >"$WORK/node.log" 2>&1 &
  local pid=$! out
  wait_live 28500
  out=$("$PEERS/bin/perf_analyzer" -m "$3" -u localhost:28501 -i grpc --streaming --concurrency-range "$4" \
    --measurement-interval $((SECS * 1000)) --stability-percentage 50 2>&1 \
    | sed -n "s/.*Concurrency: $4, throughput: //p")
  echo "| $2 | $3 | $4 | $out |"
  kill "$pid"; wait "$pid" 2>/dev/null
}

echo "| build | model | concurrency | perf_analyzer --streaming |"
echo "|---|---|---|---|"
for round in 1 2; do
  for model in mlp add_sub; do
    for c in 1 8; do
      point "$A" A "$model" "$c"
      point "$B" B "$model" "$c"
    done
  done
done
