"""A cluster across hosts you can break (issue 9's harness, tests/netns.py): a router and three
nodes, each in its own network namespace with its own address on a bridge, mutual TLS with the
router's certificate naming its address; add_sub has 2 replicas (a, b). Under a steady load of
checked add_sub requests, node a's host is partitioned (its link down), its process killed (-9) or
frozen (SIGSTOP), then the fault is undone (healed, restarted, SIGCONT): every request must succeed,
the node must leave routing and come back (as the same process, except after a kill). The nodes run
the product's link timings: the detection time lands in the checker's report for benches/faults.py,
and only a hang guard bounds it here. The
checker (tests/checker.py) records every request; the seed that chose the fault's moments is printed
and the run's report lands in tests/.work/chaos/."""
import json
import os
import signal
import threading
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient

import netns
from cluster_util import add_sub_inputs, copy_models, wait_until
from checker import History
from conftest import LOG_DIR, WORK_DIR

pytestmark = [pytest.mark.server, pytest.mark.cluster]


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=2) as r:
        return json.loads(r.read() or b"null")


@pytest.fixture
def network():
    why = netns.unavailable()
    if why:
        pytest.skip(why)
    net = netns.Network()
    yield net
    net.close()
    assert net.leftovers() == [], "the harness left namespaces behind"


@pytest.fixture
def hosts(network, cluster_bins, server_env, cluster_certs, models_dir, tmp_path):
    """A router and three nodes, each on its own host: a and b serve add_sub (2 replicas), c serves mlp."""
    repos = {"add_sub": copy_models(models_dir / "simple", tmp_path / "add_sub", ["add_sub"]),
             "mlp": copy_models(models_dir / "simple", tmp_path / "mlp", ["mlp"])}
    router = network.add("router")
    res = cluster_certs.ops_run("certs", "issue", str(cluster_certs.dir), "router-ns", "--role", "router",
                                  "--ip", router.addr, "--force")
    assert res.returncode == 0, res.stderr
    ca = str(cluster_certs.dir / "ca.pem")
    tls = lambda n: ["--cluster-ca", ca, "--cluster-cert", str(cluster_certs.dir / f"{n}.pem"),  # noqa: E731
                     "--cluster-key", str(cluster_certs.dir / f"{n}.key")]
    ports = ["--http-port", "8000", "--grpc-port", "8001", "--metrics-port", "8002"]
    tag = f"ns-{network.prefix}"
    router.popen([str(cluster_bins["router"]), *ports, "--cluster-port", "8003", *tls("router-ns")],
                 LOG_DIR / f"{tag}-router.log", server_env)
    for name, model in (("a", "add_sub"), ("b", "add_sub"), ("c", "mlp")):
        node = network.add(name)
        cluster_certs.issue(name)
        cmd = [str(cluster_bins["node"]), "--model-repository", str(repos[model]), *ports, "--node-name", name,
               "--cluster-join", f"{router.addr}:8003", *tls(name)]
        node.start = lambda node=node, cmd=cmd: node.popen(cmd, LOG_DIR / f"{tag}-{node.name}.log", server_env)
        node.start()
    url = f"http://{router.addr}:8000"
    wait_until(lambda: {n["name"] for n in get_json(url + "/mesh/v1/cluster")["nodes"] if n["state"] == "up"}
               == {"a", "b", "c"}, 60, "every node up in the router's view")
    return network, url


def kill(host) -> None:
    os.killpg(host.procs[-1].pid, signal.SIGKILL)
    host.procs[-1].wait(10)


# How each fault is made and undone on node a's host, and whether the same process comes back.
FAULTS = {
    "partition": (lambda h: h.cut(), lambda h: h.heal(), True),
    "kill": (kill, lambda h: h.start(), False),
    "freeze": (lambda h: os.killpg(h.procs[-1].pid, signal.SIGSTOP),
               lambda h: os.killpg(h.procs[-1].pid, signal.SIGCONT), True),
}


def node_view(url: str, name: str) -> dict | None:
    return next((n for n in get_json(url + "/mesh/v1/cluster")["nodes"] if n["name"] == name), None)


def load(host_port: str, stop: threading.Event, history: History) -> None:
    client = httpclient.InferenceServerClient(host_port, connection_timeout=30, network_timeout=30)
    while not stop.is_set():
        op = history.begin("add_sub", deadline_s=30)
        a, b = add_sub_inputs(op.id)
        ins = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
        ins[0].set_data_from_numpy(a)
        ins[1].set_data_from_numpy(b)
        try:
            r = client.infer("add_sub", ins, timeout=30_000_000)
            ok = np.array_equal(r.as_numpy("OUTPUT0"), a + b) and np.array_equal(r.as_numpy("OUTPUT1"), a - b)
            history.end(op, ok=True, correct=bool(ok))
        except Exception as e:  # noqa: BLE001 - every failure is recorded and asserted on
            history.end(op, ok=False, kind=type(e).__name__ + ": " + str(e)[:80])
    client.close()


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_node_host_fault_under_load_loses_no_request_and_the_node_comes_back(hosts, request, fault):
    net, url = hosts
    make, undo, same_process = FAULTS[fault]
    before = node_view(url, "a")["incarnation"]
    history = History()
    print(f"\n{fault}: seed {history.seed}")
    cut_after, heal_after = history.rng.randint(200, 400), history.rng.randint(200, 400)
    stop = threading.Event()
    threads = [threading.Thread(target=load, args=(url.removeprefix("http://"), stop, history), daemon=True)
               for _ in range(4)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: len(history.ops) >= cut_after, 60, f"{cut_after} requests before the partition")
        make(net.hosts["a"])
        history.mark("fault")
        wait_until(lambda: node_view(url, "a")["state"] != "up", 60, "node a to leave routing", 0.01)
        history.mark("detected")
        at_cut = len(history.ops)
        wait_until(lambda: len(history.ops) >= at_cut + heal_after, 60, "requests during the partition")
        undo(net.hosts["a"])
        history.mark("healed")
        wait_until(lambda: (n := node_view(url, "a")) and n["state"] == "up", 60, "node a to rejoin", 0.01)
        history.mark("recovered")
        at_heal = len(history.ops)
        wait_until(lambda: len(history.ops) >= at_heal + 300, 60, "300 requests after the heal")
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    history.write(WORK_DIR / "chaos" / f"{request.node.name}.json")
    print(history.table())
    assert history.violations() == [], history.violations()[:10]
    report = history.report()
    assert report["success_rate"] == 1.0, report["errors"]
    came_back = node_view(url, "a")["incarnation"]
    assert (came_back == before) == same_process, f"incarnation {before} then {came_back}"
    print(f"node a left routing {report['detect_ms']:.0f} ms after the {fault}")
