#!/usr/bin/env bash
# Packs, on this machine, everything scripts/check-gpu.sh needs on a GPU machine that has no network
# and takes at most 64 MiB per call (../shared/DESIGN.md §9): the mesh's binaries (mesh-node built
# with TorchScript against PyPI's torch 2.11, the image's version), ONNX Runtime 1.31.1's GPU build
# with its CUDA provider, tritonclient and its wheels for Python 3.12, and Triton 2.51 (PyTriton's
# tritonserver with its Python backend) for benches/gpu.sh's comparison. One xz stream cut into
# parts of $PART_MIB MiB: target/gpu-pack/part-00, part-01, ... Carry one part per `run` call (the
# machine keeps them while it stays warm), then run scripts/check-gpu.sh in the last call.
#   scripts/pack-gpu.sh [--no-torch]   (--no-torch: the plain mesh-node; TorchScript tests then skip)
# Downloads about 800 MB once (kept in target/gpu-pack/work) and builds mesh-node a second time.
set -euo pipefail
cd "$(dirname "$0")/.."
PACK=target/gpu-pack
WORK=$PACK/work
STAGE=$PACK/stage
PART_MIB=${PART_MIB:-58}
TORCH=1
[ "${1:-}" = "--no-torch" ] && TORCH=0
ORT_VERSION=1.31.1
PY=.venv/bin/python
[ -x "$PY" ] || { echo "pack-gpu: run scripts/setup.sh first (it makes .venv)" >&2; exit 1; }
mkdir -p "$WORK/wheels"
rm -rf "$STAGE" "$PACK"/part-*
mkdir -p "$STAGE/bin" "$STAGE/site/onnxruntime/capi" "$STAGE/py"
step() { echo "pack-gpu: $*" >&2; }
cp312() {  # pip download of cp312 manylinux wheels into $WORK/wheels
  "$PY" -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$WORK/wheels" "$@"
}

step "wheels for Python 3.12 (onnxruntime-gpu $ORT_VERSION, tritonclient and what it needs)"
cp312 --no-deps "onnxruntime-gpu==$ORT_VERSION"
TRITONCLIENT=$("$PY" -c 'import importlib.metadata as m; print(m.version("tritonclient"))')
cp312 "tritonclient[http,grpc]==$TRITONCLIENT"

step "ONNX Runtime's GPU build and its CUDA provider"
"$PY" - "$WORK/wheels" "$STAGE/site/onnxruntime/capi" "$ORT_VERSION" <<'PY'
import glob, os, sys, zipfile
wheels, dest, version = sys.argv[1:]
wheel = glob.glob(os.path.join(wheels, f"onnxruntime_gpu-{version}-cp312-*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        base = os.path.basename(name)
        if name.startswith("onnxruntime/capi/lib") and ".so" in base:
            with z.open(name) as src, open(os.path.join(dest, base), "wb") as out:
                while chunk := src.read(1 << 24):
                    out.write(chunk)
PY

step "tritonclient and its wheels, unpacked onto a PYTHONPATH"
"$PY" - "$WORK/wheels" "$STAGE/py" <<'PY'
import glob, os, sys, zipfile
wheels, dest = sys.argv[1:]
for wheel in sorted(glob.glob(os.path.join(wheels, "*.whl"))):
    name = os.path.basename(wheel).lower()
    # numpy and ml_dtypes (onnx's) are the image's own: a second copy on PYTHONPATH would shadow them
    if name.startswith(("onnxruntime", "numpy-", "torch-", "ml_dtypes-")):
        continue
    with zipfile.ZipFile(wheel) as z:
        # perf_analyzer's binaries are not needed there (mesh-ops bench drives both servers)
        z.extractall(dest, [n for n in z.namelist() if "/bin/" not in n])
PY

NODE=target/release/mesh-node
if [ "$TORCH" = 1 ]; then
  step "mesh-node with TorchScript, built against PyPI's torch 2.11.0 (the GPU image's torch)"
  cp312 --no-deps torch==2.11.0
  LIBTORCH_211=$WORK/torch211/torch
  if [ ! -f "$LIBTORCH_211/lib/libtorch_cuda.so" ]; then
    rm -rf "$WORK/torch211"
    "$PY" - "$WORK/wheels" "$WORK/torch211" <<'PY'
import glob, os, sys, zipfile
wheels, dest = sys.argv[1:]
wheel = glob.glob(os.path.join(wheels, "torch-2.11.0-cp312-*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    z.extractall(dest, [n for n in z.namelist() if n.startswith(("torch/lib/", "torch/include/", "torch/share/"))])
PY
  fi
  # tch 0.26's torch-sys names ops torch 2.11 lacks: a copy whose wrappers of those ops throw.
  SYS_SRC=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/torch-sys-0.26.0 | head -n1)
  rm -rf "$WORK/torch-sys" && cp -r "$SYS_SRC" "$WORK/torch-sys"
  "$PY" scripts/torch_sys_patch.py "$WORK/torch-sys/libtch/torch_api_generated.cpp" "$LIBTORCH_211/include"
  # The patch changes Cargo.lock's entry for torch-sys; the repository's lock is put back after
  # (commit nothing meanwhile). One left patched by an interrupted run is not kept as the original.
  if "$PY" -c 'import re, sys; t = open("Cargo.lock").read()
sys.exit(0 if re.search(r"name = \"torch-sys\"\nversion = \"[^\"]+\"\nsource = ", t) else 1)'; then
    cp Cargo.lock "$WORK/Cargo.lock.kept"
  else
    echo "pack-gpu: Cargo.lock holds a patched torch-sys (an interrupted run?): git checkout Cargo.lock" >&2
    exit 1
  fi
  trap 'cp "$WORK/Cargo.lock.kept" Cargo.lock' EXIT
  LIBTORCH=$(realpath "$LIBTORCH_211") LIBTORCH_BYPASS_VERSION_CHECK=1 CARGO_TARGET_DIR=target/gpu \
    cargo build --release -p mesh-node --features mesh-node/torch \
    --config "patch.crates-io.torch-sys.path=\"$(realpath "$WORK/torch-sys")\""
  cp "$WORK/Cargo.lock.kept" Cargo.lock
  NODE=target/gpu/release/mesh-node
fi
step "the mesh's binaries (stripped)"
cargo build --release -p mesh-router -p mesh-ops
[ "$TORCH" = 1 ] || cargo build --release -p mesh-node
for b in "$NODE" target/release/mesh-router target/release/mesh-ops; do
  strip -o "$STAGE/bin/$(basename "$b")" "$b"
done

step "Triton 2.51 (PyTriton's tritonserver, Python backend, the Python 3.12 stub)"
SITE=$(ls -d .venv-pytriton/lib/python3*/site-packages 2>/dev/null | head -n1 || true)
if [ -n "$SITE" ] && [ -x "$SITE/pytriton/tritonserver/bin/tritonserver" ]; then
  # As in site-packages, so the binaries' RPATHs ($ORIGIN/../../../nvidia_pytriton.libs) hold.
  mkdir -p "$STAGE/triton/pytriton/tritonserver" "$STAGE/triton/nvidia_pytriton.libs"
  (cd "$SITE/pytriton/tritonserver" && tar cf - bin backends caches python_backend_stubs/3.12) \
    | tar xf - -C "$STAGE/triton/pytriton/tritonserver"
  find "$SITE/nvidia_pytriton.libs" -maxdepth 1 -type f ! -name 'libpython3*' \
    -exec cp {} "$STAGE/triton/nvidia_pytriton.libs/" \;
else
  step "no .venv-pytriton (scripts/setup-pytriton.sh makes it): benches/gpu.sh will run without Triton"
fi

step "one xz stream, cut into parts of $PART_MIB MiB"
tar cf - -C "$STAGE" . | xz -T0 -6 | split -b "${PART_MIB}M" -d -a 2 - "$PACK/part-"
rm -rf "$STAGE"
ls -l "$PACK"/part-* >&2
echo "pack-gpu: carry each of $(ls "$PACK"/part-* | tr '\n' ' ')one per run call, then run scripts/check-gpu.sh" >&2
