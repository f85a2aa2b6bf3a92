#!/usr/bin/env bash
# Sets everything up, then serves the bundled example repository (the PP-OCRv4 OCR pipeline: ensemble
# `ocr` and BLS `ocr_bls`, their steps, and an MLP) on HTTP :8000, gRPC :8001 and metrics :8002.
# The Python models run on the project venv's interpreter. Extra arguments go to mesh-node.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec target/release/mesh-node --model-repository configs/example-repo \
  --backend-config "python,interpreter=$PWD/.venv/bin/python" "$@"
