#!/usr/bin/env bash
# Sets up a fresh machine for the mesh: the project venv (ONNX Runtime 1.31.1, tritonclient, onnx),
# the PP-OCR model wheel, the release build of mesh-node, and the example repository's models.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/pip install -q --disable-pip-version-check -r requirements.txt
# The PP-OCRv4 models ship inside this wheel; only its files are used, so it is downloaded, not installed.
if ! ls .venv/dl/rapidocr_onnxruntime-1.4.4-*.whl >/dev/null 2>&1; then
  .venv/bin/pip download -q --disable-pip-version-check --no-deps rapidocr-onnxruntime==1.4.4 -d .venv/dl
fi

cargo build --release -p mesh-node
.venv/bin/python scripts/gen_models.py --out target/models --example configs/example-repo
echo "setup done: target/release/mesh-node, .venv, configs/example-repo"
