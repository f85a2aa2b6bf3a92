#!/usr/bin/env bash
# Sets everything up, then runs every test: Rust unit tests and the tritonclient integration suite
# against the real mesh-node binary.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo test --workspace
# A debug build with the test-only fault-injection feature, for the supervision tests.
cargo build -p mesh-node --features fault-injection
MESH_REQUIRE_SERVER=1 MESH_FAULT_BIN=target/debug/mesh-node .venv/bin/python -m pytest -q tests "$@"
