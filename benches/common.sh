# Shared set-up of the benchmark scripts (sourced): repository root, peers, binary, a work folder
# removed on exit with every server started in the background. Sets SECS, PEERS, BIN, WORK.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-${DEFAULT_SECS:-5}}
PEERS=${PEERS:-.peers}
[ -x "$PEERS/bin/perf_analyzer" ] || bash ../shared/tools/peers.sh "$PEERS" >/dev/null
BIN=target/release/mesh-node
[ -x "$BIN" ] && [ -f target/models/simple/mlp/1/model.onnx ] || { echo "run scripts/setup.sh first" >&2; exit 1; }
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
mkdir -p benches/results
