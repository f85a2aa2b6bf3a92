#!/usr/bin/env bash
# Sets everything up, then runs every test: Rust unit tests (default build and the `torch`
# feature) and the tritonclient integration suite against the real mesh-node binary, built with
# TorchScript support so the TorchScript tests run too.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# PyTorch 2.13 into .venv, and target/release/mesh-node rebuilt with `--features torch`.
scripts/setup-torch.sh
cargo test --workspace
(source scripts/torch-env.sh && cargo test -p mesh-node --features torch --lib backend::torch)
# A debug build with the test-only fault-injection feature, for the supervision tests.
cargo build -p mesh-node --features fault-injection
MESH_REQUIRE_SERVER=1 MESH_REQUIRE_TORCH=1 MESH_FAULT_BIN=target/debug/mesh-node \
  .venv/bin/python -m pytest -q tests "$@"
