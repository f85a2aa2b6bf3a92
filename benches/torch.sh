#!/usr/bin/env bash
# TorchScript benchmark (issue 6), in one run: dict_mlp (a 64-256-10 MLP returning a dict of logits
# and probabilities; scripts/torch_models.py) served by mesh-node over gRPC and driven by
# perf_analyzer, against the same model.pt run by torch in-process from as many threads
# (benches/torch_inproc.py), at concurrency 1 and 8. Both sides use one intra-op thread per call.
# Output: markdown on stdout and in benches/results/torch-<host>.md. Needs scripts/setup-torch.sh.
source "$(dirname "$0")/common.sh"
OUT=benches/results/torch-$(hostname).md
.venv/bin/python scripts/torch_models.py --out "$WORK/all" >/dev/null
mkdir -p "$WORK/repo"
cp -r "$WORK/all/dict_mlp" "$WORK/repo/"
# The same model with two instances and dynamic batching, for the concurrent points.
cp -r "$WORK/all/dict_mlp" "$WORK/repo/dict_mlp_batched"
sed -i 's/name: "dict_mlp"/name: "dict_mlp_batched"/' "$WORK/repo/dict_mlp_batched/config.pbtxt"
printf 'instance_group { count: 2 kind: KIND_CPU }\ndynamic_batching { max_queue_delay_microseconds: 100 }\n' \
  >> "$WORK/repo/dict_mlp_batched/config.pbtxt"

"$BIN" --model-repository "$WORK/repo" --http-port 18000 --grpc-port 18001 --metrics-port 18002 \
  > "$WORK/mesh.log" 2>&1 &
wait_live 18000
{
echo "# TorchScript: mesh-node vs torch in-process, $(date -u +%F), $(nproc) vCPU $(lscpu | sed -n 's/Model name: *//p' | head -1)"
echo
echo "| model | concurrency | server | infer/s | p50 µs | p99 µs |"
echo "|---|---|---|---|---|---|"
for c in 1 8; do
  .venv/bin/python benches/torch_inproc.py "$WORK/repo/dict_mlp/1/model.pt" "$c" "$SECS" 1
  measure mesh 18001 dict_mlp "$c"
  measure mesh 18001 dict_mlp_batched "$c"
done
} | tee "$OUT"
