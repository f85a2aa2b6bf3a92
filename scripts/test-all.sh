#!/usr/bin/env bash
# Sets everything up (PyTorch, TensorFlow in .venv-tf and PyTriton in .venv-pytriton, too), then runs
# every test suite and reports every failure: the layering (scripts/check_layers.py: modules import
# only downward, in every crate and in the Python code), the book (scripts/docs.sh), the Rust unit tests with the `torch` feature and the Rust tests that drive
# the real router and node binaries with a fake peer (every crate, even after one fails), the debug
# build of mesh-node with the test-only fault-injection feature (for the supervision tests), then the
# tritonclient integration suite against the real mesh-node (built with TorchScript support),
# mesh-router and mesh-ops binaries, cluster tests included. A set-up that fails stops it (nothing
# could be tested); a failing suite does not: the next one runs, a summary names each failed suite,
# and the exit status is non-zero if any failed. Arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."

started=$(date +%s)
results=()
failed=()

# suite NAME COMMAND...: runs one suite, records its time and whether it passed.
suite() {
  local name=$1 t0 rc
  shift
  t0=$(date +%s)
  echo "test-all: $name ..."
  "$@"
  rc=$?
  results+=("$(printf '%-14s %-6s %5d s' "$name" "$([ $rc = 0 ] && echo passed || echo FAILED)" $(( $(date +%s) - t0 )))")
  [ $rc = 0 ] || failed+=("$name (exit $rc)")
}

summary() {
  echo "test-all: suites, after $(( $(date +%s) - started )) s:"
  printf '  %s\n' "${results[@]}"
}

# Set-up: without it no suite can run, so its failure ends the command at once.
for step in "scripts/setup.sh --torch" scripts/setup-tensorflow.sh scripts/setup-pytriton.sh; do
  # shellcheck disable=SC2086
  if ! $step; then
    echo "test-all: set-up failed ($step); no suite was run" >&2
    exit 1
  fi
done

suite layers python3 scripts/check_layers.py
# The book: mdBook (installed from crates.io the first time), its links and mdBook's warnings.
suite docs scripts/docs.sh
suite cargo-test bash -c 'source scripts/torch-env.sh && MESH_REQUIRE_SERVER=1 exec cargo test --workspace --features mesh-node/torch --no-fail-fast'
suite fault-build cargo build -p mesh-node --features fault-injection
# pytest's own summary of failures is kept for the end (its output can be long).
pytest_log=$(mktemp)
trap 'rm -f "$pytest_log"' EXIT
pytest_suite() {
  env MESH_REQUIRE_SERVER=1 MESH_REQUIRE_TORCH=1 MESH_REQUIRE_TF=1 MESH_REQUIRE_PYTRITON=1 \
    MESH_FAULT_BIN=target/debug/mesh-node .venv/bin/python -m pytest -q -rfE tests "$@" 2>&1 | tee "$pytest_log"
}
suite pytest pytest_suite "$@"

summary
grep -E '^(FAILED|ERROR) ' "$pytest_log" | sed 's/^/  /' || true
if [ ${#failed[@]} -gt 0 ]; then
  echo "test-all: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "test-all: every suite passed"
