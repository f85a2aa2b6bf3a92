"""Placement's costs, in one run on this machine (issue 8):
  - from a node's death (SIGKILL) to every model it held ready elsewhere, three times;
  - shipping and loading a ~100 MB ONNX model through the router, against copying the file locally
    and loading it from a node's own repository;
  - requests failed while load moves to a node that joins, and while a node is drained (goal 0),
    measured with `mesh-ops bench` (closed loop, HTTP, checked by status code).
A router with a cluster repository (explicit mode) and three nodes started without one, mutual TLS.
Output: a markdown report on stdout and in benches/results/placement-<host>.md.
Usage: .venv/bin/python benches/placement.py   (needs scripts/setup.sh to have run; about 2 minutes)
"""
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "target" / "release"
PY = sys.executable
SMALL = ["mlp", "add_sub", "mlp_a", "mlp_b", "mlp_c", "mlp_d"]
BIG_MB = 100
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def free_port(kind=socket.SOCK_STREAM) -> int:
    s = socket.socket(socket.AF_INET, kind)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def get(url: str, timeout=5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read() or b"null")


def post(url: str, body: dict, timeout=300.0) -> float:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=timeout) as r:
        r.read()
    return time.monotonic() - t0


def wait(pred, timeout: float, what: str, interval=0.01):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            v = pred()
            if v:
                return v
        except OSError:
            pass
        time.sleep(interval)
    raise SystemExit(f"timed out waiting for {what}")


def write_big(path: Path) -> None:
    """A MatMul whose weight is BIG_MB of FP32 (y = x @ W, x [1, n])."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    n = int((BIG_MB * 2**20 / 4) ** 0.5)
    w = numpy_helper.from_array(np.random.default_rng(0).random((n, n), dtype=np.float32), "W")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "big",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(m, str(path))


class Cluster:
    def __init__(self, work: Path):
        self.work, self.procs, self.nodes = work, [], {}
        subprocess.run([BIN / "mesh-ops", "certs", "init", work / "certs"], check=True, capture_output=True)
        self.http = free_port()
        self.cluster_port = free_port(socket.SOCK_DGRAM)

    def tls(self, name, role="node"):
        c = self.work / "certs"
        subprocess.run([BIN / "mesh-ops", "certs", "issue", c, name, "--role", role, "--force"], check=True,
                       capture_output=True)
        return ["--cluster-ca", c / "ca.pem", "--cluster-cert", c / f"{name}.pem", "--cluster-key", c / f"{name}.key"]

    def spawn(self, name, cmd):
        log = open(self.work / f"{name}.log", "ab")
        p = subprocess.Popen([str(c) for c in cmd], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(p)
        return p

    def router(self, repo: Path):
        self.spawn("router", [BIN / "mesh-router", "--model-repository", repo, "--model-control-mode", "explicit",
                              *sum((["--load-model", m] for m in SMALL), []), "--min-replica-age-ms", "1000",
                              "--http-port", self.http, "--grpc-port", free_port(), "--metrics-port", free_port(),
                              "--cluster-port", self.cluster_port, *self.tls("router", "router")])
        wait(lambda: get(self.url("/v2/health/live")) or True, 30, "the router")

    def node(self, name):
        cache = self.work / f"cache-{name}"
        p = self.spawn(name, [BIN / "mesh-node", "--node-name", name, "--cluster-join",
                              f"127.0.0.1:{self.cluster_port}", "--cluster-cache", cache, "--http-port", free_port(),
                              "--grpc-port", free_port(), "--metrics-port", free_port(), *self.tls(name)])
        self.nodes[name] = p
        wait(lambda: any(n["name"] == name and n["state"] == "up" for n in self.view()["nodes"]), 30, f"{name}")
        return p

    def url(self, path):
        return f"http://127.0.0.1:{self.http}{path}"

    def view(self):
        return get(self.url("/mesh/v1/cluster"))

    def placement(self):
        return {m["name"]: m for m in self.view()["placement"]["models"]}

    def settled(self, avoid=None) -> bool:
        p = self.placement()
        return set(SMALL) <= set(p) and all(m["ready"] == m["wanted"] and m["wanted"] > 0 and not any(r["node"] == avoid for r in m["replicas"])
                   and all(r["state"] == "ready" for r in m["replicas"]) for m in p.values())

    def bench(self, model, seconds):
        return subprocess.Popen([BIN / "mesh-ops", "bench", model, "--url", self.url(""), "-c", "4",
                                 "--duration", f"{seconds}s", "--json", "--no-progress"], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
        for p in self.procs:
            p.wait()


def bench_result(proc) -> dict:
    out, _ = proc.communicate(timeout=120)
    r = json.loads(out)
    return {"requests": r["requests"], "failed": r.get("failed", r["requests"] - r["ok"]), "errors": r["errors"]}


def local_load_seconds(work: Path, big: Path) -> tuple[float, float]:
    """Copy the model into a fresh local repository, then load it on a plain node (explicit mode)."""
    repo = work / "local-repo"
    t0 = time.monotonic()
    shutil.copytree(big.parent.parent, repo / "big")
    copy = time.monotonic() - t0
    port = free_port()
    log = open(work / "local-node.log", "ab")
    p = subprocess.Popen([str(BIN / "mesh-node"), "--model-repository", str(repo), "--model-control-mode", "explicit",
                          "--http-port", str(port), "--grpc-port", str(free_port()), "--metrics-port",
                          str(free_port())], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait(lambda: get(f"http://127.0.0.1:{port}/v2/health/live") or True, 30, "the local node")
        load = post(f"http://127.0.0.1:{port}/v2/repository/models/big/load", {})
    finally:
        p.kill()
        p.wait()
    return copy, load


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="mesh-placement-"))
    repo = work / "repo"
    simple = ROOT / "target" / "models" / "simple"
    for m in SMALL:
        src = simple / ("mlp" if m.startswith("mlp") else m)
        shutil.copytree(src, repo / m)
        cfg = repo / m / "config.pbtxt"
        cfg.write_text(cfg.read_text().replace('name: "mlp"', f'name: "{m}"'))
    write_big(repo / "big" / "1" / "model.onnx")
    (repo / "big" / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\n')
    big_bytes = (repo / "big" / "1" / "model.onnx").stat().st_size
    c = Cluster(work)
    rows = {}
    try:
        c.router(repo)
        for n in ("n1", "n2", "n3"):
            c.node(n)
        wait(c.settled, 60, "every model placed")
        # Node death → every model it held ready elsewhere.
        deaths = []
        failed_during_deaths = 0
        for i in range(3):
            p = c.placement()
            counts = {}
            for m in p.values():
                for r in m["replicas"]:
                    counts[r["node"]] = counts.get(r["node"], 0) + 1
            if not counts:
                raise SystemExit(f"nothing placed: {c.view()}")
            victim = max(sorted(counts), key=counts.get)
            load = c.bench("mlp", 6)
            time.sleep(1.5)
            c.nodes[victim].kill()
            t0 = time.monotonic()
            wait(lambda: c.settled(avoid=victim), 30, f"{victim}'s models placed again")
            deaths.append((time.monotonic() - t0, counts[victim]))
            failed_during_deaths += bench_result(load)["failed"]
            c.nodes[victim].wait()
            c.node(victim)  # a fresh process (its cache kept) joins: load moves to it
            load = c.bench("add_sub", 8)
            wait(lambda: any(r["node"] == victim for m in c.placement().values() for r in m["replicas"]
                             if r["state"] == "ready"), 30, f"replicas on {victim}")
            time.sleep(3)
            rows.setdefault("join", []).append(bench_result(load))
        rows["deaths"] = deaths
        rows["failed_deaths"] = failed_during_deaths
        # Drain a node under load.
        wait(c.settled, 60, "settled before the drain")
        time.sleep(1.2)
        load = c.bench("mlp", 6)
        time.sleep(1)
        t0 = time.monotonic()
        subprocess.run([BIN / "mesh-ops", "drain", "n1", "--router", c.url("")], check=True, capture_output=True)
        rows["drain_s"] = time.monotonic() - t0
        rows["drain"] = bench_result(load)
        # A ~100 MB model: shipped to two nodes and loaded, against a local copy and load.
        rows["ship_s"] = post(c.url("/v2/repository/models/big/load"), {})
        fetched = []
        for n in ("n2", "n3"):
            for line in open(work / f"{n}.log", errors="replace"):
                if m := re.search(r"files received from the router model=big bytes=\d+ ms=(\d+)", ANSI.sub("", line)):
                    fetched.append(int(m.group(1)))
        rows["fetch_ms"] = fetched
        rows["copy_s"], rows["local_load_s"] = local_load_seconds(work, repo / "big" / "1" / "model.onnx")
    finally:
        c.close()
    host = socket.gethostname()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    d = [t for t, _ in rows["deaths"]]
    out = [f"# Placement: re-placement, shipping, moves, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} vCPU {cpu}",
           "",
           f"Router (explicit mode, {len(SMALL)} small models, 2 replicas each) and 3 nodes started empty, loopback, "
           "mutual TLS.", "",
           "| measurement | result | goal |", "|---|---|---|",
           f"| node killed → its models ready elsewhere (3 kills; replicas it held) | "
           f"{', '.join(f'{t * 1000:.0f} ms ({n})' for t, n in rows['deaths'])}; median {statistics.median(d) * 1000:.0f} ms "
           f"| ≤ 5 s |",
           f"| requests failed while nodes were killed (mesh-ops bench mlp, c=4) | {rows['failed_deaths']} | 0 |",
           f"| requests failed while load moved to a joining node (add_sub, c=4, 3 joins) | "
           f"{sum(j['failed'] for j in rows['join'])} of {sum(j['requests'] for j in rows['join'])} | 0 |",
           f"| requests failed during a drain (mlp, c=4) | {rows['drain']['failed']} of {rows['drain']['requests']} "
           f"(drain took {rows['drain_s']:.1f} s) | 0 |",
           f"| {big_bytes / 2**20:.0f} MiB model: ship + load through the router (first replica ready) | "
           f"{rows['ship_s']:.2f} s (file transfer {', '.join(f'{m} ms' for m in rows['fetch_ms'])}) | |",
           f"| same model: copy the file locally + load from the node's own repository | "
           f"{rows['copy_s']:.2f} s + {rows['local_load_s']:.2f} s = {rows['copy_s'] + rows['local_load_s']:.2f} s | |",
           f"| ratio ship+load / copy+load | {rows['ship_s'] / (rows['copy_s'] + rows['local_load_s']):.2f}× | |", ""]
    text = "\n".join(out)
    print(text)
    (ROOT / "benches" / "results").mkdir(exist_ok=True)
    (ROOT / "benches" / "results" / f"placement-{host}.md").write_text(text + "\n")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
