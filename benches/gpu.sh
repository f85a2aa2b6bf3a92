#!/usr/bin/env bash
# GPU benchmark (issue 42, item 3), in one run on a GPU machine: one MLP (256 -> 1024 -> 256) served
# by mesh-node on GPU 0 as TorchScript and as ONNX, with and without dynamic batching, against the
# same model.pt run by torch in-process (benches/gpu_inproc.py); and the same MLP in a Python model
# (torch on the GPU, answering through DLPack) on mesh-node and on Triton 2.51. One load generator
# drives every server: `mesh-ops bench` over gRPC, closed loop, batch 1 per request.
# Goals (stated as ratios in the output):
#   - served throughput of the batched model at c=64 >= 0.8x in-process batch-64 throughput;
#   - c=1 without batching: p50 <= in-process batch-1 p50 + the server's own round trip (the p50
#     of Triton's Python add_sub example on the CPU, on the same server).
# scripts/check-gpu.sh runs it with what scripts/pack-gpu.sh packed. Environment: PY (the Python
# with torch and onnx), MESH_NODE_BIN, MESH_OPS_BIN, TRITON_DIR (PyTriton's tritonserver dir; no
# Triton point without it), SECS (seconds a point, default 5), OUT_FILE (the markdown's path).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
NODE=${MESH_NODE_BIN:-target/release/mesh-node}
OPS=${MESH_OPS_BIN:-target/release/mesh-ops}
SECS=${SECS:-5}
OUT_FILE=${OUT_FILE:-benches/results/gpu-$(hostname).md}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
mkdir -p "$(dirname "$OUT_FILE")"

wait_ready() {  # port log
  for _ in $(seq 240); do
    "$PY" -c 'import sys, urllib.request; urllib.request.urlopen(f"http://localhost:{sys.argv[1]}/v2/health/ready", timeout=2)' \
      "$1" 2>/dev/null && return 0
    sleep 0.5
  done
  echo "gpu.sh: the server on $1 did not become ready; its log:" >&2
  tail -40 "$2" >&2
  return 1
}

# One point: a 1 s warm-up, then $SECS s; appends a JSON line {server, model, c, ...} to $WORK/points.
# A point whose model did not load (or whose requests failed) is said on stderr, and the rest go on.
point() {  # server grpc-port model concurrency
  local out
  "$OPS" bench "$3" --protocol grpc --grpc-url "localhost:$2" -c "$4" --duration 1s --no-progress >/dev/null 2>&1 || true
  out=$("$OPS" bench "$3" --protocol grpc --grpc-url "localhost:$2" -c "$4" --duration "${SECS}s" --json \
    --no-progress 2>>"$WORK/bench.err") || echo "gpu.sh: $1 $3 c=$4: mesh-ops bench exited $?" >&2
  [ -n "$out" ] || return 0
  "$PY" -c 'import json, sys; d = json.loads(sys.argv[2]); d["server"] = sys.argv[1]; print(json.dumps(d))' \
    "$1" "$out" >> "$WORK/points"
}

touch "$WORK/points"
"$PY" benches/gpu_models.py "$WORK"
"$PY" benches/gpu_inproc.py "$WORK/mlp.pt" 256 "$SECS" > "$WORK/inproc.json"

"$NODE" --model-repository "$WORK/repo" --gpus 0 --http-port 18100 --grpc-port 18101 --metrics-port 18102 \
  --backend-config "python,interpreter=$PY" --strict-readiness false > "$WORK/mesh.log" 2>&1 &
MESH_PID=$!
wait_ready 18100 "$WORK/mesh.log"
point mesh 18101 add_sub_py 1
for m in mlp_gpu mlp_onnx mlp_py; do point mesh 18101 "$m" 1; done
for m in mlp_gpu_batched mlp_onnx_batched; do point mesh 18101 "$m" 64; done
point mesh 18101 mlp_py 16
grep -iE "error|failed to load" "$WORK/mesh.log" | head -5 >&2 || true
kill "$MESH_PID" && wait "$MESH_PID" 2>/dev/null || true

if [ -n "${TRITON_DIR:-}" ] && [ -x "$TRITON_DIR/bin/tritonserver" ]; then
  # PyTriton's tritonserver takes its Python backend's stub from python_backend_stubs/<version>.
  cp "$TRITON_DIR/python_backend_stubs/3.12/triton_python_backend_stub" "$TRITON_DIR/backends/python/"
  mkdir -p "$WORK/triton-repo"
  cp -r "$WORK/repo/mlp_py" "$WORK/repo/add_sub_py" "$WORK/triton-repo/"
  # Its stub links the Python's libpython3.12 (PyTriton's bundled one is not packed).
  PYLIB=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))')
  PATH="$(dirname "$PY"):$PATH" LD_LIBRARY_PATH="$PYLIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$TRITON_DIR/bin/tritonserver" --model-repository "$WORK/triton-repo" \
    --backend-directory "$TRITON_DIR/backends" --cache-directory "$TRITON_DIR/caches" \
    --http-port 18200 --grpc-port 18201 --metrics-port 18202 > "$WORK/triton.log" 2>&1 &
  TRITON_PID=$!
  if wait_ready 18200 "$WORK/triton.log"; then
    point triton 18201 add_sub_py 1
    point triton 18201 mlp_py 1
    point triton 18201 mlp_py 16
  fi
  kill "$TRITON_PID" && wait "$TRITON_PID" 2>/dev/null || true
fi

"$PY" - "$WORK/points" "$WORK/inproc.json" "$SECS" <<'PY' | tee "$OUT_FILE"
import json, sys
points = [json.loads(l) for l in open(sys.argv[1])]
inproc = json.load(open(sys.argv[2]))
get = lambda s, m, c: next((p for p in points if (p["server"], p["model"], p["concurrency"]) == (s, m, c)), None)
def row(p):
    lat = p["latency_us"]
    return (f"| {p['server']} | {p['model']} | {p['concurrency']} | {p['throughput_infer_per_s']:.0f} | "
            f"{lat.get('p50')} | {lat.get('p99')} | {p['failed']} |")
print(f"# GPU: {inproc['device']}, {sys.argv[3]} s a point, mesh-ops bench over gRPC, batch 1 a request")
print()
print(f"torch in-process (copy in, forward, copy out): batch 1 p50 {inproc['batch1_p50_us']} µs, "
      f"p99 {inproc['batch1_p99_us']} µs; batch 64 {inproc['batch64_rows_per_s']} rows/s (p50 {inproc['batch64_p50_us']} µs)")
print()
print("| server | model | concurrency | infer/s | p50 µs | p99 µs | failed |")
print("|---|---|---|---|---|---|---|")
for p in points:
    print(row(p))
print()
rt = get("mesh", "add_sub_py", 1)
for model, kind in (("mlp_gpu", "TorchScript"), ("mlp_onnx", "ONNX")):
    one, many = get("mesh", model, 1), get("mesh", model + "_batched", 64)
    if one and rt:
        bound = inproc["batch1_p50_us"] + rt["latency_us"]["p50"]
        print(f"- {kind} c=1: p50 {one['latency_us']['p50']} µs against in-process + round trip = {bound:.0f} µs "
              f"(ratio {one['latency_us']['p50'] / bound:.2f}; goal <= 1)")
    if many:
        ratio = many["throughput_infer_per_s"] / inproc["batch64_rows_per_s"]
        print(f"- {kind} batched c=64: {many['throughput_infer_per_s']:.0f} infer/s = {ratio:.2f}x in-process batch-64 "
              f"throughput (goal >= 0.8)")
for c in (1, 16):
    m, t = get("mesh", "mlp_py", c), get("triton", "mlp_py", c)
    if m and t:
        print(f"- Python MLP on the GPU, c={c}: mesh {m['throughput_infer_per_s']:.0f} infer/s p50 {m['latency_us']['p50']} µs, "
              f"Triton 2.51 {t['throughput_infer_per_s']:.0f} infer/s p50 {t['latency_us']['p50']} µs "
              f"(throughput ratio {m['throughput_infer_per_s'] / t['throughput_infer_per_s']:.2f})")
PY
