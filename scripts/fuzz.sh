#!/usr/bin/env bash
# Coverage-guided fuzzing of the mesh's parsers of untrusted bytes (fuzz/, libFuzzer through
# libfuzzer-sys) on the stable toolchain: builds the targets with the coverage instrumentation
# passed in RUSTFLAGS (no nightly, no cargo-fuzz, no sanitizers), runs one or all of them on one
# core, and prints the executions, coverage and crashes of each.
#
#   scripts/fuzz.sh list                          the targets and what each covers
#   scripts/fuzz.sh build                         builds every target (fuzz/target/)
#   scripts/fuzz.sh run TARGET [--runs N | --time S] [-- LIBFUZZER_ARGS...]
#                                                 fuzzes TARGET; corpus in fuzz/corpus/TARGET
#                                                 (seeded from fuzz/seeds/TARGET), log in
#                                                 fuzz/logs/TARGET.log, crashes in fuzz/artifacts/TARGET/
#   scripts/fuzz.sh smoke [RUNS]                  checks the frame seeds are current, builds,
#                                                 then runs every target RUNS times (default
#                                                 200000) from its seeds alone: for CI
#   scripts/fuzz.sh replay TARGET FILE...         runs the target on the given inputs once each
#   scripts/fuzz.sh seeds                         rewrites the cluster_frame and grpc_infer seeds
#                                                 with the real encoders (the example fuzz_seeds
#                                                 of crates/mesh, in the main workspace)
#
# Environment: FUZZ_TIMEOUT (seconds one input may take before it is a hang; default 10),
# FUZZ_RSS_MB (memory limit; default 2048), CARGO_BUILD_JOBS as for cargo.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
fuzz=$root/fuzz
host=$(rustc -vV | sed -n 's/^host: //p')
bin_dir=$fuzz/target/$host/release
timeout_s=${FUZZ_TIMEOUT:-10}
rss_mb=${FUZZ_RSS_MB:-2048}

# The instrumentation cargo-fuzz would add, on stable: SanitizerCoverage's module pass with
# inline 8-bit counters, the PC table and comparison tracing for libFuzzer, `cfg(fuzzing)`, and
# debug assertions and overflow checks so an arithmetic overflow is a crash. `--target` keeps these
# flags off build scripts and proc macros (they run on the host and are not linked with libFuzzer).
flags=(
  --cfg fuzzing
  -Cpasses=sancov-module
  -Cllvm-args=-sanitizer-coverage-level=4
  -Cllvm-args=-sanitizer-coverage-inline-8bit-counters
  -Cllvm-args=-sanitizer-coverage-pc-table
  -Cllvm-args=-sanitizer-coverage-trace-compares
  -Cdebug-assertions
  -Coverflow-checks
)

targets() {
  local f
  for f in "$fuzz"/fuzz_targets/*.rs; do
    basename "$f" .rs
  done
}

known() {
  targets | grep -x -- "$1" >/dev/null || {
    echo "fuzz: unknown target '$1' (scripts/fuzz.sh list)" >&2
    exit 2
  }
}

build() {
  local start=$SECONDS
  # From fuzz/, so the repository's .cargo/config.toml (PROTOC) applies as it does at the root.
  (cd "$fuzz" && RUSTFLAGS="${flags[*]}" cargo build --locked --release --target "$host" --bins)
  echo "fuzz: built $(targets | wc -l) targets in $((SECONDS - start)) s ($bin_dir)"
}

# Fails when the committed cluster_frame seeds are not what the link's encoder writes today (a new
# protocol version or message layout): the fuzzer would only see frames refused at the prelude.
# (The grpc_infer seeds are protobuf, stable across versions; their maps encode in any order.)
check_seeds() {
  local tmp f stale=0
  tmp=$(mktemp -d)
  (cd "$root" && cargo run --quiet -p mesh --example fuzz_seeds -- "$tmp" >/dev/null)
  for f in "$tmp"/cluster_frame/*; do
    cmp -s "$f" "$fuzz/seeds/cluster_frame/$(basename "$f")" || stale=1
  done
  rm -rf "$tmp"
  if [ "$stale" = 1 ]; then
    echo "fuzz: fuzz/seeds/cluster_frame is stale (the link's frames changed): run scripts/fuzz.sh seeds" >&2
    return 1
  fi
}

# Prints one line about a finished libFuzzer run from its log: executions, exec/s, coverage, crash.
summary() {
  local target=$1 log=$2 rc=$3 secs=$4
  local execs speed cov ft corp rss crash
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -oE '\bcov: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+' || true)
  ft=$(grep -oE '\bft: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+' || true)
  corp=$(grep -oE '\bcorp: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+' || true)
  rss=$(grep -oE '\brss: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+' || true)
  crash=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
  if [ -z "$execs" ]; then # a crash ends the run before the final statistics
    execs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#' || true)
  fi
  printf '%-14s executions %-10s exec/s %-7s cov %-6s ft %-6s corpus %-5s rss %4s MB %5s s  crashes %s\n' \
    "$target" "${execs:-?}" "${speed:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "${rss:-?}" "$secs" \
    "$([ "$rc" = 0 ] && echo 0 || echo "1 (exit $rc${crash:+, input $crash}; see $log)")"
}

# run TARGET LOG CORPUS... -- ARGS: one libFuzzer process (one core: no -jobs, no -workers, no -fork).
fuzz_one() {
  local target=$1 log=$2
  shift 2
  local dirs=() args=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    dirs+=("$1")
    shift
  done
  [ $# -gt 0 ] && shift
  args=("$@")
  # Dictionaries: config.pbtxt keywords for pbtxt, JSON and KServe field names for the JSON bodies.
  local dict=
  case "$target" in
    pbtxt) dict=$fuzz/dicts/pbtxt.dict ;;
    http_* | grpc_infer | shm_register | python_ipc) dict=$fuzz/dicts/json.dict ;;
  esac
  local exe=$bin_dir/$target
  [ -x "$exe" ] || {
    echo "fuzz: $exe is not built (scripts/fuzz.sh build)" >&2
    exit 1
  }
  mkdir -p "$fuzz/artifacts/$target" "$(dirname "$log")"
  local opts=(
    -artifact_prefix="$fuzz/artifacts/$target/"
    -rss_limit_mb="$rss_mb"
    -timeout="$timeout_s"
    -print_final_stats=1
  )
  [ -n "$dict" ] && opts+=(-dict="$dict")
  local start=$SECONDS rc=0
  RUST_BACKTRACE=1 "$exe" "${opts[@]}" "${args[@]}" "${dirs[@]}" >"$log" 2>&1 || rc=$?
  summary "$target" "$log" "$rc" "$((SECONDS - start))"
  return "$rc"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  list)
    for t in $(targets); do
      # The first paragraph of the target's `//!` comment says what it fuzzes.
      printf '%-14s %s\n\n' "$t" "$(sed -n '/^\/\/!$/q; s/^\/\/! *//p' "$fuzz/fuzz_targets/$t.rs" | fmt -w 84 | sed '2,$s/^/               /')"
    done
    ;;
  build)
    build
    ;;
  run)
    target=${1:?usage: scripts/fuzz.sh run TARGET [--runs N | --time S] [-- LIBFUZZER_ARGS...]}
    shift
    known "$target"
    limit=()
    extra=()
    while [ $# -gt 0 ]; do
      case "$1" in
        --runs) limit=(-runs="${2:?--runs needs a number}"); shift 2 ;;
        --time) limit=(-max_total_time="${2:?--time needs seconds}"); shift 2 ;;
        --) shift; extra=("$@"); break ;;
        *) echo "fuzz: unknown option '$1'" >&2; exit 2 ;;
      esac
    done
    corpus=$fuzz/corpus/$target
    mkdir -p "$corpus"
    fuzz_one "$target" "$fuzz/logs/$target.log" "$corpus" "$fuzz/seeds/$target" -- "${limit[@]}" "${extra[@]}"
    ;;
  smoke)
    runs=${1:-200000}
    check_seeds
    build
    failed=0
    start=$SECONDS
    for t in $(targets); do
      # A scratch corpus, so CI starts from the committed seeds alone and leaves nothing behind.
      scratch=$(mktemp -d)
      fuzz_one "$t" "$fuzz/logs/smoke-$t.log" "$scratch" "$fuzz/seeds/$t" -- -runs="$runs" || failed=1
      rm -rf "$scratch"
    done
    echo "fuzz: smoke run of every target, $runs runs each, took $((SECONDS - start)) s"
    exit "$failed"
    ;;
  replay)
    target=${1:?usage: scripts/fuzz.sh replay TARGET FILE...}
    shift
    known "$target"
    RUST_BACKTRACE=1 "$bin_dir/$target" -rss_limit_mb="$rss_mb" -timeout="$timeout_s" "$@"
    ;;
  seeds)
    cd "$root"
    cargo run --quiet -p mesh --example fuzz_seeds -- "$fuzz/seeds"
    ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
