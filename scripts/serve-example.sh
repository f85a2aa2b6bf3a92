#!/usr/bin/env bash
# Sets everything up, then serves the bundled example repository (PP-OCRv4 detection + an MLP)
# on HTTP :8000, gRPC :8001 and metrics :8002. Extra arguments go to mesh-node.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec target/release/mesh-node --model-repository configs/example-repo "$@"
