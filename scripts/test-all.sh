#!/usr/bin/env bash
# Sets everything up (PyTorch, TensorFlow in .venv-tf and PyTriton in .venv-pytriton, too), then runs every test: the Rust unit tests (with the `torch`
# feature) and the Rust tests that drive the real router and node binaries with a fake peer, then
# the tritonclient integration suite against the real mesh-node (built with TorchScript support),
# mesh-router and mesh-ops binaries, cluster tests included; the supervision tests and the
# build-without-torch check use a debug build with the test-only fault-injection feature instead.
# First, the router's layering: its modules import only downward (scripts/check_layers.py).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 scripts/check_layers.py
scripts/setup.sh --torch
scripts/setup-tensorflow.sh
scripts/setup-pytriton.sh
(source scripts/torch-env.sh && MESH_REQUIRE_SERVER=1 cargo test --workspace --features mesh-node/torch)
cargo build -p mesh-node --features fault-injection
MESH_REQUIRE_SERVER=1 MESH_REQUIRE_TORCH=1 MESH_REQUIRE_TF=1 MESH_REQUIRE_PYTRITON=1 MESH_FAULT_BIN=target/debug/mesh-node \
  .venv/bin/python -m pytest -q tests "$@"
