"""Detection, recovery and latency under faults (issue 14), in one run on this machine: runs the
fault suites (tests/test_cluster_hosts.py, test_cluster_rolling.py: one namespace per host, as root;
tests/test_cluster_ha.py: two routers and a real etcd) `--rounds` times and gathers what their
checker wrote (tests/.work/chaos/*.json) and the takeover times they printed.
For each node fault: requests and success rate, time to detect (the router stops routing to the
node) and to recover (back in routing), p50/p99 before, during and after the fault, and the p99
during the fault as a ratio of the p99 after it (the reference: the same cluster, fault undone).
Output: a markdown report on stdout and in benches/results/faults-<host>.md.
Usage: .venv/bin/python benches/faults.py [--rounds 3]   (needs scripts/setup.sh; about 2 min a round)
"""
import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHAOS = ROOT / "tests" / ".work" / "chaos"
SUITES = ["tests/test_cluster_hosts.py", "tests/test_cluster_rolling.py", "tests/test_cluster_ha.py",
          "tests/test_cluster_chaos.py"]
TAKEOVER = re.compile(r"^(takeover after [^:]*|the leader stopped deciding)[: ]+([\d.]+)s", re.M)
# The relay suite's partitions (both ways and one way), through `mesh-ops chaos relay`.
LEFT = re.compile(r"^(one-way \(\w+\) partition|the partitioned node)[^\n]*?left routing (\d+) ms after the cut", re.M)


def run_round() -> tuple[dict, dict, str]:
    """One pass of the suites: (checker reports by scenario, HA timings by what, pytest's summary)."""
    for f in CHAOS.glob("*.json"):
        f.unlink()
    env = dict(os.environ, MESH_REQUIRE_SERVER="1")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", *SUITES],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    summary = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-300:]
    if out.returncode != 0:
        print(out.stdout[-4000:], file=sys.stderr)
        raise SystemExit(f"a fault suite failed: {summary}")
    reports = {}
    for f in sorted(CHAOS.glob("*.json")):
        name = f.stem.replace("test_", "").replace("_", " ")
        reports[name] = json.loads(f.read_text())["report"]
    timings = {}
    for what, secs in TAKEOVER.findall(out.stdout):
        timings.setdefault(what.strip(), []).append(float(secs) * 1000)
    for what, ms in LEFT.findall(out.stdout):
        what = "both-way partition" if what == "the partitioned node" else what
        timings.setdefault(f"relayed link, {what} → out of routing", []).append(float(ms))
    return reports, timings, summary


def fmt(v, digits=0) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rounds = [run_round() for _ in range(args.rounds)]
    lines = [f"# Faults on {socket.gethostname()} ({os.cpu_count()} CPUs), {args.rounds} rounds", "",
             "| scenario | requests | success | detect ms | recover ms | p50 ms before / during / after "
             "| p99 ms before / during / after | p99 during ÷ after |", "|---|---|---|---|---|---|---|---|"]
    for name in sorted({n for r, _, _ in rounds for n in r}):
        for reports, _, _ in rounds:
            r = reports.get(name)
            if r is None:
                continue
            lat = r["latency"]
            p = lambda phase, q: (lat.get(phase) or {}).get(q)  # noqa: E731
            # The steady state after the fault is the reference: "before" includes the clients'
            # first requests (connections being set up).
            ratio = (p("during", "p99_ms") / p("after", "p99_ms")) if p("during", "p99_ms") and p("after", "p99_ms") else None
            lines.append(
                f"| {name} | {r['requests']} | {r['success_rate'] * 100:.2f}% | {fmt(r.get('detect_ms'))} "
                f"| {fmt(r.get('recover_ms'))} | {fmt(p('before', 'p50_ms'), 1)} / {fmt(p('during', 'p50_ms'), 1)} / "
                f"{fmt(p('after', 'p50_ms'), 1)} | {fmt(p('before', 'p99_ms'), 1)} / {fmt(p('during', 'p99_ms'), 1)} / "
                f"{fmt(p('after', 'p99_ms'), 1)} | {fmt(ratio, 2)}× |")
    lines += ["", "| leader takeover (2 routers, etcd lease 2 s) and relayed partitions | ms, each round | median |",
              "|---|---|---|"]
    for what in sorted({w for _, t, _ in rounds for w in t}):
        values = [v for _, t, _ in rounds for v in t.get(what, [])]
        lines.append(f"| {what} | {', '.join(f'{v:.0f}' for v in values)} | {statistics.median(values):.0f} |")
    lines += ["", "pytest: " + "; ".join(s for _, _, s in rounds)]
    text = "\n".join(lines) + "\n"
    print(text)
    out = ROOT / "benches" / "results" / f"faults-{socket.gethostname()}.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text(text)


if __name__ == "__main__":
    main()
