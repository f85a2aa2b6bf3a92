"""PyTriton scripts joining a cluster (issue 27, item 6): the same PyTriton script
(tests/pytriton/serve.py), run twice with `python -m mesh_pytriton` and `MESH_PYTRITON_ARGS` holding
the cluster-join and certificate flags, starts two mesh-nodes that join one mesh-router over mutual
TLS on loopback. The router routes to the bound functions (PyTriton's own clients and tritonclient
through it), and killing one script with its mesh-node (SIGKILL of the whole process tree) under
load loses no request. Needs .venv-pytriton (scripts/setup-pytriton.sh)."""
import os
import shlex
import signal
import subprocess
from pathlib import Path

import pytest

from cluster_util import AddSubLoad, wait_until
from conftest import REPO_ROOT
from mesh_util import free_ports, metric_sum, parse_metrics, wait_live
from test_pytriton import access_token, check_pytritons_clients, pytriton_python  # noqa: F401 - a fixture

pytestmark = [pytest.mark.server, pytest.mark.cluster]

HERE = Path(__file__).parent / "pytriton"
MODELS = {"add_sub", "double", "upper", "fails", "count"}


def process_tree(root: int) -> list[int]:
    """`root` and every process below it, read from /proc."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(d.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


class PyTritonReplica:
    """One `python -m mesh_pytriton serve.py` whose mesh-node joins the router as `name`."""

    def __init__(self, python: Path, cluster, name: str, env: dict, log_dir: Path):
        self.name = name
        self.token = None  # PyTriton's access token, read once from its mesh-node's flags
        self.ports = free_ports(3)
        self.log = log_dir / f"{name}.log"
        join = ["--cluster-join", cluster.router.cluster_addr, "--node-name", name] + cluster.certs.args(name)
        env = {k: v for k, v in env.items() if not k.startswith("PYTHON")}
        env.update(PYTHONUNBUFFERED="1", MESH_PYTRITON_ARGS=shlex.join(join))
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([str(python), "-m", "mesh_pytriton", str(HERE / "serve.py"),
                                          *map(str, self.ports)], stdout=out, stderr=subprocess.STDOUT,
                                         env=env, cwd=REPO_ROOT, start_new_session=True)

    def kill_tree(self) -> None:
        """SIGKILL to the script, its mesh-node and the node's Python stubs, as a host dying would.

        The tree is frozen (SIGSTOP) before anything is killed: PyTriton starts its server with a
        parent-death signal of SIGTERM, so killing the script first would let the node drain
        gracefully in the moment before its own SIGKILL, and the test would see a drain, not a death.
        """
        tree = process_tree(self.proc.pid)
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in tree:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)  # a user's Ctrl-C: PyTriton stops mesh-node
            try:
                self.proc.wait(30)
                return
            except subprocess.TimeoutExpired:
                pass
        self.kill_tree()


@pytest.fixture
def replicas(cluster_factory, pytriton_python, cluster_bins, server_env, tmp_path):
    cluster = cluster_factory()
    cluster.start_router()
    env = dict(server_env, MESH_NODE_BIN=str(cluster_bins["node"]))
    started = [PyTritonReplica(pytriton_python, cluster, f"py{i}", env, tmp_path) for i in (1, 2)]
    loads: list[AddSubLoad] = []
    try:
        for r in started:
            wait_live(r.proc, r.ports[0], r.log, timeout=120, path="/v2/models/count/ready")
        for r in started:
            wait_until(lambda: joined(cluster, r.name), 60,
                       lambda: f"{r.name} up with PyTriton's models in {cluster.view()}\n{r.log.read_text()[-3000:]}")
        yield cluster, started, loads
    finally:
        for load in loads:
            load.abort()
        for r in started:
            r.stop()


def joined(cluster, name: str) -> bool:
    info = cluster.node_info(name)
    return bool(info) and cluster.routable(name, {"nodes": [info]}) \
        and MODELS <= {m.split(":")[0] for m in info["models"]}


def served_by(replica: PyTritonReplica, model: str) -> int:
    """The replica's own count of `model` requests it ran (its statistics, behind PyTriton's token)."""
    import tritonclient.http as httpclient
    if replica.token is None:
        replica.token = access_token(replica.ports[0])
    c = httpclient.InferenceServerClient(f"127.0.0.1:{replica.ports[0]}")
    try:
        stats = c.get_inference_statistics(model, headers={"triton-access-token": replica.token})
        return int(stats["model_stats"][0]["inference_stats"]["success"]["count"])
    finally:
        c.close()


def test_pytritons_clients_reach_the_bound_functions_through_the_router(replicas, pytriton_python):
    """ModelClient, FuturesModelClient and DecoupledModelClient, pointed at the router, get the
    answers the script's functions give: @batch, @sample with BYTES, the raised error, a stream."""
    cluster, started, _ = replicas
    router = cluster.router
    check_pytritons_clients(pytriton_python, router.http_port, router.grpc_port, router.log_tail)
    rows = {r["name"]: r for r in router.index()}
    for model in MODELS:
        assert rows[model]["state"] == "READY" and sorted(rows[model]["nodes"]) == ["py1", "py2"], rows


def test_killing_one_pytriton_replica_under_load_loses_no_request(replicas):
    """Eight tritonclient threads send add_sub through the router to the two replicas; a third of
    the way, one script dies with its mesh-node (SIGKILL). Every request gets its right answer."""
    cluster, (py1, py2), loads = replicas
    load = AddSubLoad(cluster.router, concurrency=8, min_requests=1500)
    loads.append(load)
    load.start()
    load.wait_done(500)
    assert served_by(py1, "add_sub") > 0 and served_by(py2, "add_sub") > 0, "both replicas take traffic"
    py1.kill_tree()
    took = cluster.wait_not_routable("py1", timeout=60)
    print(f"\npy1 (SIGKILL of the script and its mesh-node) left routing {took * 1000:.0f} ms after the kill")
    # py2's count first: whatever it counted then was answered by the time `done` is read, but
    # for the few still on their way back (the slack below).
    py2_then = served_by(py2, "add_sub")
    at_detection = load.done
    load.wait_done(max(1500, at_detection + 300))
    load.stop()
    print(load.summary())
    load.assert_all_ok()
    assert cluster.state("py1") == "lost", cluster.node_info("py1")
    m = parse_metrics(cluster.router.metrics())
    # the requests py1 had when it died were retried on py2 (not merely: nothing was in flight)
    assert (metric_sum(m, "mesh_router_retries_total") or 0) >= 1, m
    assert (metric_sum(m, "mesh_router_failovers_total") or 0) >= 1, m
    # what was answered after py1 left routing ran on py2 (less a few answers counted late)
    assert served_by(py2, "add_sub") - py2_then >= load.done - at_detection - 8
