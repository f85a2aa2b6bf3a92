"""Cluster identity is the certificate's (issue 24, item 2), with real processes: a router starts only
with a router certificate and a node only with a node certificate named as the node; a second
certificate for a live node's name cannot push that node out, and joins once the node is gone."""
import shutil
import signal
import time

import pytest

from cluster_util import MeshNode, log_has, wait_until
from mesh_util import HOST, free_ports
from test_cluster_security import add_sub_only, infer_ok, router_cmd, run_briefly  # noqa: F401 (fixture)

pytestmark = [pytest.mark.server, pytest.mark.cluster]


def tls(certs, name):
    d = certs.dir
    return ["--cluster-ca", d / "ca.pem", "--cluster-cert", d / f"{name}.pem", "--cluster-key", d / f"{name}.key"]


def test_each_binary_starts_only_with_a_certificate_of_its_role_and_name(cluster_bins, server_env, cluster_certs,
                                                                         add_sub_only):  # noqa: F811
    cluster_certs.issue("router", "router")
    cluster_certs.issue("node-a", "node")
    res = run_briefly(router_cmd(cluster_bins) + tls(cluster_certs, "node-a"), server_env)
    text = res.stdout + res.stderr
    assert res.returncode != 0, text
    assert "certificate 'node-a' is a node certificate; only a router certificate may serve" in text, text

    h, g, m = free_ports(3)
    node = [cluster_bins["node"], "--model-repository", add_sub_only, "--http-address", HOST, "--http-port", h,
            "--grpc-address", HOST, "--grpc-port", g, "--metrics-port", m, "--cluster-join", f"{HOST}:9"]
    res = run_briefly(node + tls(cluster_certs, "router"), server_env, timeout=60)
    text = res.stdout + res.stderr
    assert res.returncode != 0, text
    assert "certificate 'router' is a router certificate; only a node certificate may join" in text, text

    res = run_briefly(node + tls(cluster_certs, "node-a") + ["--node-name", "node-x"], server_env, timeout=60)
    text = res.stdout + res.stderr
    assert res.returncode != 0, text
    assert "--node-name 'node-x' is not the name in this node's certificate ('node-a')" in text, text


def test_a_second_certificate_cannot_take_a_live_nodes_name(cluster_factory, cluster_certs, add_sub_only,  # noqa: F811
                                                             tmp_path):
    c = cluster_factory()
    c.start_router()
    c.start_node("n1", [add_sub_only])
    first = next(n for n in c.view()["nodes"] if n["name"] == "n1")

    # Another certificate for n1 from the same CA: another key.
    second = tmp_path / "second"
    second.mkdir()
    for f in ("ca.pem", "ca.key"):
        shutil.copy(cluster_certs.dir / f, second / f)
    res = cluster_certs.ops_run("certs", "issue", str(second), "n1", "--role", "node")
    assert res.returncode == 0, res.stderr
    twin_tls = ["--cluster-ca", str(second / "ca.pem"), "--cluster-cert", str(second / "n1.pem"),
                "--cluster-key", str(second / "n1.key"), "--cluster-join", c.router.cluster_addr]
    twin = MeshNode(c.bins["node"], [add_sub_only], twin_tls, c._log("n1-twin"), c.env, "n1", ["add_sub"])
    c._track(twin, "n1-twin")
    twin.start(["add_sub"], timeout=c.startup)

    wait_until(lambda: log_has(twin, r"the router refused this node"), 30, "the twin to be refused")
    assert log_has(twin, r"held by a live member"), twin.log_tail(20)
    assert log_has(c.router, r"node name 'n1' is held by a live member"), c.router.log_tail(20)
    now = next(n for n in c.view()["nodes"] if n["name"] == "n1")
    assert (now["incarnation"], now["state"]) == (first["incarnation"], "up"), now
    assert not log_has(c.nodes["n1"], r"another process joined under this node's name")
    for i in range(3):
        infer_ok(c.router.http_url, i)

    # Once the live node is gone, the other certificate's holder may take the name (it dials again
    # after its refusal back-off, 10 s).
    c.nodes["n1"].proc.send_signal(signal.SIGKILL)
    c.nodes["n1"].proc.wait(10)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        nodes = [n for n in c.view()["nodes"] if n["name"] == "n1"]
        if nodes and nodes[0]["state"] == "up" and nodes[0]["incarnation"] != first["incarnation"]:
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"the second certificate never joined once n1 was gone: {c.view()['nodes']}")
    infer_ok(c.router.http_url, 5)
