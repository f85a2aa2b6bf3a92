#!/usr/bin/env bash
# Two router builds side by side, for a change that must not make the hop slower: one mesh-node
# joined to both routers (QUIC, mutual TLS), the lean gRPC client (benches/grpc_load.rs) on the
# unbatched MLP directly, through router A and through router B, at concurrency 1 and 8, the three
# paths interleaved over ROUNDS rounds (A and B take turns going first). The hop of a path is its
# p50 minus the direct p50 of the same round; the summary gives medians over rounds and B against A.
# Usage: benches/router_ab.sh ROUTER_A ROUTER_B [SECONDS_PER_POINT] [ROUNDS]
#   e.g. the last commit's router against the working tree's: build A from a `git worktree` of the
#   old commit with its own CARGO_TARGET_DIR (sharing target/ across worktrees once made cargo link
#   the new router against the old mesh library), then copy both binaries out of target/.
# Output: markdown on stdout and in benches/results/router-ab-<host>.md.
A=${1:?usage: benches/router_ab.sh ROUTER_A ROUTER_B [SECONDS_PER_POINT] [ROUNDS]}
B=${2:?usage: benches/router_ab.sh ROUTER_A ROUTER_B [SECONDS_PER_POINT] [ROUNDS]}
A=$(realpath "$A"); B=$(realpath "$B")
ROUNDS=${4:-4}
DEFAULT_SECS=4
set -- "${3:-4}"
source "$(dirname "$0")/common.sh"
OUT=benches/results/router-ab-$(hostname).md

write_mlp "$WORK/repo"
cluster_certs router-a:router router-b:router node:node
cargo build -q --release -p mesh-node --bench grpc_load
LOAD=$(ls -t target/release/deps/grpc_load-* | grep -v '\.d$' | head -1)

"$A" --http-port 28400 --grpc-port 28401 --metrics-port 28402 --cluster-port 28403 $(tls router-a) \
  >"$WORK/router-a.log" 2>&1 &
"$B" --http-port 28500 --grpc-port 28501 --metrics-port 28502 --cluster-port 28503 $(tls router-b) \
  >"$WORK/router-b.log" 2>&1 &
"$BIN" --model-repository "$WORK/repo" --http-port 28410 --grpc-port 28411 --metrics-port 28412 \
  --cluster-join 127.0.0.1:28403 --cluster-join 127.0.0.1:28503 --node-name node $(tls node) \
  >"$WORK/node.log" 2>&1 &
wait_live 28410; wait_live 28400; wait_live 28500

row() {  # round path port concurrency: "round path c req/s p50 p99"
  "$LOAD" "http://127.0.0.1:$3" mlp "$4" "$SECS" 2>/dev/null | grep ModelInfer \
    | awk -F'|' -v r="$1" -v p="$2" -v c="$4" '{gsub(/ /,"",$3); gsub(/ /,"",$4); gsub(/ /,"",$5); print r, p, c, $3, $4, $5}'
}
for round in $(seq "$ROUNDS"); do
  for c in 1 8; do
    row "$round" direct 28411 "$c"
    # A first in odd rounds, B first in even ones, so neither always runs on the warmer machine.
    if [ $((round % 2)) = 1 ]; then
      row "$round" A 28401 "$c"; row "$round" B 28501 "$c"
    else
      row "$round" B 28501 "$c"; row "$round" A 28401 "$c"
    fi
  done
done >"$WORK/rows"

.venv/bin/python - "$WORK/rows" "$A" "$B" "$SECS" "$ROUNDS" <<'PY' | tee "$OUT"
import statistics, sys, datetime, os
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
a, b, secs, rounds = sys.argv[2:6]
print(f"# Router A against router B, {datetime.date.today()}, {os.cpu_count()} vCPU, {secs} s a point, {rounds} rounds")
print(f"\nA: `{a}`  \nB: `{b}`\n")
print("| round | path | concurrency | req/s | p50 µs | p99 µs |\n|---|---|---|---|---|---|")
for r in rows:
    print("| " + " | ".join(r) + " |")
print("\n| concurrency | path | median req/s | median p50 µs | median hop µs (p50 − direct p50) |\n|---|---|---|---|---|")
summary = {}
for c in ("1", "8"):
    for path in ("direct", "A", "B"):
        pts = [r for r in rows if r[1] == path and r[2] == c]
        hops = []
        for r in pts:
            d = next(x for x in rows if x[0] == r[0] and x[1] == "direct" and x[2] == c)
            hops.append(float(r[4]) - float(d[4]))
        rps = statistics.median(float(r[3]) for r in pts)
        p50 = statistics.median(float(r[4]) for r in pts)
        hop = statistics.median(hops)
        summary[(c, path)] = (rps, hop)
        print(f"| {c} | {path} | {rps:.0f} | {p50:.0f} | {'-' if path == 'direct' else f'{hop:+.0f}'} |")
print()
for c in ("1", "8"):
    (ra, ha), (rb, hb) = summary[(c, "A")], summary[(c, "B")]
    print(f"- c={c}: B's throughput is {rb / ra:.2f}× A's; B's hop {hb:+.0f} µs against A's {ha:+.0f} µs.")
PY
