"""Fair shares of a node (issue 52): a fast model's latency while another model is flooded, with
the budget shared fairly (the default reserve) against the same node first come, first served
(`--inflight-reserve-bytes 0`, how the budget worked before), in one run.

The flood: `mesh-ops bench` at concurrency 256 (256 connections, closed loops) on a Python model
that sleeps 1 s, so the node's budget (`--max-inflight-bytes 4M`) stays full and the excess is
refused at once. The victim: `mesh-ops bench` at concurrency 1 on an ONNX identity model, 10 s
before the flood and 10 s during it. Reported: the victim's p50 and p99, its failed requests, and
the ratio of its p99 during the flood to its p99 before.

Output: a markdown report on stdout and in benches/results/fair-shares-<host>.md.
Usage: .venv/bin/python benches/fair_shares.py [--seconds 10]   (needs scripts/setup.sh)
"""
import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benches"))
from mesh_util import MeshServer  # noqa: E402
from scheduling import env  # noqa: E402

OPS = ROOT / "target" / "release" / "mesh-ops"


def repo(tmp: Path) -> Path:
    r = tmp / "repo"
    r.mkdir()
    shutil.copytree(ROOT / "tests" / "python_models" / "sleep_py", r / "sleep_py")
    models = tmp / "models"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_models.py"), "--out", str(models)],
                   check=True, capture_output=True)
    shutil.copytree(models / "dtypes" / "identity_fp32_nobatch", r / "identity_fp32_nobatch")
    return r


# With --pin, the node runs on CPU 0 and both load generators on CPU 1 (taskset), so the flood's
# client does not take the node's CPU.
PIN: dict[str, list[str]] = {"node": [], "load": []}


def bench(srv: MeshServer, model: str, args: list[str]) -> dict:
    cmd = PIN["load"] + [str(OPS), "bench", model, "--protocol", "grpc", "--grpc-url", f"127.0.0.1:{srv.grpc_port}",
           "--json", "--no-progress"] + args
    out = subprocess.run(cmd, capture_output=True, text=True)
    return json.loads(out.stdout)


def run(tmp: Path, reserve: list[str], seconds: int) -> dict:
    flood_input = tmp / "flood.json"
    flood_input.write_text(json.dumps({"data": [{"X": [1.0], "MS": [1000]}]}))
    srv = MeshServer(ROOT / "target" / "release" / "mesh-node", [repo(tmp)],
                     ["--backend-config", f"python,interpreter={sys.executable}",
                      "--max-inflight-bytes", str(4 << 20)] + reserve,
                     tmp / "node.log", env()).start(["sleep_py", "identity_fp32_nobatch"], timeout=120)
    if PIN["node"]:
        pids = [str(srv.proc.pid)] + subprocess.run(["pgrep", "-P", str(srv.proc.pid)], capture_output=True,
                                                    text=True).stdout.split()
        for pid in pids:  # the node's threads and its Python stubs
            subprocess.run(["taskset", "-a", "-cp", "0", pid], check=True, capture_output=True)
    victim = ["--shape", "INPUT0:1,16", "-c", "1", "--duration", f"{seconds}s"]
    try:
        quiet = bench(srv, "identity_fp32_nobatch", victim)
        flood = subprocess.Popen(PIN["load"] + [str(OPS), "bench", "sleep_py", "--protocol", "grpc", "--grpc-url",
                                  f"127.0.0.1:{srv.grpc_port}", "--input", str(flood_input), "-c", "256",
                                  "--duration", f"{seconds + 6}s", "--json", "--no-progress"],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        time.sleep(3)
        loaded = bench(srv, "identity_fp32_nobatch", victim)
        flooded = json.loads(flood.communicate()[0])
    finally:
        srv.stop()
    return {"quiet": quiet, "loaded": loaded, "flood": flooded}


def row(name: str, r: dict) -> str:
    q, l, f = r["quiet"], r["loaded"], r["flood"]
    lat = lambda s, p: s["latency_us"][p] or float("nan")  # noqa: E731 - None when nothing succeeded
    ratio = lat(l, "p99") / lat(q, "p99")
    return (f"| {name} | {lat(q, 'p50'):.0f} / {lat(q, 'p99'):.0f} | {lat(l, 'p50'):.0f} / {lat(l, 'p99'):.0f} "
            f"| {l['failed']} of {l['requests']} | {ratio:.1f}x | {f['failed']} refused, {f['ok']} answered |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--pin", action="store_true", help="node on CPU 0, load generators on CPU 1")
    a = ap.parse_args()
    if a.pin:
        PIN.update(node=["taskset", "-c", "0"], load=["taskset", "-c", "1"])
    rows = []
    for name, reserve in (("fair shares (default reserve)", []), ("first come (reserve 0)", ["--inflight-reserve-bytes", "0"])):
        with tempfile.TemporaryDirectory() as tmp:
            rows.append(row(name, run(Path(tmp), reserve, a.seconds)))
    report = "\n".join([
        f"# Fair shares, {time.strftime('%Y-%m-%d')}, {platform.node()}{', node pinned to CPU 0' if a.pin else ''}",
        "",
        "| node | victim p50 / p99 µs, quiet | victim p50 / p99 µs, flooded | victim failed | p99 flooded / quiet | flood |",
        "|---|---|---|---|---|---|",
        *rows,
    ])
    print(report)
    out = ROOT / "benches" / "results" / f"fair-shares-{platform.node()}.md"
    out.write_text(report + "\n")


if __name__ == "__main__":
    main()
