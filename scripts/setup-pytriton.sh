#!/usr/bin/env bash
# A venv with PyTriton (nvidia-pytriton 0.7.0 from PyPI) for the PyTriton tests, and the mesh's
# `mesh_pytriton` module (python/) installed in it: `python -m mesh_pytriton script.py` runs a
# PyTriton script on mesh-node. Kept apart from .venv because PyTriton pins numpy below 2.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv-pytriton/bin/python ]; then
  "$PY" -m venv .venv-pytriton
fi
.venv-pytriton/bin/pip install -q --disable-pip-version-check "nvidia-pytriton==0.7.0" ./python
.venv-pytriton/bin/python -c 'import pytriton, mesh_pytriton; print("setup-pytriton: PyTriton", __import__("importlib.metadata").metadata.version("nvidia-pytriton"), "in .venv-pytriton")'
