#!/usr/bin/env bash
# Dynamic batching benchmark (issue 3), in one run: perf_analyzer at concurrency 16 against the same MLP
# served without and with dynamic batching, and raw in-process ONNX Runtime at the batch size the server
# actually formed (read from the statistics extension). Three models: the tiny MLP of scripts/gen_models.py
# (64→128→16), the small MLP of issue 26 (256→1024→256) and a wider one (64→1024→1024→16).
# Output: markdown on stdout and in benches/results/batching-<host>.md. Needs scripts/setup.sh; ~2 minutes.
# MESH_BENCH_PARAMS adds config lines to the served models, e.g. an intra_op_thread_count parameter.
source "$(dirname "$0")/common.sh"
mkdir -p "$WORK/repo"
OUT=benches/results/batching-$(hostname).md
cargo build -q --release -p mesh-node --benches

.venv/bin/python - "$WORK" <<'PY'
import sys, numpy as np, onnx
from onnx import helper, numpy_helper, TensorProto
work = sys.argv[1]
rng = np.random.default_rng(7)
def layer(n_in, n_out, i):
    return [numpy_helper.from_array((rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32), f"w{i}"),
            numpy_helper.from_array(np.zeros(n_out, np.float32), f"b{i}")]
def mlp(name, dims):
    inits, nodes, prev = [], [], "x"
    for i in range(len(dims) - 1):
        inits += layer(dims[i], dims[i + 1], i)
        last = i == len(dims) - 2
        out = "y" if last else f"h{i}"
        nodes.append(helper.make_node("Gemm", [prev, f"w{i}", f"b{i}"], [out if last else f"g{i}"]))
        if not last:
            nodes.append(helper.make_node("Relu", [f"g{i}"], [out]))
        prev = out
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", dims[0]])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", dims[-1]])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, f"{work}/{name}.onnx")
mlp("mlp_wide", [64, 1024, 1024, 16])
mlp("mlp_mid", [256, 1024, 256])
PY

MODELS=${MESH_BENCH_MODELS:-mlp mlp_mid mlp_wide}
for model in $MODELS; do
  src=target/models/simple/mlp/1/model.onnx; [ $model != mlp ] && src=$WORK/$model.onnx
  IO='input [ { name: "x" data_type: TYPE_FP32 dims: [ 64 ] } ] output [ { name: "y" data_type: TYPE_FP32 dims: [ 16 ] } ]'
  [ $model = mlp_mid ] && IO='input [ { name: "x" data_type: TYPE_FP32 dims: [ 256 ] } ] output [ { name: "y" data_type: TYPE_FP32 dims: [ 256 ] } ]'
  for variant in plain batched; do
    d=$WORK/repo/${model}_$variant; mkdir -p "$d/1"; cp "$src" "$d/1/model.onnx"
    extra=""; [ $variant = batched ] && extra='dynamic_batching { max_queue_delay_microseconds: 500 }'
    printf 'name: "%s_%s"\nbackend: "onnxruntime"\nmax_batch_size: 32\n%s\n%s\n%s\n' "$model" "$variant" "$IO" "$extra" "${MESH_BENCH_PARAMS:-}" > "$d/config.pbtxt"
  done
  mkdir -p "$WORK/raw_$model/1"; cp "$src" "$WORK/raw_$model/1/model.onnx"
  printf 'name: "raw_%s"\nmax_batch_size: 32\n%s\n' "$model" "$IO" > "$WORK/raw_$model/config.pbtxt"
done
"$BIN" --model-repository "$WORK/repo" --http-port 28300 --grpc-port 28301 --metrics-port 28302 >"$WORK/node.log" 2>&1 &
for _ in $(seq 60); do curl -sf localhost:28300/v2/health/ready >/dev/null && break; sleep 0.5; done

{
echo "# Dynamic batching, concurrency 16, gRPC, $(date -u +%F), $(nproc) vCPU $(lscpu | sed -n 's/Model name: *//p' | head -1)"
echo
echo "| model | served | infer/s | p50 µs | avg batch | raw ORT rows/s at that batch | server / raw |"
echo "|---|---|---|---|---|---|---|"
for model in $MODELS; do
  for variant in plain batched; do
    name=${model}_$variant
    "$PEERS/bin/perf_analyzer" -m "$name" -u localhost:28301 -i grpc --concurrency-range 16 \
      --measurement-interval $((SECS * 1000)) --stability-percentage 25 -f "$WORK/pa.csv" >/dev/null 2>&1 || true
    read -r ips p50 < <(python3 -c "import csv;r=list(csv.DictReader(open('$WORK/pa.csv')))[-1];print(round(float(r['Inferences/Second'])), r['p50 latency'])")
    batch=$(curl -s "localhost:28300/v2/models/$name/stats" | python3 -c "import json,sys;s=json.load(sys.stdin)['model_stats'][0];print(max(1,round(s['inference_count']/max(1,s['execution_count']))))")
    raw=$(cargo bench -q -p mesh-node --bench raw_ort -- "$WORK/raw_$model" 3000 "$batch" 2>/dev/null | awk -F'|' '/raw ort/{gsub(/ /,"",$7);print $7}')
    echo "| $model | $variant | $ips | $p50 | $batch | $raw | $(python3 -c "print(f'{$ips/$raw:.2f}')") |"
  done
done
} | tee "$OUT"
