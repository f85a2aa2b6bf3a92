#!/usr/bin/env bash
# CPU time per routed request, read from each process's own counters: one mesh-node and one
# mesh-router (QUIC, mutual TLS) on loopback, the lean gRPC client (benches/grpc_load.rs) on the
# unbatched MLP at concurrency C, directly and through the router. For each run the router's and the
# node's user+system CPU time (/proc/PID/stat) before and after is divided by the requests the node
# ran (its inference count), so the router's figure is what one routed request costs it: how many
# nodes one router core can front. Then the same with pinning: router and node are started again
# under taskset, the router alone on CPU 0 (so its runtime has one worker), the node and the client
# on CPU 1, and throughput through the router is compared with direct on that pinning.
# Usage: benches/router_cpu.sh [SECONDS_PER_POINT] [CONCURRENCY]   (needs scripts/setup.sh; ~1 minute)
# ROUTER_BIN and NODE_BIN run other builds (to compare a change against the commit before it);
# ROUTER_ARGS and NODE_ARGS add flags (e.g. ROUTER_ARGS="--busy-poll-us 300").
DEFAULT_SECS=8
CONC=${2:-4}
set -- "${1:-$DEFAULT_SECS}"
source "$(dirname "$0")/common.sh"
ROUTER=${ROUTER_BIN:-target/release/mesh-router}
OPS=target/release/mesh-ops
OUT=benches/results/router-cpu-$(hostname).md
[ -x "$ROUTER" ] && [ -x "$OPS" ] || { echo "run scripts/setup.sh first" >&2; exit 1; }

write_mlp "$WORK/repo"
cluster_certs router:router node:node
cargo build -q --release -p mesh-node --bench grpc_load
LOAD=$(ls -t target/release/deps/grpc_load-* | grep -v '\.d$' | head -1)
TICK=$(getconf CLK_TCK)

start() {  # [taskset prefix for the router] -- [taskset prefix for the node]: sets ROUTER_PID, NODE_PID
  local rpin=() npin=()
  while [ "$#" -gt 0 ] && [ "$1" != -- ]; do rpin+=("$1"); shift; done
  [ "$#" -gt 0 ] && shift
  npin=("$@")
  "${rpin[@]}" "$ROUTER" --http-port 28600 --grpc-port 28601 --metrics-port 28602 --cluster-port 28603 $(tls router) \
    ${ROUTER_ARGS:-} >>"$WORK/router.log" 2>&1 &
  ROUTER_PID=$!
  "${npin[@]}" "${NODE_BIN:-$BIN}" --model-repository "$WORK/repo" --http-port 28610 --grpc-port 28611 --metrics-port 28612 \
    --cluster-join 127.0.0.1:28603 --node-name node $(tls node) ${NODE_ARGS:-} >>"$WORK/node.log" 2>&1 &
  NODE_PID=$!
  wait_live 28610; wait_live 28600
  for _ in $(seq 60); do curl -sf localhost:28600/v2/models/mlp/ready >/dev/null && break; sleep 0.5; done
}
stop() {  # SIGKILL: the next start needs the ports at once
  kill -9 "$ROUTER_PID" "$NODE_PID" 2>/dev/null || true
  wait "$ROUTER_PID" "$NODE_PID" 2>/dev/null || true
}

cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }  # user + system, in clock ticks
count() { curl -sf localhost:28610/v2/models/mlp/stats | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["model_stats"][0]["inference_count"])'; }

point() {  # label port [taskset prefix for the client]: "label req/s p50 p99 requests router_cpu_s node_cpu_s"
  local label=$1 port=$2; shift 2
  local n0 r0 d0 line n1 r1 d1
  n0=$(count); r0=$(cpu $ROUTER_PID); d0=$(cpu $NODE_PID)
  line=$("$@" "$LOAD" "http://127.0.0.1:$port" mlp "$CONC" "$SECS" --no-live 2>/dev/null | grep ModelInfer)
  n1=$(count); r1=$(cpu $ROUTER_PID); d1=$(cpu $NODE_PID)
  echo "$line" | awk -F'|' -v l="$label" -v n=$((n1 - n0)) -v r=$((r1 - r0)) -v d=$((d1 - d0)) -v t="$TICK" \
    '{gsub(/ /,"",$3); gsub(/ /,"",$4); gsub(/ /,"",$5); print l, $3, $4, $5, n, r / t, d / t}'
}

{
  start
  point direct 28611
  point router 28601
  stop
  start taskset -c 0 -- taskset -c 1
  point pinned-direct 28611 taskset -c 1
  point pinned-router 28601 taskset -c 1
  stop
} >"$WORK/rows"

.venv/bin/python - "$WORK/rows" "$SECS" "$CONC" <<'PY' | tee "$OUT"
import datetime, os, sys
rows = {r[0]: r[1:] for r in (l.split() for l in open(sys.argv[1]) if l.strip())}
secs, conc = sys.argv[2:4]
model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
extra = " ".join(f"{k}={os.environ[k]!r}" for k in ("ROUTER_ARGS", "NODE_ARGS") if os.environ.get(k))
print(f"# Router CPU per routed request, {datetime.date.today()}, {os.cpu_count()} vCPU {model}, "
      f"{os.uname().release}, c={conc}, {secs} s a point{', ' + extra if extra else ''}\n")
print("| path | req/s | p50 µs | p99 µs | requests | router CPU µs/request | node CPU µs/request |")
print("|---|---|---|---|---|---|---|")
per = {}
for label, (rps, p50, p99, n, r, d) in rows.items():
    n = max(int(n), 1)
    per[label] = (float(rps), float(r) * 1e6 / n, float(d) * 1e6 / n)
    router = f"{per[label][1]:.1f}" if "router" in label else "-"
    print(f"| {label} | {float(rps):.0f} | {p50} | {p99} | {n} | {router} | {per[label][2]:.1f} |")
print()
print(f"- Router CPU per routed request: {per['router'][1]:.1f} µs unpinned, {per['pinned-router'][1]:.1f} µs pinned; "
      f"the node spends {per['router'][2]:.1f} µs on the same request. One router core fronts about "
      f"{1e6 / per['pinned-router'][1]:.0f} requests/s.")
print(f"- Through the router against direct: {per['router'][0] / per['direct'][0]:.2f}× the throughput unpinned, "
      f"{per['pinned-router'][0] / per['pinned-direct'][0]:.2f}× with the router on its own core.")
lat = {label: float(r[1]) for label, r in rows.items()}
print(f"- Added by the router at p50: {lat['router'] - lat['direct']:+.0f} µs unpinned, "
      f"{lat['pinned-router'] - lat['pinned-direct']:+.0f} µs pinned.")
PY
