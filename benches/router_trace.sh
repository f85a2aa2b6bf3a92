#!/usr/bin/env bash
# The cost of OpenTelemetry tracing through the router (issue 58, part 2): the example repository's
# MLP (dynamic batching, 100 µs) on one mesh-node behind one mesh-router (QUIC, mutual TLS),
# perf_analyzer over gRPC at a fixed concurrency through the router, three pairs up side by side:
#   A  router and node built from the commit before tracing crossed the router (OLD_ROUTER, OLD_NODE),
#   B  the new build, no trace flags (tracing off),
#   C  the new build with every request traced on router and node (mode=opentelemetry,
#      level=TIMESTAMPS, rate=1; Triton's batch span processor defaults) exporting to
#      tests/otlp_collector.py --sink on loopback (it counts spans and answers at once).
# The points are interleaved over ROUNDS rounds, the order turning each round (A B C, B C A, C A B);
# the summary gives each configuration's medians, B/A and C/B, the router's and the node's CPU time
# per request (/proc/PID/stat over the node's inference count), and the spans C's collector received
# per request (6 when nothing is dropped: InferRequest, route, attempt; InferRequest, mlp, compute).
# Usage: benches/router_trace.sh [SECONDS_PER_POINT] [ROUNDS] [CONCURRENCY]   (~6 min)
#   A's binaries: OLD_ROUTER and OLD_NODE (default target/bench-old/release/mesh-{router,node}, built
#   from a `git worktree` of the old commit with CARGO_TARGET_DIR=target/bench-old); OLD_LABEL names
#   them in the results (default: the worktree's commit if /tmp/mesh-old is one, else "old"); B and C
#   run NEW_ROUTER and NEW_NODE (default target/release/), named NEW_LABEL (default: HEAD's commit).
# Output: markdown on stdout and in benches/results/router-trace-<host>.md; the medians as CSV rows
# in benches/results/router-trace-<host>.csv (appended; header written when the file is new); RESULTS
# names another folder for both (a trial run).
ROUNDS=${2:-5}
CONC=${3:-8}
DEFAULT_SECS=5
set -- "${1:-$DEFAULT_SECS}"
source "$(dirname "$0")/common.sh"
OLD_ROUTER=${OLD_ROUTER:-target/bench-old/release/mesh-router}
OLD_NODE=${OLD_NODE:-target/bench-old/release/mesh-node}
OLD_LABEL=${OLD_LABEL:-$(git -C /tmp/mesh-old rev-parse --short HEAD 2>/dev/null || echo old)}
NEW_LABEL=${NEW_LABEL:-$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates || echo +changes)}
NEW_ROUTER=${NEW_ROUTER:-target/release/mesh-router}
NEW_NODE=${NEW_NODE:-$BIN}
for b in "$OLD_ROUTER" "$OLD_NODE" "$NEW_ROUTER" "$NEW_NODE"; do
  [ -x "$b" ] || { echo "$b is missing (see the usage at the top of $0)" >&2; exit 1; }
done
HOST=$(hostname)
RESULTS=${RESULTS:-benches/results}  # another folder for a trial run
OUT=$RESULTS/router-trace-$HOST.md
CSV=$RESULTS/router-trace-$HOST.csv
# Copies, so that a rebuild during the run changes nothing.
cp "$OLD_ROUTER" "$WORK/router-A"; cp "$OLD_NODE" "$WORK/node-A"
cp "$NEW_ROUTER" "$WORK/router-B"; cp "$NEW_NODE" "$WORK/node-B"
ln -s router-B "$WORK/router-C"; ln -s node-B "$WORK/node-C"

mkdir -p "$WORK/repo" && cp -r configs/example-repo/mlp "$WORK/repo/"
cluster_certs router-A:router router-B:router router-C:router node-A:node node-B:node node-C:node
COLLECTOR=28790
.venv/bin/python tests/otlp_collector.py --port "$COLLECTOR" --path "$WORK/traces.json" --sink \
  >"$WORK/collector.log" 2>&1 &
TRACE=(--trace-config mode=opentelemetry --trace-config level=TIMESTAMPS --trace-config rate=1
       --trace-config "opentelemetry,url=localhost:$COLLECTOR/v1/traces")
declare -A BASE=([A]=28700 [B]=28720 [C]=28740) ROUTER_PID NODE_PID
for k in A B C; do
  p=${BASE[$k]}
  flags=(); [ "$k" = C ] && flags=("${TRACE[@]}")
  "$WORK/router-$k" --http-port "$p" --grpc-port $((p + 1)) --metrics-port $((p + 2)) --cluster-port $((p + 3)) \
    $(tls "router-$k") "${flags[@]}" >"$WORK/router-$k.log" 2>&1 &
  ROUTER_PID[$k]=$!
  "$WORK/node-$k" --model-repository "$WORK/repo" --http-port $((p + 10)) --grpc-port $((p + 11)) \
    --metrics-port $((p + 12)) --cluster-join "127.0.0.1:$((p + 3))" --node-name "node-$k" $(tls "node-$k") \
    "${flags[@]}" >"$WORK/node-$k.log" 2>&1 &
  NODE_PID[$k]=$!
done
for k in A B C; do
  p=${BASE[$k]}
  wait_live $((p + 10)); wait_live "$p"
  for _ in $(seq 60); do curl -sf "localhost:$p/v2/models/mlp/ready" >/dev/null && break; sleep 0.5; done
  curl -sf "localhost:$p/v2/models/mlp/ready" >/dev/null || { echo "router $k does not route mlp" >&2; exit 1; }
done

cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }  # user + system, in clock ticks
count() { curl -sf "localhost:$1/v2/models/mlp/stats" | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["model_stats"][0]["inference_count"])'; }
spans() { curl -sf "localhost:$COLLECTOR/stats" | .venv/bin/python -c "import json,sys; print(json.load(sys.stdin)['${1:-spans}'])"; }
TICK=$(getconf CLK_TCK)

point() {  # round config: "round config infer/s p50_us p99_us requests router_cpu_s node_cpu_s"
  local k=$2 p=${BASE[$2]} n0 r0 d0 n1 r1 d1
  n0=$(count $((p + 10))); r0=$(cpu "${ROUTER_PID[$k]}"); d0=$(cpu "${NODE_PID[$k]}")
  rm -f "$WORK/pa.csv"
  "$PEERS/bin/perf_analyzer" -m mlp -u "localhost:$((p + 1))" -i grpc --concurrency-range "$CONC" \
    --measurement-interval $((SECS * 1000)) --stability-percentage 25 -f "$WORK/pa.csv" >"$WORK/pa.log" 2>&1 || true
  n1=$(count $((p + 10))); r1=$(cpu "${ROUTER_PID[$k]}"); d1=$(cpu "${NODE_PID[$k]}")
  .venv/bin/python - "$WORK/pa.csv" "$1" "$k" $((n1 - n0)) $((r1 - r0)) $((d1 - d0)) "$TICK" <<'PY'
import csv, sys
f, rnd, k, n, r, d, tick = sys.argv[1:]
try:
    row = list(csv.DictReader(open(f)))[-1]
    ips, p50, p99 = float(row["Inferences/Second"]), row["p50 latency"], row["p99 latency"]
except (OSError, IndexError, KeyError):
    ips, p50, p99 = 0, "-", "-"
print(rnd, k, f"{ips:.0f}", p50, p99, n, int(r) / int(tick), int(d) / int(tick))
PY
}

s0=$(spans); c0=$(count $((BASE[C] + 10)))
for k in A B C; do point 0 "$k" >/dev/null; done  # warm-up, not counted
# C must really trace through the router: its router's own spans reach the collector. ALLOW_UNTRACED=1
# runs on without them (to try the script on a build without the feature; C then measures nothing new).
for _ in $(seq 20); do [ "$(spans router_requests)" -gt 0 ] && break; sleep 0.5; done
if [ "$(spans router_requests)" = 0 ] && [ "${ALLOW_UNTRACED:-0}" != 1 ]; then
  echo "C's router exported no spans: this build does not trace through the router" >&2; exit 1
fi
ORDERS=("A B C" "B C A" "C A B")
for round in $(seq "$ROUNDS"); do
  for k in ${ORDERS[$(((round - 1) % 3))]}; do point "$round" "$k"; done
done >"$WORK/rows"
sleep 6  # the batch span processor's 5 s schedule: C's last spans reach the collector
s1=$(spans); c1=$(count $((BASE[C] + 10)))
for k in router-C node-C; do  # each distinct warning or error of C's logs, counted, without its time stamp
  grep -h -i "warn\|error" "$WORK/$k.log" | sed -e 's/\x1b\[[0-9;]*m//g' -e 's/^[0-9T:.Z-]* *//' -e "s/^/$k: /"
done | sort | uniq -c | head -8 >"$WORK/warnings" || true

.venv/bin/python - "$WORK/rows" "$SECS" "$ROUNDS" "$CONC" "$OLD_LABEL" "$NEW_LABEL" $((s1 - s0)) $((c1 - c0)) \
  "$WORK/warnings" "$CSV" <<'PY' | tee "$OUT"
import csv, datetime, os, statistics, sys
rows_file, secs, rounds, conc, old, new, spans, requests, warnings, csv_path = sys.argv[1:]
rows = [l.split() for l in open(rows_file) if l.strip()]
today = datetime.date.today().isoformat()
model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
names = {"A": f"A: {old} (before the router traced)", "B": f"B: {new}, tracing off",
         "C": f"C: {new}, every request traced (router and node, rate 1)"}
print(f"# Tracing through the router, {today}, {os.cpu_count()} vCPU {model}, {os.uname().release}, "
      f"the example MLP, perf_analyzer over gRPC at c={conc}, {secs} s a point, {rounds} rounds\n")
for k in "ABC":
    print(f"- {names[k]}")
print("\n| round | config | infer/s | p50 µs | p99 µs | requests | router CPU µs/req | node CPU µs/req |")
print("|---|---|---|---|---|---|---|---|")
for r, k, ips, p50, p99, n, rc, dc in rows:
    n_ = max(int(n), 1)
    print(f"| {r} | {k} | {ips} | {p50} | {p99} | {n} | {float(rc) * 1e6 / n_:.1f} | {float(dc) * 1e6 / n_:.1f} |")
med = {}
for k in "ABC":
    pts = [x for x in rows if x[1] == k and x[3] != "-"]
    med[k] = {"infer_per_s": statistics.median(float(x[2]) for x in pts),
              "p50_us": statistics.median(float(x[3]) for x in pts),
              "p99_us": statistics.median(float(x[4]) for x in pts),
              "router_cpu_us_per_req": statistics.median(float(x[6]) * 1e6 / max(int(x[5]), 1) for x in pts),
              "node_cpu_us_per_req": statistics.median(float(x[7]) * 1e6 / max(int(x[5]), 1) for x in pts)}
print("\n| config | median infer/s | median p50 µs | median p99 µs | router CPU µs/req | node CPU µs/req |")
print("|---|---|---|---|---|---|")
for k in "ABC":
    m = med[k]
    print(f"| {k} | {m['infer_per_s']:.0f} | {m['p50_us']:.0f} | {m['p99_us']:.0f} | "
          f"{m['router_cpu_us_per_req']:.1f} | {m['node_cpu_us_per_req']:.1f} |")
ratio = lambda x, y, key: med[x][key] / med[y][key]
print(f"\n- Tracing off against the old build (B/A): {ratio('B', 'A', 'infer_per_s'):.2f}× the throughput, "
      f"p50 {ratio('B', 'A', 'p50_us'):.2f}×, p99 {ratio('B', 'A', 'p99_us'):.2f}×.")
print(f"- Every request traced against tracing off (C/B): {ratio('C', 'B', 'infer_per_s'):.2f}× the throughput "
      f"(target ≥ 0.90), p50 {ratio('C', 'B', 'p50_us'):.2f}×, p99 {ratio('C', 'B', 'p99_us'):.2f}×; the router "
      f"spends {med['C']['router_cpu_us_per_req'] - med['B']['router_cpu_us_per_req']:+.1f} µs of CPU a request "
      f"on it and the node {med['C']['node_cpu_us_per_req'] - med['B']['node_cpu_us_per_req']:+.1f} µs.")
per = int(spans) / max(int(requests), 1)
print(f"- C's collector received {spans} spans for {requests} requests: {per:.2f} a request (6 when none is dropped).")
lines = open(warnings).read().strip()
if lines:
    print("- C's logs say (count, line):\n\n```text\n" + lines + "\n```")
new_file = not os.path.exists(csv_path)
with open(csv_path, "a", newline="") as f:
    w = csv.writer(f, lineterminator="\n")
    if new_file:
        w.writerow(["date", "machine", "bench", "case", "concurrency", "config", "metric", "value"])
    for k in "ABC":
        for metric, value in med[k].items():
            w.writerow([today, "2-vCPU VM", "router_trace.sh", "mlp", conc, names[k], metric,
                        f"{value:.1f}" if "cpu" in metric else f"{value:.0f}"])
    w.writerow([today, "2-vCPU VM", "router_trace.sh", "mlp", conc, names["C"], "spans_per_request", f"{per:.2f}"])
PY
