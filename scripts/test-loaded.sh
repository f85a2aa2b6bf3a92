#!/usr/bin/env bash
# Runs the README's test command (scripts/test-all.sh) RUNS times in a row (default 5) while a busy
# loop holds one CPU (the first, with taskset), the way a busy machine or a noisy neighbour would:
# a test whose outcome depends on scheduling fails here. Prints each run's result and time, keeps
# each run's output in $MESH_LOADED_LOGS (default target/test-loaded/), and exits non-zero if any
# run failed. Arguments after RUNS go to every test-all.sh run (and so to pytest).
#
#   scripts/test-loaded.sh [RUNS] [PYTEST_ARGS...]
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
shift || true
logs=${MESH_LOADED_LOGS:-target/test-loaded}
mkdir -p "$logs"

# The hog: a shell busy loop pinned to CPU 0, its own process group, stopped on any exit.
taskset -c 0 bash -c 'while :; do :; done' &
hog=$!
trap 'kill "$hog" 2>/dev/null' EXIT
trap 'exit 130' INT TERM
echo "test-loaded: a busy loop (pid $hog) holds CPU 0; $runs runs of scripts/test-all.sh; logs in $logs/"

failed=0
results=()
for n in $(seq "$runs"); do
  t0=$(date +%s)
  scripts/test-all.sh "$@" >"$logs/run-$n.log" 2>&1
  rc=$?
  took=$(( $(date +%s) - t0 ))
  summary=$(grep -E '^(test-all: (FAILED|every suite passed)|[0-9]+ (passed|failed))|^=+ .*(passed|failed)' "$logs/run-$n.log" | tail -n 2 | tr '\n' ' ')
  if [ $rc = 0 ]; then
    results+=("run $n: passed in $took s; $summary")
  else
    failed=$((failed + 1))
    results+=("run $n: FAILED (exit $rc) in $took s; $summary")
  fi
  echo "test-loaded: ${results[-1]}"
done
echo "test-loaded: $((runs - failed)) of $runs runs passed with CPU 0 busy"
printf '  %s\n' "${results[@]}"
[ $failed = 0 ]
