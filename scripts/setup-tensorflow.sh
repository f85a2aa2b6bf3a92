#!/usr/bin/env bash
# A second venv with TensorFlow (CPU) from PyPI: the interpreter TensorFlow models
# (`platform: "tensorflow_savedmodel"` / `"tensorflow_graphdef"`) run in, through the Python
# backend's stub. Kept apart from .venv so TensorFlow's pins never fight onnx's or PyTorch's.
# Serve TensorFlow models with `--backend-config python,interpreter=.venv-tf/bin/python`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv-tf/bin/python ]; then
  "$PY" -m venv .venv-tf
fi
.venv-tf/bin/pip install -q --disable-pip-version-check "tensorflow-cpu==2.21.0" "numpy<2.4"
.venv-tf/bin/python -c 'import tensorflow as tf; print("setup-tensorflow: TensorFlow", tf.__version__, "in .venv-tf")'
