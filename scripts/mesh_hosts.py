#!/usr/bin/env python3
"""The mesh on hosts of one machine (issue 14): a router and nodes, each in its own network namespace
with its own address on a bridge (tests/netns.py), joined over QUIC with mutual TLS.

Two uses:
  - a library, `HostCluster`, that the namespace tests use (tests/test_cluster_rolling.py): start the
    router and nodes on hosts, read the router's view, stop and start a node under its name;
  - the command behind scripts/mesh-hosts.sh (`main()`): starts a router that places a repository's
    models (configs/example-repo by default) on N empty nodes, waits until every model is ready,
    prints how to reach and break everything, and on Ctrl-C / SIGTERM stops the nodes (they drain),
    the router, and deletes every namespace it made. `--check` sends one checked inference through
    the router from this machine's own namespace instead of waiting, then tears everything down.

Only namespaces named with this run's prefix are touched. Needs root and `ip` (iproute2).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO / "tests") not in sys.path:
    sys.path.insert(0, str(REPO / "tests"))
import netns  # noqa: E402  (the namespace harness the tests use too)

HTTP, GRPC, METRICS, CLUSTER = 8000, 8001, 8002, 8003
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def wait_for(pred, timeout: float, what, interval: float = 0.1, alive=None):
    """Polls `pred` until it returns something truthy (returned). `alive()` may raise to give up
    early (a process died); after `timeout` s raises TimeoutError naming `what` (or what() gives)."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            v = pred()
            if v:
                return v
        except (OSError, ValueError, KeyError) as e:
            last = e
        if alive:
            alive()
        if time.monotonic() > deadline:
            what = what() if callable(what) else what
            why = f" (last: {last})" if last else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{why}")
        time.sleep(interval)


def http_json(url: str, body: dict | None = None, timeout: float = 5.0):
    """GET `url` (POST `body` as JSON when given) and the decoded answer; HTTPError on a non-2xx."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read() or b"null")


@contextmanager
def signals_held():
    """Signals wait while a namespace is being made (so none is made but not recorded). Never start a
    process inside: it would inherit the blocked signals (a node deaf to SIGTERM)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class HostCluster:
    """A router and nodes on hosts of `net`. Certificates come from `mesh-ops certs` in `certs`
    (the CA is made there when missing); logs go to `log_dir/<log_tag><host>.log`. Every host's
    `start()` starts its process again with the same flags (a restart under the same name)."""

    def __init__(self, net: netns.Network, bins: dict, workdir: Path, *, certs: Path | None = None,
                 log_dir: Path | None = None, log_tag: str = "", env: dict | None = None):
        self.net = net
        self.bins = {k: str(v) for k, v in bins.items()}
        self.dir = Path(workdir)
        self.certs = Path(certs or self.dir / "certs")
        self.log_dir = Path(log_dir or self.dir / "logs")
        self.log_tag = log_tag
        self.env = env
        self.router: netns.Host | None = None
        self.nodes: dict[str, netns.Host] = {}

    # -- processes ----------------------------------------------------------
    def _ops(self, *args: str) -> None:
        r = subprocess.run([self.bins["ops"], *args], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"mesh-ops {' '.join(args)} failed: {(r.stderr or r.stdout).strip()}")

    def tls(self, name: str, ip: str | None = None, role: str = "node") -> list[str]:
        """The --cluster-ca/-cert/-key flags of member `name`; its certificate is issued when missing
        (always, naming `ip` too, when `ip` is given: the router's address changes per run)."""
        if not (self.certs / "ca.pem").is_file():
            self._ops("certs", "init", str(self.certs))
        pem, key = self.certs / f"{name}.pem", self.certs / f"{name}.key"
        if ip or not pem.is_file():
            self._ops("certs", "issue", str(self.certs), name, "--role", role,
                      *(["--ip", ip, "--force"] if ip else []))
        return ["--cluster-ca", str(self.certs / "ca.pem"), "--cluster-cert", str(pem), "--cluster-key", str(key)]

    def log(self, host: netns.Host) -> Path:
        return self.log_dir / f"{self.log_tag}{host.name}.log"

    def _host(self, name: str, command) -> netns.Host:
        """A new host named `name` running `command(host)`."""
        with signals_held():
            h = self.net.add(name)
        h.cmd = command(h)
        h.start = lambda h=h: h.popen(h.cmd, self.log(h), self.env)
        h.start()
        return h

    @staticmethod
    def _serving_flags(repos) -> list[str]:
        return [*[a for r in repos for a in ("--model-repository", str(r))],
                "--http-port", str(HTTP), "--grpc-port", str(GRPC), "--metrics-port", str(METRICS)]

    def start_router(self, repos=(), args=(), *, name: str = "router", cert: str | None = None) -> netns.Host:
        """The router on its own host, placing the models of `repos` (its cluster repository); its
        certificate (`cert`, default `name`) names the host's address."""
        self.router = self._host(name, lambda h: [
            self.bins["router"], *self._serving_flags(repos), "--cluster-port", str(CLUSTER),
            *self.tls(cert or name, ip=h.addr, role="router"), *map(str, args)])
        return self.router

    def start_node(self, name: str, repos=(), args=()) -> netns.Host:
        """A node on its own host joining the router (empty unless `repos`: its own models)."""
        self.nodes[name] = self._host(name, lambda h: [
            self.bins["node"], *self._serving_flags(repos), "--node-name", name,
            "--cluster-join", f"{self.router.addr}:{CLUSTER}", "--cluster-cache", str(self.dir / f"cache-{name}"),
            *self.tls(name), *map(str, args)])
        return self.nodes[name]

    @staticmethod
    def proc(host: netns.Host) -> subprocess.Popen:
        """The process the host started last."""
        return host.procs[-1]

    def stop(self, host: netns.Host, sig: int = signal.SIGTERM, grace: float = 20.0) -> int | None:
        """Sends `sig` to the host's last process and waits for it (SIGKILL after `grace` s)."""
        p = self.proc(host)
        if p.poll() is None:
            p.send_signal(sig)
            try:
                p.wait(grace)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        return p.returncode

    def alive(self) -> None:
        """Raises when a process of the cluster exited (with the tail of its log)."""
        for h in [self.router, *self.nodes.values()]:
            if h is not None and h.procs and self.proc(h).poll() is not None:
                tail = "\n".join(self.log(h).read_text(errors="replace").splitlines()[-15:])
                raise RuntimeError(f"{h.name} exited with {self.proc(h).returncode}; {self.log(h)}:\n{tail}")

    def shutdown(self, grace: float = 20.0) -> None:
        """Nodes first (SIGTERM: they drain against the live router; a node started by hand in a
        node's namespace too), then the router; anything still running in one of this network's
        namespaces is killed, and every namespace is deleted."""
        leaders = [pid for h in self.nodes.values() for pid in top_pids(h.ns)]
        for pid in leaders:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        for h in self.nodes.values():  # reaps the processes this object started
            for p in h.procs:
                try:
                    p.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        while time.monotonic() < deadline and any(running(pid) for pid in leaders):
            time.sleep(0.1)
        if self.router is not None and self.router.procs:
            self.stop(self.router, grace=5)
        sweep(self.net)

    # -- the router's API -----------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{self.router.addr}:{HTTP}"

    def view(self) -> dict:
        """GET /mesh/v1/cluster on the router."""
        return http_json(self.url + "/mesh/v1/cluster", timeout=2)

    def ops_on_router(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """`mesh-ops ARGS` run on the router's host, as an operator logged in there runs it: without
        a `cluster` restriction the router takes changes (scale, drain) only from its own host."""
        return subprocess.run(["ip", "netns", "exec", self.router.ns, self.bins["ops"], *args,
                               "--router", f"http://127.0.0.1:{HTTP}"],
                              capture_output=True, text=True, timeout=timeout)

    def node_info(self, name: str, view: dict | None = None) -> dict | None:
        """Node `name` in the router's view; a name listed twice is a split view (AssertionError)."""
        found = [n for n in (view or self.view())["nodes"] if n["name"] == name]
        assert len(found) <= 1, f"node {name} is listed {len(found)} times: {found}"
        return found[0] if found else None

    def serving(self, name: str, view: dict | None = None) -> bool:
        """Up, with every model it reported ready (at least one)."""
        n = self.node_info(name, view)
        return bool(n) and n["state"] == "up" and 0 < n["models_ready"] == len(n["models"])

    def index(self) -> list[dict]:
        return http_json(self.url + "/v2/repository/index", {}, timeout=5)

    def ready_models(self) -> set[str]:
        return {m["name"] for m in self.index() if str(m.get("state", "")).upper() == "READY"}

    def replicas(self, model: str, view: dict | None = None) -> list[str]:
        """The nodes where the router's placement has `model` ready."""
        for m in (view or self.view()).get("placement", {}).get("models", []):
            if m["name"] == model:
                return [r["node"] for r in m["replicas"] if str(r["state"]).lower() == "ready"]
        return []


def ns_pids(ns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def top_pids(ns: str) -> list[int]:
    """The processes of namespace `ns` whose parent runs elsewhere (not a node's Python stubs)."""
    pids = set(ns_pids(ns))

    def parent(pid):
        try:
            return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return None
    return sorted(p for p in pids if parent(p) not in pids)


def running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def sweep(net: netns.Network) -> None:
    """Kills whatever runs in one of `net`'s namespaces (also processes started there by hand) and
    deletes them all, the hub and this namespace's bridge interface included."""
    for ns in net.leftovers():
        for pid in ns_pids(ns):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    net.close()
    for ns in net.leftovers():  # made by an interrupted add(): not among net.hosts
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


# ---------------------------------------------------------------------------
# The command (scripts/mesh-hosts.sh)
# ---------------------------------------------------------------------------

def repo_models(repos) -> list[str]:
    return sorted(p.name for r in repos for p in Path(r).iterdir() if (p / "config.pbtxt").is_file())


def check_request(model: str, k: int = 3) -> tuple[dict, dict]:
    """One request for the checked model and its inputs as lists."""
    if model == "add_sub":
        a = [float(i * 3 + k) for i in range(16)]
        b = [k * 0.25] * 16
        ins = {"INPUT0": a, "INPUT1": b}
        shape = [1, 16]
    else:  # mlp
        ins = {"x": [round(((i * 7 + k) % 11) / 10 - 0.5, 1) for i in range(64)]}
        shape = [1, 64]
    body = {"inputs": [{"name": n, "shape": shape, "datatype": "FP32", "data": v} for n, v in ins.items()]}
    return body, ins


def expected(model: str, ins: dict, repos) -> dict:
    """What the model must answer: add_sub exactly; mlp as onnxruntime runs the same file here."""
    if model == "add_sub":
        a, b = ins["INPUT0"], ins["INPUT1"]
        return {"OUTPUT0": [x + y for x, y in zip(a, b)], "OUTPUT1": [x - y for x, y in zip(a, b)]}
    import numpy as np
    import onnxruntime
    path = next(Path(r) / "mlp" / "1" / "model.onnx" for r in repos if (Path(r) / "mlp").is_dir())
    sess = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, {"x": np.array([ins["x"]], np.float32)})
    return {"y": y.reshape(-1).tolist()}


def check(cluster: HostCluster, repos, ops: str) -> bool:
    """One inference through the router from this namespace, its answer checked, and mesh-ops status."""
    models = repo_models(repos)
    model = next((m for m in ("add_sub", "mlp") if m in models), None)
    if model is None:
        print("FAIL: --check needs add_sub or mlp in the repository", flush=True)
        return False
    body, ins = check_request(model)
    answer = http_json(f"{cluster.url}/v2/models/{model}/infer", body, timeout=30)
    got = {o["name"]: o["data"] for o in answer["outputs"]}
    want = expected(model, ins, repos)
    worst = max((abs(g - w) for n in want for g, w in zip(got.get(n, []), want[n])), default=float("inf"))
    ok = all(len(got.get(n, [])) == len(want[n]) for n in want) and worst <= 1e-4
    print("CHECK " + json.dumps({"model": model, "inputs": ins, "outputs": got, "max_diff": worst}), flush=True)
    status = subprocess.run([ops, "status", "--router", cluster.url], capture_output=True, text=True, timeout=30)
    if status.returncode != 0 or not all(n in status.stdout for n in cluster.nodes):
        print(f"FAIL: mesh-ops status --router {cluster.url}: {status.returncode}\n{status.stdout}{status.stderr}")
        return False
    print(f"{'OK' if ok else 'FAIL'}: {model} through the router at {cluster.url} "
          f"(max difference {worst:g}); mesh-ops status lists {len(cluster.nodes)} nodes", flush=True)
    return ok


def example_curl(url: str, model: str) -> str:
    body, _ = check_request(model)
    return f"curl -s {url}/v2/models/{model}/infer -d '{json.dumps(body, separators=(',', ':'))}'"


def describe(cluster: HostCluster, repos, ops: str) -> str:
    net, r = cluster.net, cluster.router
    url = cluster.url
    rows = [f"{'HOST':<8} {'ADDRESS':<14} {'NAMESPACE':<16} {'PID':>7}  LOG"]
    for h in [r, *cluster.nodes.values()]:
        rows.append(f"{h.name:<8} {h.addr:<14} {h.ns:<16} {cluster.proc(h).pid:>7}  {cluster.log(h)}")
    first = next(iter(cluster.nodes.values()))
    models = repo_models(repos)
    sample = next((m for m in ("add_sub", "mlp") if m in models), None)
    cmd, pid = " ".join(first.cmd), cluster.proc(first).pid
    lines = [
        f"The mesh on {len(cluster.nodes) + 1} hosts: network namespaces {net.prefix}* (the bridge is in "
        f"{net.hub}; this machine is {net.subnet}.254 on it, interface {net.local_if})",
        *rows,
        f"Router: HTTP {url}  gRPC {r.addr}:{GRPC}  metrics http://{r.addr}:{METRICS}/metrics  "
        f"cluster UDP {r.addr}:{CLUSTER}",
        f"Ready: {', '.join(sorted(cluster.ready_models()))}",
        "",
        "Try, from this machine:",
        f"  curl -s {url}/v2/health/ready -o /dev/null -w '%{{http_code}}\\n'",
        f"  curl -s -X POST {url}/v2/repository/index",
        *([f"  {example_curl(url, sample)}"] if sample else []),
        f"  {ops} status --router {url}",
        f"  {ops} models --router {url}",
        f"  {ops} bench {sample or 'MODEL'} --url {url} -c 4 --duration 5s",
        "",
        f"Break a host ({first.name} here; each node is alone in its namespace):",
        f"  ip netns pids {first.ns}  # what runs on it",
        f"  kill -TERM {pid}  # graceful: it drains, then leaves",
        f"  kill -9 {pid}  # or kill -STOP {pid} to freeze it, kill -CONT {pid} to thaw it",
        f"  ip -n {net.hub} link set {first.bridge_side} down  # partition its host (up: heal)",
        f"  ip netns exec {first.ns} curl -s {url}/v2/health/ready -w '%{{http_code}}\\n'  # from inside it",
        f"  ip netns exec {first.ns} {cmd} >>{cluster.log(first)} 2>&1 &  # start it again",
        "",
        f"Ctrl-C (or SIGTERM to pid {os.getpid()}) stops the nodes (they drain), then the router, and deletes "
        f"every {net.prefix}* namespace.",
    ]
    return "\n".join(lines)


class Stop(Exception):
    """A signal asked the command to end."""


def binary(env: str, name: str) -> Path:
    p = Path(os.environ.get(env, REPO / "target" / "release" / name))
    return p if p.is_absolute() else REPO / p


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="scripts/mesh-hosts.sh",
        description="Runs the mesh on separate hosts of this machine: one router and N nodes, each in its "
                    "own network namespace with its own address. The router places the repository's models "
                    "on the empty nodes; the script waits until every model is ready, prints how to reach "
                    "and break everything, and on Ctrl-C / SIGTERM stops it all and deletes its namespaces.",
        epilog="Needs root and iproute2. Binaries: target/release/mesh-{node,router,ops} (or MESH_NODE_BIN, "
               "MESH_ROUTER_BIN, MESH_OPS_BIN). If the script itself is killed with -9, remove what is left "
               "with: for n in $(ip netns list | grep -o '^PREFIX[^ ]*'); do kill -9 $(ip netns pids $n); "
               "ip netns del $n; done; ip link del PREFIXt (PREFIX as printed).")
    ap.add_argument("--nodes", type=int, default=3, help="how many nodes (default 3)")
    ap.add_argument("--model-repository", action="append", type=Path, metavar="DIR",
                    help="the router's cluster repository (repeatable; default configs/example-repo)")
    ap.add_argument("--replicas", type=int, default=2,
                    help="replicas of each model (the router's --default-min-replicas; default 2)")
    ap.add_argument("--dir", type=Path, default=REPO / ".cluster" / "hosts",
                    help="certificates, node caches and logs (default .cluster/hosts)")
    ap.add_argument("--timeout", type=float, default=180, help="seconds to wait for every model to be ready")
    ap.add_argument("--check", action="store_true",
                    help="once ready, send one checked inference (add_sub or mlp) through the router from "
                         "this namespace, run mesh-ops status, print OK and tear down (exit 1 on failure)")
    args = ap.parse_args(argv)
    if not 1 <= args.nodes <= 50:
        ap.error("--nodes must be between 1 and 50")
    why = "it needs root (it makes network namespaces): run it with sudo" if os.geteuid() != 0 \
        else netns.unavailable()
    if why:
        print(f"mesh-hosts: {why}", file=sys.stderr)
        return 1
    bins = {"node": binary("MESH_NODE_BIN", "mesh-node"), "router": binary("MESH_ROUTER_BIN", "mesh-router"),
            "ops": binary("MESH_OPS_BIN", "mesh-ops")}
    missing = [str(p) for p in bins.values() if not os.access(p, os.X_OK)]
    if missing:
        print(f"mesh-hosts: missing {', '.join(missing)}: build them (scripts/setup.sh)", file=sys.stderr)
        return 1
    repos = [p.resolve() for p in (args.model_repository or [REPO / "configs" / "example-repo"])]
    bad = [str(r) for r in repos if not r.is_dir()]
    if not bad and args.model_repository is None and not (repos[0] / "mlp" / "1" / "model.onnx").is_file():
        print(f"mesh-hosts: the models of {repos[0]} are not generated yet: run scripts/setup.sh", file=sys.stderr)
        return 1
    if bad:
        print(f"mesh-hosts: no repository {', '.join(bad)}", file=sys.stderr)
        return 1
    models = repo_models(repos)

    def on_signal(sig, _frame):
        raise Stop(signal.Signals(sig).name)

    for s in SIGNALS:
        signal.signal(s, on_signal)
    args.dir.mkdir(parents=True, exist_ok=True)
    net = cluster = None
    code = 1
    t0 = time.monotonic()
    try:
        with signals_held():
            net = netns.Network("mh")
        print(f"namespaces: {net.prefix}* (subnet {net.subnet}.0/24); logs in {args.dir / 'logs'}", flush=True)
        cluster = HostCluster(net, bins, args.dir.resolve())
        python = REPO / ".venv" / "bin" / "python"
        node_args = ["--backend-config", f"python,interpreter={python if python.exists() else sys.executable}"]
        cluster.start_router(repos, ["--default-min-replicas", args.replicas])
        for i in range(1, args.nodes + 1):
            cluster.start_node(f"node-{i}", args=node_args)
        seen = [None]

        def progress():
            up = sum(n["state"] == "up" for n in cluster.view()["nodes"])
            ready = cluster.ready_models() & set(models)
            now = (up, len(ready))
            if now != seen[0]:
                seen[0] = now
                print(f"  {time.monotonic() - t0:5.1f}s: {up}/{args.nodes} nodes up, "
                      f"{len(ready)}/{len(models)} models ready", flush=True)
            return up == args.nodes and len(ready) == len(models)

        wait_for(progress, args.timeout, lambda: f"every node up and every model ready "
                 f"(not ready: {sorted(set(models) - cluster.ready_models())})", 0.25, cluster.alive)
        print(f"ready after {time.monotonic() - t0:.1f}s\n" + describe(cluster, repos, bins["ops"]), flush=True)
        if args.check:
            code = 0 if check(cluster, repos, bins["ops"]) else 1
        else:
            reported: set[int] = set()
            while True:  # a process that exits (killed on purpose, say) is reported, not a reason to end
                time.sleep(1)
                for h in [cluster.router, *cluster.nodes.values()]:
                    p = cluster.proc(h)
                    if p.poll() is not None and p.pid not in reported:
                        reported.add(p.pid)
                        print(f"{time.strftime('%H:%M:%S')} {h.name} (pid {p.pid}) exited with {p.returncode}; "
                              f"its log: {cluster.log(h)}", flush=True)
    except Stop as s:
        print(f"\n{s}: stopping", flush=True)
        code = 0
    except (RuntimeError, TimeoutError, OSError, ValueError) as e:
        print(f"mesh-hosts: {e}", file=sys.stderr, flush=True)
        code = 1
    finally:
        for s in SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        if cluster is not None:
            cluster.shutdown()
        elif net is not None:
            sweep(net)
        if net is not None:
            left = net.leftovers()
            print(f"stopped; {'namespaces left: ' + ' '.join(left) if left else 'every namespace deleted'}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
