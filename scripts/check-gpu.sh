#!/usr/bin/env bash
# The GPU check, in one command on a GPU machine: unpacks what scripts/pack-gpu.sh packed (the parts
# target/gpu-pack/part-*, carried there beforehand), runs the GPU suite (tests/gpu) and then
# benches/gpu.sh, with the machine's own Python (torch, numpy, onnx, pytest; ../shared/DESIGN.md §9).
# Results go to $OUT (the device tool's folder) or target/gpu-out: gpu-suite.txt, gpu-suite.xml and
# gpu-bench.md. Exit status: the suite's (the benchmark's figures are read, not judged).
#   MESH_GPU_PYTHON   the Python to use (default: /opt/torch/.venv/bin/python3, else python3)
#   SECS              seconds per benchmark point (default 5)
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
RUN=target/gpu-run
RESULTS=${OUT:-target/gpu-out}
mkdir -p "$RESULTS"
PY=${MESH_GPU_PYTHON:-/opt/torch/.venv/bin/python3}
[ -x "$PY" ] || PY=$(command -v python3)
say() { echo "check-gpu: $* ($(( $(date +%s) - START )) s)" >&2; }

if ls target/gpu-pack/part-* >/dev/null 2>&1; then
  say "unpacking $(ls target/gpu-pack/part-* | wc -l) parts"
  rm -rf "$RUN" && mkdir -p "$RUN"
  unxz() { if command -v xz >/dev/null; then xz -dc -T0; else "$PY" -c 'import lzma, shutil, sys
shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer, 1 << 20)'; fi; }
  cat target/gpu-pack/part-* | unxz | tar xf - -C "$RUN" || { say "the parts do not unpack (one missing?)"; exit 2; }
fi
[ -x "$RUN/bin/mesh-node" ] || { say "no $RUN/bin/mesh-node: carry the parts scripts/pack-gpu.sh made"; exit 2; }
RUN=$(realpath "$RUN")

# ONNX Runtime's CUDA provider finds cuDNN, cuBLAS and the CUDA runtime beside it (site/nvidia, as in
# a venv): those of the machine's torch wheels. mesh-node's TorchScript links the machine's libtorch.
SITE=$("$PY" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
ln -sfn "$SITE/nvidia" "$RUN/site/nvidia"
export LD_LIBRARY_PATH="$SITE/torch/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export ORT_DYLIB_PATH="$RUN/site/onnxruntime/capi/libonnxruntime.so.1.31.1"
export MESH_NODE_BIN="$RUN/bin/mesh-node" MESH_ROUTER_BIN="$RUN/bin/mesh-router" MESH_OPS_BIN="$RUN/bin/mesh-ops"
export PYTHONPATH="$RUN/py${PYTHONPATH:+:$PYTHONPATH}"
export MESH_REQUIRE_SERVER=1 MESH_REQUIRE_GPU=1 PY  # a suite that finds no GPU here fails
nvidia-smi -L >&2 || true
# What the suite imports, and from where (a clash with the machine's own packages shows here first).
"$PY" -c 'import numpy, onnx, torch, tritonclient.grpc, tritonclient.http
print("check-gpu: numpy", numpy.__version__, "onnx", onnx.__version__, "torch", torch.__version__,
      "cuda", torch.cuda.is_available(), "tritonclient from", tritonclient.grpc.__file__)' >&2 \
  || say "the Python packages do not import together (see above)"
say "the GPU suite"
"$PY" -m pytest -q -rfEs -p no:cacheprovider tests/gpu --junitxml="$RESULTS/gpu-suite.xml" 2>&1 \
  | tee "$RESULTS/gpu-suite.txt"
status=${PIPESTATUS[0]}
say "the suite finished with status $status; the benchmark"
TRITON_DIR=""
[ -x "$RUN/triton/pytriton/tritonserver/bin/tritonserver" ] && TRITON_DIR="$RUN/triton/pytriton/tritonserver"
TRITON_DIR="$TRITON_DIR" OUT_FILE="$RESULTS/gpu-bench.md" bash benches/gpu.sh 2>"$RESULTS/gpu-bench.err" \
  || say "benches/gpu.sh failed (its stderr: $RESULTS/gpu-bench.err)"
cp tests/.work/logs/*.log "$RESULTS/" 2>/dev/null || true
say "done"
exit "$status"
