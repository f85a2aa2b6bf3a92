#!/usr/bin/env bash
# Sets up the `torch` feature: installs PyTorch 2.13 (PyPI's wheel set, about 3 GB) into the project
# venv and builds target/release/mesh-node with TorchScript support, linked to that libtorch.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || scripts/setup.sh
.venv/bin/pip install -q --disable-pip-version-check -r requirements-torch.txt
source scripts/torch-env.sh
cargo build --release -p mesh-node --features torch
echo "torch setup done: target/release/mesh-node serves pytorch_libtorch models (LIBTORCH=$LIBTORCH)"
