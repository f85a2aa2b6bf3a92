#!/usr/bin/env bash
# Sets everything up, then runs every test: Rust unit tests and the tritonclient integration suite
# against the real mesh-node binary.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo test --workspace
MESH_REQUIRE_SERVER=1 .venv/bin/python -m pytest -q tests "$@"
