"""What the OS scheduler decides, measured rather than tested (issue 41): the wake-ups and CPU that
three of the node's choices save, each against the same node without it, in one run.

- busy polling (`--busy-poll-us 50000`, one async worker): voluntary context switches of the async
  worker per request, over sequential add_sub requests, against a node without the flag;
- the inline path (a Python request that finds its instance idle runs on the async worker): the
  executor thread's voluntary context switches per request with two async workers, against one
  (where a worker must stay free, so every request goes through the executor thread);
- adaptive polling of the stub (`spin-microseconds=3000`, a model that sleeps 5 ms): CPU ticks of
  the executor thread over sequential requests, and of the stubs over one execute's BLS calls,
  with the node's own counts of how its waits went, against `spin-microseconds=0` (never polls).

The tests check only what the code guarantees (tests/test_busy_poll.py, test_python_inline.py,
test_python_spin.py); these counts depend on the machine and its load. The QUIC link's
STOP_SENDING and datagram counts per request are printed by benches/link.rs.
Output: a markdown report on stdout and in benches/results/scheduling-<host>.md.
Usage: .venv/bin/python benches/scheduling.py [--requests 200]   (needs scripts/setup.sh)
"""
import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from mesh_util import MeshServer, metric_sum, parse_metrics  # noqa: E402
from proc_util import cpu_ticks, stubs_of, voluntary_switches  # noqa: E402

from test_python_inline import CONFIG as INLINE_CONFIG, MODEL_PY as INLINE_PY  # noqa: E402
from test_python_spin import write_repo as write_spin_repo  # noqa: E402


def env() -> dict[str, str]:
    e = dict(os.environ)
    if not e.get("ORT_DYLIB_PATH"):
        import onnxruntime
        capi = Path(onnxruntime.__file__).resolve().parent / "capi"
        e["ORT_DYLIB_PATH"] = str(capi / f"libonnxruntime.so.{onnxruntime.__version__}")
    return e


def node(repo: Path, args: list[str], models: list[str], workers: int | None, log: Path) -> MeshServer:
    e = env()
    if workers is not None:
        e["TOKIO_WORKER_THREADS"] = str(workers)
    return MeshServer(ROOT / "target" / "release" / "mesh-node", [repo], args, log, e).start(models, timeout=120)


def add_sub(client, model: str, i: int, negative: bool = False) -> None:
    a = np.full((1, 16), float(i), np.float32)
    b = np.ones((1, 16), np.float32)
    if negative:
        a = -a - 1
    ins = [httpclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    ins[0].set_data_from_numpy(a)
    ins[1].set_data_from_numpy(b)
    np.testing.assert_array_equal(client.infer(model, ins).as_numpy("OUTPUT0"), a + b)


def per_request(srv: MeshServer, model: str, thread: str, n: int) -> float:
    """Voluntary switches of `thread` per request over `n` sequential requests to `model`."""
    c = httpclient.InferenceServerClient(srv.http_url)
    try:
        for i in range(30):
            add_sub(c, model, i)
        before = voluntary_switches(srv.proc.pid, thread) or 0
        for i in range(n):
            add_sub(c, model, i)
        return ((voluntary_switches(srv.proc.pid, thread) or 0) - before) / n
    finally:
        c.close()


def busy_poll(work: Path, models: Path, n: int) -> list[str]:
    repo = work / "busy"
    shutil.copytree(models / "simple" / "add_sub", repo / "add_sub")
    rows = []
    for label, args in (("without", []), ("--busy-poll-us 50000", ["--busy-poll-us", "50000"])):
        srv = node(repo, args, ["add_sub"], 1, work / "busy.log")
        try:
            rows.append(f"| {label} | {per_request(srv, 'add_sub', 'tokio-rt-worker', n):.2f} |")
        finally:
            srv.stop()
    return ["### Busy polling: the async worker's voluntary context switches per request (one worker)",
            "", "| node | switches / request |", "|---|---|", *rows, ""]


def inline(work: Path, models: Path, n: int) -> list[str]:
    repo = work / "inline"
    shutil.copytree(models / "simple" / "add_sub", repo / "add_sub")
    (repo / "inl" / "1").mkdir(parents=True)
    (repo / "inl" / "config.pbtxt").write_text(INLINE_CONFIG)
    (repo / "inl" / "1" / "model.py").write_text(INLINE_PY)
    rows = []
    for workers in (1, 2):
        srv = node(repo, ["--backend-config", f"python,interpreter={sys.executable}"], ["inl", "add_sub"],
                   workers, work / "inline.log")
        try:
            switches = per_request(srv, "inl", "inl_0_0_v1", n)
            ran = metric_sum(parse_metrics(srv.metrics()), "mesh_instance_inline_executions_total",
                             instance="inl_0_0_v1") or 0
            rows.append(f"| {workers} | {switches:.2f} | {int(ran)} of {n + 30} |")
        finally:
            srv.stop()
    return ["### The inline path: the Python instance's executor thread, voluntary context switches per request",
            "", "| async workers | switches / request | requests run inline |", "|---|---|---|", *rows, ""]


def spin(work: Path, calls: int) -> list[str]:
    repo = write_spin_repo(work / "spin")
    rows = []
    for poll_us in (0, 3000):
        srv = node(repo, ["--backend-config", f"python,interpreter={sys.executable}",
                          "--backend-config", f"python,spin-microseconds={poll_us}"],
                   ["sleepy", "caller"], None, work / "spin.log")
        try:
            c = httpclient.InferenceServerClient(srv.http_url, network_timeout=300)
            x = httpclient.InferInput("X", [1], "FP32")
            x.set_data_from_numpy(np.array([1.0], np.float32))
            c.infer("sleepy", [x])
            pid = srv.proc.pid
            before = cpu_ticks(pid, "sleepy_0_0_v1") or 0
            for _ in range(calls):
                c.infer("sleepy", [x])
            thread = (cpu_ticks(pid, "sleepy_0_0_v1") or 0) - before
            stubs = stubs_of(pid)
            before = sum(cpu_ticks(s) or 0 for s in stubs)
            x.set_data_from_numpy(np.array([float(calls)], np.float32))
            waits, caught, missed = c.infer("caller", [x]).as_numpy("WAITS").tolist()
            stub = sum(cpu_ticks(s) or 0 for s in stubs) - before
            c.close()
            s = parse_metrics(srv.metrics())
            node_waits = {p: int(metric_sum(s, "mesh_python_stub_waits_total", instance="sleepy_0_0_v1", poll=p) or 0)
                          for p in ("none", "caught", "missed")}
            rows.append(f"| {poll_us} | {thread} | {node_waits['none']} / {node_waits['caught']} / "
                        f"{node_waits['missed']} | {stub} | {waits - caught - missed} / {caught} / {missed} |")
        finally:
            srv.stop()
    return [f"### Polling for the stub: CPU ticks (1/100 s) over {calls} requests to a model that sleeps 5 ms",
            "", "| spin-microseconds | executor thread ticks | its waits: slept / caught / missed | "
            f"stubs' ticks over {calls} BLS calls | the caller stub's waits: slept / caught / missed |",
            "|---|---|---|---|---|", *rows, ""]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=200)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mesh-sched-bench-"))
    try:
        models = work / "models"
        subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_models.py"), "--out", str(models)],
                       check=True, capture_output=True)
        load = os.getloadavg()[0]
        lines = [f"# benches/scheduling.py, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, "
                 f"{platform.machine()}, load average {load:.2f} at the start", ""]
        lines += busy_poll(work, models, args.requests)
        lines += inline(work, models, args.requests)
        lines += spin(work, args.requests // 2)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = "\n".join(lines)
    print(text)
    host = platform.node() or "host"
    out = ROOT / "benches" / "results" / f"scheduling-{'vm' if host.startswith(('plain', 'vm')) else host}.md"
    out.write_text(text + "\n")


if __name__ == "__main__":
    main()
