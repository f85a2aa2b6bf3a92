"""A cluster across hosts you can break (issue 9's harness, tests/netns.py): a router and two nodes,
each in its own network namespace with its own address on a bridge, mutual TLS with the router's
certificate naming its address. Under a steady load of checked add_sub requests (both nodes serve
add_sub), one node's host is partitioned (its link taken down), then healed: every request must
succeed, the node must leave routing within a few seconds and come back as the same process."""
import json
import subprocess
import threading
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient

import netns
from cluster_util import add_sub_inputs, copy_models, wait_until
from conftest import LOG_DIR

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
    repo = copy_models(models_dir / "simple", tmp_path / "repo", ["add_sub"])
    router, a, b = network.add("router"), network.add("a"), network.add("b")
    res = cluster_certs.ops_run("certs", "issue", str(cluster_certs.dir), "router-ns", "--ip", router.addr, "--force")
    assert res.returncode == 0, res.stderr
    ca = str(cluster_certs.dir / "ca.pem")
    tls = lambda n: ["--cluster-ca", ca, "--cluster-cert", str(cluster_certs.dir / f"{n}.pem"),  # noqa: E731
                     "--cluster-key", str(cluster_certs.dir / f"{n}.key")]
    ports = ["--http-port", "8000", "--grpc-port", "8001", "--metrics-port", "8002"]
    tag = f"ns-{network.prefix}"
    router.popen([str(cluster_bins["router"]), *ports, "--cluster-port", "8003", *tls("router-ns")],
                 LOG_DIR / f"{tag}-router.log", server_env)
    for node in (a, b):
        cluster_certs.issue(node.name)
        node.popen([str(cluster_bins["node"]), "--model-repository", str(repo), *ports, "--node-name", node.name,
                    "--cluster-join", f"{router.addr}:8003", *tls(node.name)], LOG_DIR / f"{tag}-{node.name}.log",
                   server_env)
    url = f"http://{router.addr}:8000"
    wait_until(lambda: {n["name"] for n in get_json(url + "/mesh/v1/cluster")["nodes"] if n["state"] == "up"}
               == {"a", "b"}, 60, "both nodes up in the router's view")
    return network, url


def node_view(url: str, name: str) -> dict | None:
    return next((n for n in get_json(url + "/mesh/v1/cluster")["nodes"] if n["name"] == name), None)


def load(host_port: str, stop: threading.Event, results: list, k: int) -> None:
    client = httpclient.InferenceServerClient(host_port, connection_timeout=30, network_timeout=30)
    i = k * 1_000_000
    while not stop.is_set():
        a, b = add_sub_inputs(i)
        ins = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
        ins[0].set_data_from_numpy(a)
        ins[1].set_data_from_numpy(b)
        try:
            r = client.infer("add_sub", ins)
            ok = np.array_equal(r.as_numpy("OUTPUT0"), a + b) and np.array_equal(r.as_numpy("OUTPUT1"), a - b)
            results.append(None if ok else f"request {i}: wrong answer")
        except Exception as e:  # noqa: BLE001 - every failure is asserted on
            results.append(f"request {i}: {type(e).__name__}: {e}")
        i += 1
    client.close()


def test_a_partitioned_host_leaves_routing_and_rejoins_with_no_failed_request(hosts):
    net, url = hosts
    before = node_view(url, "a")["incarnation"]
    stop, results = threading.Event(), []
    threads = [threading.Thread(target=load, args=(url.removeprefix("http://"), stop, results, k), daemon=True)
               for k in range(4)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: len(results) >= 300, 60, "300 requests before the partition")
        net.hosts["a"].cut()
        t0 = time.monotonic()
        wait_until(lambda: node_view(url, "a")["state"] != "up", 15, "node a to leave routing", 0.01)
        took = time.monotonic() - t0
        print(f"\nthe partitioned host left routing {took * 1000:.0f} ms after its link went down")
        at_cut = len(results)
        wait_until(lambda: len(results) >= at_cut + 300, 60, "300 requests during the partition")
        net.hosts["a"].heal()
        wait_until(lambda: (n := node_view(url, "a")) and n["state"] == "up", 30, "node a to rejoin")
        at_heal = len(results)
        wait_until(lambda: len(results) >= at_heal + 300, 60, "300 requests after the heal")
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    failures = [r for r in results if r is not None]
    print(f"{len(results)} requests, {len(failures)} failed")
    assert not failures, failures[:10]
    assert node_view(url, "a")["incarnation"] == before, "the same process rejoined after the partition"
    assert took < 10, f"node a left routing only after {took:.1f}s"
