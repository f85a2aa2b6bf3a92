"""Helpers for the cluster suite: a mesh-router process beside MeshServer, mesh-nodes that join it
over QUIC (mutual TLS with certificates from `mesh-ops certs`, or --cluster-insecure-dev), the
router's view of the cluster (`GET /mesh/v1/cluster`), and a checked load generator for failover.

Binaries come from env MESH_NODE_BIN, MESH_ROUTER_BIN and MESH_OPS_BIN (defaults under
target/release); logs go to tests/.work/logs/<tag>-<name>.log like the node suite's.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np

from mesh_util import HOST, MeshServer, free_ports, metric_sum, parse_metrics

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def strip_ansi(text: str) -> str:
    return ANSI.sub("", text)


def free_udp_port() -> int:
    """A UDP port on HOST that was free a moment ago (the cluster port is QUIC, over UDP)."""
    return free_ports(1)[0]


def repo_models(repos) -> list[str]:
    """Every model directory of the repositories."""
    return sorted(p.name for r in repos for p in Path(r).iterdir() if p.is_dir())


def copy_models(src: Path, dst: Path, names, rename: dict[str, str] | None = None) -> Path:
    """A repository at `dst` holding copies of `names` from `src`; `rename` maps a source name to a
    new model name (its directory and the config's `name:` line)."""
    dst.mkdir(parents=True, exist_ok=True)
    for n in names:
        new = (rename or {}).get(n, n)
        shutil.copytree(Path(src) / n, dst / new)
        if new != n:
            cfg = dst / new / "config.pbtxt"
            cfg.write_text(re.sub(rf'name:\s*"{re.escape(n)}"', f'name: "{new}"', cfg.read_text()))
    return dst


def shm_bytes(server: MeshServer) -> tuple[float, float]:
    """Payload bytes a process wrote into its link peers' shared-memory arenas, and took out of its own."""
    s = parse_metrics(server.metrics())
    return tuple(metric_sum(s, "mesh_link_shared_memory_bytes_total", direction=d) or 0
                 for d in ("sent", "received"))


def wait_until(pred, timeout: float, what, interval: float = 0.05):
    """Polls `pred` until it returns something truthy (returned); fails naming `what` (a string, or a
    callable giving one at that moment) after `timeout` s."""
    deadline = time.monotonic() + timeout
    last_exc = None
    while True:
        try:
            v = pred()
            if v:
                return v
        except (OSError, ValueError, KeyError, AssertionError) as e:
            last_exc = e
        if time.monotonic() > deadline:
            if callable(what):
                what = what()
            raise AssertionError(f"timed out after {timeout}s waiting for {what}"
                                 + (f" (last error: {last_exc!r})" if last_exc else ""))
        time.sleep(interval)


# The model.py of tests/python_models/sleep_py that also wakes when the file named by the request
# parameter `gate` exists: a test can kill the node running it, whatever the machine's load, and then
# open the gate so that a run elsewhere ends at once.
GATED_SLEEP = """
import json
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            ms = int(pb_utils.get_input_tensor_by_name(r, "MS").as_numpy()[0])
            gate = json.loads(r.parameters() or "{}").get("gate")
            end = time.monotonic() + ms / 1000
            while time.monotonic() < end and not (gate and os.path.exists(gate)):
                time.sleep(min(0.01, max(0.0, end - time.monotonic())))
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x.copy())]))
        return out
"""


# --------------------------------------------------------------------------
# Certificates
# --------------------------------------------------------------------------

class ClusterCerts:
    """A cluster CA made by `mesh-ops certs init` and leaf certificates issued on demand."""

    def __init__(self, ops_bin: Path, directory: Path):
        self.ops = Path(ops_bin)
        self.dir = Path(directory)
        res = self.ops_run("certs", "init", str(self.dir))
        assert res.returncode == 0, f"mesh-ops certs init failed:\n{res.stdout}\n{res.stderr}"
        assert (self.dir / "ca.pem").is_file() and (self.dir / "ca.key").is_file()

    def ops_run(self, *args, timeout=30) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.ops), *args], capture_output=True, text=True, timeout=timeout)

    def issue(self, name: str, role: str = "node") -> tuple[Path, Path]:
        """NAME.pem and NAME.key in `role` (router, node, server or client), issued once."""
        pem, key = self.dir / f"{name}.pem", self.dir / f"{name}.key"
        if not pem.is_file():
            res = self.ops_run("certs", "issue", str(self.dir), name, "--role", role)
            assert res.returncode == 0, f"mesh-ops certs issue {name} failed:\n{res.stdout}\n{res.stderr}"
        return pem, key

    def args(self, name: str, role: str = "node") -> list[str]:
        """--cluster-ca/--cluster-cert/--cluster-key for member `name` in `role`."""
        pem, key = self.issue(name, role)
        return ["--cluster-ca", str(self.dir / "ca.pem"), "--cluster-cert", str(pem), "--cluster-key", str(key)]


# --------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------

class _PlainLog:
    """Log tails without the colour codes the binaries write."""

    def log_tail(self, lines: int = 80) -> str:
        return strip_ansi(super().log_tail(lines))


class MeshRouter(_PlainLog, MeshServer):
    """One mesh-router process: KServe v2 HTTP/gRPC, metrics, and the cluster port (UDP)."""

    kind = "mesh-router"

    def __init__(self, binary, repos, args, log_path, env, cluster_port: int | None = None):
        super().__init__(binary, repos, args, log_path, env)
        self.fixed_cluster_port = cluster_port
        self.cluster_port = 0

    def command(self) -> list[str]:
        return super().command() + ["--cluster-address", HOST, "--cluster-port", str(self.cluster_port)]

    def _spawn(self) -> None:
        self.cluster_port = self.fixed_cluster_port or free_udp_port()
        super()._spawn()

    @property
    def cluster_addr(self) -> str:
        return f"{HOST}:{self.cluster_port}"

    def view(self) -> dict:
        """GET /mesh/v1/cluster."""
        return self.get_json("/mesh/v1/cluster")


class MeshNode(_PlainLog, MeshServer):
    """One mesh-node process that joins a router; `node_name` is its --node-name."""

    kind = "mesh-node"

    def __init__(self, binary, repos, args, log_path, env, node_name: str, wait_models: list[str]):
        super().__init__(binary, repos, args, log_path, env)
        self.node_name = node_name
        self.wait_models = wait_models

    def command(self) -> list[str]:
        return super().command() + ["--node-name", self.node_name]


# Cluster-link timings the suite's clusters use unless a test passes its own: a keep-alive every 300 ms
# and a link dead after 3 s of silence, so a process stalled a moment by a loaded machine keeps its
# link (the product's defaults, 150 ms and 750 ms, are for failure detection: the tests that measure
# detection ask for them with `cluster_factory(link_args=PRODUCT_LINK)`, or pass their own flags).
TOLERANT_LINK = ("--cluster-keepalive-ms", "300", "--cluster-idle-timeout-ms", "3000")
# No flags: the binaries' defaults (150 ms keep-alive, 750 ms idle timeout).
PRODUCT_LINK = ()
_LINK_FLAGS = ("--cluster-keepalive-ms", "--cluster-idle-timeout-ms")


def with_link(args, link_args) -> list[str]:
    """`args` plus `link_args`, unless `args` already sets a link timing itself."""
    args = [str(a) for a in args]
    if any(a.split("=")[0] in _LINK_FLAGS for a in args):
        return args
    return args + list(link_args)


def log_has(proc: MeshServer, pattern: str) -> bool:
    try:
        text = strip_ansi(proc.log_path.read_text(errors="replace"))
    except OSError:
        return False
    return re.search(pattern, text) is not None


# --------------------------------------------------------------------------
# A cluster: one router and its nodes
# --------------------------------------------------------------------------

class Cluster:
    """A router and the nodes that join it. Every process it starts is tracked and stopped by
    close() (SIGCONT first, so a frozen node can die too). Every process gets `link_args` (cluster-link
    timings; default TOLERANT_LINK) unless its own args set a link timing."""

    def __init__(self, bins: dict, env: dict, certs: ClusterCerts | None, tag: str, log_dir: Path,
                 registry: list | None = None, startup: float = 60.0, link_args=TOLERANT_LINK):
        self.bins, self.env, self.certs, self.tag, self.log_dir = bins, env, certs, tag, Path(log_dir)
        self.link_args = tuple(link_args)
        self.registry = registry if registry is not None else []
        self.startup = startup
        self.router: MeshRouter | None = None
        self.nodes: dict[str, MeshNode] = {}
        self.procs: list[MeshServer] = []

    # -- processes ----------------------------------------------------------
    def _log(self, name: str) -> Path:
        p = self.log_dir / f"{self.tag}-{name}.log"
        try:
            p.unlink()
        except FileNotFoundError:
            pass
        return p

    def _track(self, proc: MeshServer, name: str) -> None:
        proc.name = f"{self.tag}-{name}"
        self.procs.append(proc)
        self.registry.append(proc)

    def start_router(self, repos=(), args=(), *, tls: str | None = "router", name="router",
                     cluster_port: int | None = None) -> MeshRouter:
        """Starts the router with the certificate of member `tls` (None: --cluster-insecure-dev)."""
        extra = self.certs.args(tls, "router") if tls else ["--cluster-insecure-dev"]
        args = with_link(args, self.link_args)
        r = MeshRouter(self.bins["router"], list(repos), extra + args, self._log(name), self.env,
                       cluster_port=cluster_port)
        self._track(r, name)
        r.start([], timeout=self.startup)
        self.router = r
        return r

    def start_node(self, name: str, repos, args=(), *, wait_models=None, certs: ClusterCerts | None = None,
                   tls: bool = True, tls_args: list[str] | None = None, join: str | None = None,
                   joined: bool = True) -> MeshNode:
        """Starts node `name` serving `repos` and joining the router (or `join`, HOST:PORT), waits until
        its own endpoints serve its models and, when `joined`, until the router routes to it. Its
        certificate is `name`'s from `certs` (default: the cluster's), or `tls_args` as given, or
        none with --cluster-insecure-dev when not `tls`."""
        repos = [Path(r) for r in repos]
        if wait_models is None:
            wait_models = repo_models(repos)
        certs = certs or self.certs
        if tls_args is not None:
            extra = list(tls_args)
        else:
            extra = certs.args(name) if tls else ["--cluster-insecure-dev"]
        extra += ["--cluster-join", join or self.router.cluster_addr]
        args = with_link(args, self.link_args)
        n = MeshNode(self.bins["node"], repos, extra + args, self._log(name), self.env, name, list(wait_models))
        self._track(n, name)
        n.start(n.wait_models, timeout=self.startup)
        self.nodes[name] = n
        if joined:
            self.wait_joined(name)
        return n

    def restart(self, name: str, *, kill: bool = False, joined: bool = True) -> MeshNode:
        """A new process for node `name` (same name and flags): SIGTERM (or SIGKILL), then start."""
        n = self.nodes[name]
        if kill:
            n.kill()
        else:
            n.stop(grace=15)
        old = self.node_info(name)
        n.start(n.wait_models, timeout=self.startup)
        if joined:
            self.wait_joined(name, not_incarnation=old["incarnation"] if old else None)
        return n

    def close(self) -> None:
        for p in reversed(self.procs):
            if p.running():
                try:
                    os.killpg(p.proc.pid, signal.SIGCONT)
                except (ProcessLookupError, PermissionError):
                    pass
        nodes = [p for p in self.procs if isinstance(p, MeshNode)]
        for p in nodes:  # nodes first: they drain against a live router
            if p.running():
                p.proc.send_signal(signal.SIGTERM)
        for p in nodes:
            p.stop(grace=5)
        for p in self.procs:
            p.stop(grace=5)

    def mesh_processes(self) -> list[MeshServer]:
        return list(self.procs)

    # -- the router's view ----------------------------------------------------
    def view(self) -> dict:
        return self.router.view()

    def node_info(self, name: str, view: dict | None = None) -> dict | None:
        view = view or self.view()
        found = [n for n in view["nodes"] if n["name"] == name]
        assert len(found) <= 1, f"node {name} appears {len(found)} times: {view['nodes']}"
        return found[0] if found else None

    def state(self, name: str) -> str | None:
        info = self.node_info(name)
        return None if info is None else str(info["state"]).lower()

    def routable(self, name: str, view: dict | None = None) -> bool:
        """Up with every model it reported ready."""
        info = self.node_info(name, view)
        return bool(info) and str(info["state"]).lower() == "up" and info["models_ready"] == len(info["models"]) \
            and info["models_ready"] > 0

    def wait_joined(self, name: str, not_incarnation: str | None = None, timeout: float = 60.0,
                    interval: float = 0.05) -> dict:
        """Waits until the router shows node `name` up with all its models (its
        `wait_models` at least) ready, with an incarnation other than `not_incarnation`."""
        n = self.nodes[name]

        def ok():
            info = self.node_info(name)
            if not info or not self.routable(name, {"nodes": [info]}):
                return None
            if not_incarnation is not None and info["incarnation"] == not_incarnation:
                return None
            served = {m.split(":")[0] for m in info["models"]}
            return info if set(n.wait_models) <= served else None

        return wait_until(ok, timeout, f"node {name} to be up in the router's view", interval)

    def wait_not_routable(self, name: str, timeout: float = 60.0, interval: float = 0.01) -> float:
        """Seconds (from now) until node `name` stops being routable (not up, or gone); `timeout` is a
        hang guard, not a bound on detection (print the time; benches/ measures it)."""
        t0 = time.monotonic()
        wait_until(lambda: not self.routable(name), timeout, f"node {name} to leave routing", interval)
        return time.monotonic() - t0


class ClusterFactory:
    """Makes clusters and stops every process they started on close() (the fixtures' object)."""

    def __init__(self, bins: dict, env: dict, certs: ClusterCerts, tag: str, log_dir: Path, registry: list):
        self.bins, self.env, self.certs, self.tag = bins, env, certs, tag
        self.log_dir, self.registry = log_dir, registry
        self.clusters: list[Cluster] = []

    def __call__(self, name: str | None = None, link_args=TOLERANT_LINK) -> Cluster:
        name = name or f"{self.tag}-{len(self.clusters)}"
        c = Cluster(self.bins, self.env, self.certs, name, self.log_dir, registry=self.registry,
                    startup=float(os.environ.get("MESH_TEST_STARTUP_SECS", "60")), link_args=link_args)
        self.clusters.append(c)
        return c

    def close(self) -> None:
        for c in self.clusters:
            c.close()

    def mesh_processes(self) -> list[MeshServer]:
        return [p for c in self.clusters for p in c.procs]


# --------------------------------------------------------------------------
# Load: concurrent add_sub requests, every answer checked
# --------------------------------------------------------------------------

def add_sub_inputs(i: int) -> tuple[np.ndarray, np.ndarray]:
    """Request i's own inputs ([1, 16] FP32, exact sums and differences)."""
    a = (np.arange(16, dtype=np.float32) * 3 + i).reshape(1, 16)
    b = np.full((1, 16), (i % 4096) * 0.25, np.float32)
    return a, b


class AddSubLoad:
    """`concurrency` threads (half gRPC, half HTTP, each its own tritonclient) send add_sub requests
    through the router until stopped and at least `min_requests` answered; each request has its own
    inputs and its answer is checked."""

    def __init__(self, router: MeshRouter, model="add_sub", concurrency=8, min_requests=2000):
        self.router, self.model = router, model
        self.concurrency, self.min_requests = concurrency, min_requests
        self._lock = threading.Lock()
        self._next = 0
        self.ok = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._aborted = threading.Event()
        self._threads: list[threading.Thread] = []
        self.started = self.stopped = 0.0

    def _take(self) -> int | None:
        with self._lock:
            if self._aborted.is_set() or (self._stop.is_set() and self._next >= self.min_requests):
                return None
            i = self._next
            self._next += 1
            return i

    def _run(self, use_grpc: bool) -> None:
        if use_grpc:
            import tritonclient.grpc as mod
            client = mod.InferenceServerClient(self.router.grpc_url)
            call = lambda inputs: client.infer(self.model, inputs, client_timeout=60)
        else:
            import tritonclient.http as mod
            client = mod.InferenceServerClient(self.router.http_url, connection_timeout=60, network_timeout=60)
            call = lambda inputs: client.infer(self.model, inputs)
        try:
            while (i := self._take()) is not None:
                a, b = add_sub_inputs(i)
                ins = [mod.InferInput("INPUT0", [1, 16], "FP32"), mod.InferInput("INPUT1", [1, 16], "FP32")]
                ins[0].set_data_from_numpy(a)
                ins[1].set_data_from_numpy(b)
                try:
                    r = call(ins)
                    s, d = r.as_numpy("OUTPUT0"), r.as_numpy("OUTPUT1")
                    good = s is not None and d is not None and np.array_equal(s, a + b) and np.array_equal(d, a - b)
                    why = None if good else f"request {i}: wrong answer {s!r} {d!r}"
                except Exception as e:  # noqa: BLE001 - every failure is recorded and asserted on
                    why = f"request {i} ({'grpc' if use_grpc else 'http'}): {type(e).__name__}: {e}"
                with self._lock:
                    if why is None:
                        self.ok += 1
                    else:
                        self.failures.append(why)
        finally:
            client.close()

    @property
    def done(self) -> int:
        with self._lock:
            return self.ok + len(self.failures)

    def start(self) -> "AddSubLoad":
        self.started = time.monotonic()
        for k in range(self.concurrency):
            t = threading.Thread(target=self._run, args=(k % 2 == 0,), daemon=True, name=f"load-{k}")
            t.start()
            self._threads.append(t)
        return self

    def wait_done(self, n: int, timeout: float = 120.0) -> None:
        wait_until(lambda: self.done >= n or not any(t.is_alive() for t in self._threads), timeout,
                   f"{n} requests answered (have {self.done})", 0.02)

    def stop(self, timeout: float = 180.0) -> "AddSubLoad":
        self._stop.set()
        for t in self._threads:
            t.join(timeout)
        assert not any(t.is_alive() for t in self._threads), "load threads did not finish"
        self.stopped = time.monotonic()
        return self

    def abort(self) -> None:
        """Ends the load at once (a test's cleanup: no thread outlives it)."""
        self._aborted.set()
        for t in self._threads:
            t.join(60)

    def summary(self) -> str:
        took = (self.stopped or time.monotonic()) - self.started
        return (f"{self.done} requests ({self.ok} ok, {len(self.failures)} failed) in {took:.1f}s "
                f"at concurrency {self.concurrency}")

    def assert_all_ok(self) -> None:
        assert self.done >= self.min_requests, self.summary()
        assert not self.failures, f"{self.summary()}; first failures:\n" + "\n".join(self.failures[:10])

