"""The cluster port against intruders and hostile input: nodes with certificates from another CA (or
none) cannot join while a good node does; garbage UDP datagrams to the router's cluster port and
to a node's own cluster socket leave both serving; the router and a joining node refuse to run
without certificates unless told --cluster-insecure-dev; with that flag on both sides a node
joins and serves."""
import random
import re
import socket
import subprocess
import time

import numpy as np
import pytest
import tritonclient.http as httpclient

from cluster_util import ClusterCerts, add_sub_inputs, copy_models, free_udp_port, log_has, wait_until
from mesh_util import HOST, free_ports

pytestmark = [pytest.mark.server, pytest.mark.cluster]


@pytest.fixture(scope="module")
def add_sub_only(models_dir, tmp_path_factory):
    return copy_models(models_dir / "simple", tmp_path_factory.mktemp("sec") / "repo", ["add_sub"])


@pytest.fixture(scope="module")
def other_ca(cluster_bins, tmp_path_factory):
    """A second CA, unknown to the cluster."""
    return ClusterCerts(cluster_bins["ops"], tmp_path_factory.mktemp("other-ca"))


def infer_ok(url, i=7):
    c = httpclient.InferenceServerClient(url, network_timeout=30)
    try:
        a, b = add_sub_inputs(i)
        ins = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
        ins[0].set_data_from_numpy(a)
        ins[1].set_data_from_numpy(b)
        r = c.infer("add_sub", ins)
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)
    finally:
        c.close()


def test_nodes_without_a_certificate_of_the_cluster_ca_cannot_join(cluster_factory, cluster_certs, other_ca,
                                                                   add_sub_only):
    c = cluster_factory()
    c.start_router()
    c.start_node("good", [add_sub_only])
    # each intruder dials from a known UDP port, so the router's refusals can be told apart
    port = {name: free_udp_port() for name in ("stranger", "anonymous", "forged")}
    bind = lambda name: ["--cluster-bind", f"{HOST}:{port[name]}"]
    # everything from another CA: the node does not trust the router, nor the router the node
    c.start_node("stranger", [add_sub_only], bind("stranger"), certs=other_ca, joined=False)
    # no certificate at all (development mode) against a router that requires one
    c.start_node("anonymous", [add_sub_only], bind("anonymous"), tls=False, joined=False)
    # trusts the cluster CA (and its own) and presents a certificate of another CA: the router itself
    # must refuse it (the node checks its own certificate against its --cluster-ca at startup)
    other_ca.issue("forged")
    bundle = other_ca.dir / "both-cas.pem"
    bundle.write_text((cluster_certs.dir / "ca.pem").read_text() + (other_ca.dir / "ca.pem").read_text())
    forged_tls = ["--cluster-ca", str(bundle),
                  "--cluster-cert", str(other_ca.dir / "forged.pem"), "--cluster-key", str(other_ca.dir / "forged.key")]
    c.start_node("forged", [add_sub_only], bind("forged"), tls_args=forged_tls, joined=False)

    # Each intruder dials, is refused and dials again (the first retry is after 100 ms): the refusals
    # below are waited for; during these 3 s and after, no intruder may be a member.
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        names = {n["name"] for n in c.view()["nodes"]}
        assert names == {"good"}, f"an intruder joined: {c.view()['nodes']}"
        time.sleep(0.1)
    refused = lambda name, why: log_has(c.router, rf"refused a cluster connection: {why}.*peer=127\.0\.0\.1:{port[name]}\b")
    for name in port:
        node = c.nodes[name]
        wait_until(lambda: log_has(node, r"cluster link down: .*(handshake failed|peer sent no certificates)"), 30,
                   lambda: f"{name} to log a refusal:\n{node.log_tail(20)}")
    # the stranger refuses the router's certificate; the router refuses the other two itself
    wait_until(lambda: log_has(c.nodes["stranger"], r"invalid peer certificate"), 30,
               lambda: f"the stranger to refuse the router's certificate:\n{c.nodes['stranger'].log_tail(20)}")
    wait_until(lambda: refused("anonymous", r"(?!aborted by peer).*peer sent no certificates"), 30,
               lambda: f"the router to refuse the anonymous node:\n{c.router.log_tail(30)}")
    wait_until(lambda: refused("forged", r"(?!aborted by peer).*invalid peer certificate"), 30,
               lambda: f"the router to refuse the forged certificate:\n{c.router.log_tail(30)}")
    assert {n["name"] for n in c.view()["nodes"]} == {"good"}, f"an intruder joined: {c.view()['nodes']}"
    assert {r["name"]: r["nodes"] for r in c.router.index()}["add_sub"] == ["good"]
    infer_ok(c.router.http_url)
    for name in port:
        node = c.nodes[name]
        assert node.running(), f"{name} keeps running and serving locally"
        infer_ok(node.http_url)
        assert not log_has(node, r"joined the cluster router="), f"{name} thinks it joined:\n{node.log_tail(20)}"


def garbage_datagrams(seed=1234):
    rnd = random.Random(seed)
    out = [b"", b"\x00", b"\xff" * 3, b"GET / HTTP/1.1\r\n\r\n", bytes(1200), b"\xff" * 1500]
    for _ in range(60):
        out.append(bytes(rnd.getrandbits(8) for _ in range(rnd.choice([1, 20, 64, 600, 1200, 1350, 1472]))))
    # QUIC-looking packets: long headers (Initial/Handshake/0-RTT/Retry, v1 and unknown versions)
    # with random connection ids and garbage payloads, and short headers with garbage
    for first in (0xC0, 0xD0, 0xE0, 0xF0, 0xC3):
        for version in (b"\x00\x00\x00\x01", b"\x1a\x2a\x3a\x4a", b"\x00\x00\x00\x00"):
            dcid = bytes(rnd.getrandbits(8) for _ in range(8))
            body = bytes(rnd.getrandbits(8) for _ in range(1180))
            out.append(bytes([first]) + version + bytes([8]) + dcid + bytes([8]) + dcid + body)
            out.append(bytes([first]) + version + bytes([255]) + body[:40])  # a connection id too long
    for _ in range(30):
        out.append(bytes([0x40 | rnd.getrandbits(6)]) + bytes(rnd.getrandbits(8) for _ in range(rnd.randint(1, 1200))))
    return out


def spray(port, datagrams, rounds=5):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _ in range(rounds):
            for d in datagrams:
                s.sendto(d, (HOST, port))
    finally:
        s.close()


def test_garbage_datagrams_leave_router_and_node_serving(cluster_factory, add_sub_only):
    c = cluster_factory()
    c.start_router()
    bind_port = free_udp_port()
    node = c.start_node("n1", [add_sub_only], ["--cluster-bind", f"{HOST}:{bind_port}"])
    incarnation = c.node_info("n1")["incarnation"]
    datagrams = garbage_datagrams()
    spray(c.router.cluster_port, datagrams)
    spray(bind_port, datagrams)
    time.sleep(0.5)
    assert c.router.running() and node.running()
    for i in range(20):
        infer_ok(c.router.http_url, i)
    infer_ok(node.http_url)
    info = c.node_info("n1")
    assert info["state"].lower() == "up" and info["incarnation"] == incarnation, \
        f"the node's link survived: {info}"
    # the cluster port still takes new members
    c.start_node("n2", [add_sub_only])
    assert sorted(n["name"] for n in c.view()["nodes"]) == ["n1", "n2"]


def run_briefly(cmd, env, timeout=15):
    return subprocess.run([str(x) for x in cmd], capture_output=True, text=True, timeout=timeout, env=env)


def router_cmd(bins):
    h, g, m = free_ports(3)
    return [bins["router"], "--http-address", HOST, "--http-port", h, "--grpc-address", HOST, "--grpc-port", g,
            "--metrics-port", m, "--cluster-address", HOST, "--cluster-port", free_udp_port()]


def test_the_router_refuses_to_start_without_certificates(cluster_bins, server_env, cluster_certs):
    res = run_briefly(router_cmd(cluster_bins), server_env)
    assert res.returncode != 0, res
    text = res.stdout + res.stderr
    for flag in ("--cluster-ca", "--cluster-cert", "--cluster-key", "--cluster-insecure-dev"):
        assert flag in text, f"{flag} not named in:\n{text}"
    # a partial set is refused too, naming what is missing
    res = run_briefly(router_cmd(cluster_bins) + ["--cluster-ca", cluster_certs.dir / "ca.pem"], server_env)
    assert res.returncode != 0 and "--cluster-cert" in res.stdout + res.stderr and \
        "--cluster-key" in res.stdout + res.stderr, res


def test_a_joining_node_refuses_to_start_without_certificates(cluster_bins, server_env, add_sub_only):
    h, g, m = free_ports(3)
    cmd = [cluster_bins["node"], "--model-repository", add_sub_only, "--http-address", HOST, "--http-port", h,
           "--grpc-address", HOST, "--grpc-port", g, "--metrics-port", m, "--cluster-join", f"{HOST}:9"]
    res = run_briefly(cmd, server_env, timeout=60)
    assert res.returncode != 0, res
    text = res.stdout + res.stderr
    for flag in ("--cluster-ca", "--cluster-cert", "--cluster-key", "--cluster-insecure-dev"):
        assert flag in text, f"{flag} not named in:\n{text}"


def test_insecure_dev_on_both_sides_joins_and_serves(cluster_factory, add_sub_only):
    c = cluster_factory()
    c.start_router(tls=None)
    assert log_has(c.router, r"WITHOUT certificates"), "the development mode is logged loudly"
    c.start_node("dev", [add_sub_only], tls=False)
    assert log_has(c.nodes["dev"], r"WITHOUT certificates")
    for i in range(5):
        infer_ok(c.router.http_url, i)
    assert {r["name"]: r["nodes"] for r in c.router.index()}["add_sub"] == ["dev"]


def test_two_processes_under_one_node_name_do_not_flap(cluster_factory, cluster_certs, add_sub_only):
    """Node names must be unique: a second process joining under a live node's name replaces it, and
    the replaced process says so in its log and waits before dialing again (it used to push the other
    out every 100 ms, forever)."""
    from cluster_util import MeshNode
    c = cluster_factory()
    c.start_router()
    c.start_node("dup", [add_sub_only])
    first = c.view()
    twin = MeshNode(c.bins["node"], [add_sub_only],
                    cluster_certs.args("dup") + ["--cluster-join", c.router.cluster_addr],
                    c._log("dup-twin"), c.env, "dup", ["add_sub"])
    c._track(twin, "dup-twin")
    twin.start(["add_sub"], timeout=c.startup)
    old = c.nodes["dup"]
    wait_until(lambda: log_has(old, r"another process joined under this node's name"), 30,
               lambda: f"the replaced process to say so:\n{old.log_tail(20)}")
    assert log_has(old, r"names must be unique")
    joins = lambda: len(re.findall(r"node joined node=dup\b", c.router.log_tail(10_000)))  # noqa: E731
    before = wait_until(lambda: joins() if joins() >= 2 else None, 30, "both processes to have joined once")
    # The replaced process dials again only after its 10 s back-off: within 3 s at most one more join
    # (the flapping this guards against pushed the other out every 100 ms).
    time.sleep(3)
    assert joins() - before <= 1, f"the two processes keep replacing each other: {joins() - before} joins in 3 s"
    nodes = [n for n in c.view()["nodes"] if n["name"] == "dup"]
    assert len(nodes) == 1 and nodes[0]["state"] == "up", nodes
    assert first["nodes"][0]["incarnation"] != nodes[0]["incarnation"], "the newer process holds the name"
    infer_ok(c.router.http_url, 3)
