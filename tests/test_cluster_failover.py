"""Failover under load. A fresh cluster per test: a router and three nodes, add_sub served by n1 and n2
(two replicas) and mlp by n3. Eight client threads (half gRPC, half HTTP) send at least 2 000
add_sub requests through the router, each with its own inputs and each answer checked, while a
replica is killed (SIGKILL), frozen (SIGSTOP, then SIGCONT) or every node is restarted in turn
(SIGTERM). Every request must succeed with the right answer. The cluster runs the product's link
timings (keep-alive 150 ms, idle timeout 750 ms); the time until a failed node leaves routing is
printed (the design target is about 0.75 s, the QUIC idle timeout) and measured by benches/, and
only a hang guard is asserted: a loaded machine may take longer, and no request may fail meanwhile."""
import os
import signal
import threading
import time

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from cluster_util import PRODUCT_LINK, AddSubLoad, add_sub_inputs, copy_models, log_has, wait_until
from mesh_util import metric, metric_sum, parse_metrics

pytestmark = [pytest.mark.server, pytest.mark.cluster]

MIN_REQUESTS = 2000
CONCURRENCY = 8
# A hang guard on a failed node leaving routing (the target is ~0.75 s, printed; benches/ measures it).
LEAVE_ROUTING_GUARD_S = 60.0
# How long a request may wait for a replica (--route-wait-ms) in the tests where requests wait out a
# restart: far longer than a restart takes on a loaded machine, so waiting is never what fails them.
LONG_ROUTE_WAIT_MS = 60_000


@pytest.fixture(scope="module")
def repos(models_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("failover")
    return {"add_sub": copy_models(models_dir / "simple", tmp / "add_sub", ["add_sub"]),
            "mlp": copy_models(models_dir / "simple", tmp / "mlp", ["mlp"])}


def three_nodes(cluster_factory, repos, router_args=()):
    c = cluster_factory(link_args=PRODUCT_LINK)
    c.start_router([], router_args)
    c.start_node("n1", [repos["add_sub"]])
    c.start_node("n2", [repos["add_sub"]])
    c.start_node("n3", [repos["mlp"]])
    c.loads = []
    return c


@pytest.fixture
def cluster(cluster_factory, repos):
    c = three_nodes(cluster_factory, repos)
    yield c
    for load in c.loads:  # a failed test leaves no client thread running
        load.abort()


@pytest.fixture
def patient_cluster(cluster_factory, repos):
    """The same cluster, its router letting requests wait LONG_ROUTE_WAIT_MS for a replica."""
    return three_nodes(cluster_factory, repos, ["--route-wait-ms", str(LONG_ROUTE_WAIT_MS)])


def start_load(cluster) -> AddSubLoad:
    load = AddSubLoad(cluster.router, concurrency=CONCURRENCY, min_requests=MIN_REQUESTS)
    cluster.loads.append(load)
    return load.start()


def served(node, model="add_sub") -> int:
    """The node's own count of requests it ran for `model`."""
    c = httpclient.InferenceServerClient(node.http_url)
    try:
        return int(c.get_inference_statistics(model)["model_stats"][0]["inference_stats"]["success"]["count"])
    finally:
        c.close()


def router_counter(cluster, name, **labels) -> float:
    return metric_sum(parse_metrics(cluster.router.metrics()), name, **labels) or 0.0


def kill_mid_load(cluster, victim, how):
    """Starts the load, hits `victim` with `how` a third of the way, returns (load, seconds until the
    victim left routing)."""
    load = start_load(cluster)
    load.wait_done(MIN_REQUESTS // 3)
    assert served(cluster.nodes[victim]) > 0, f"{victim} took no traffic before the fault"
    how(cluster.nodes[victim])
    took = cluster.wait_not_routable(victim, timeout=LEAVE_ROUTING_GUARD_S)
    return load, took


def test_kill_9_of_a_replica_under_load(cluster):
    n2_before = served(cluster.nodes["n2"])
    load, took = kill_mid_load(cluster, "n1", lambda n: n.kill())
    print(f"\nn1 (SIGKILL) left routing {took * 1000:.0f} ms after the kill")
    at_detection = load.done
    load.wait_done(max(MIN_REQUESTS, at_detection + 300))
    load.stop()
    print(load.summary())
    m = parse_metrics(cluster.router.metrics())
    print("retries:", metric(m, "mesh_router_retries_total"), "failovers:", metric(m, "mesh_router_failovers_total"))
    load.assert_all_ok()
    assert cluster.state("n1") == "lost", cluster.node_info("n1")
    # the requests n1 had when it died were retried on n2 (not merely: nothing was in flight)
    assert (metric_sum(m, "mesh_router_retries_total") or 0) >= 1
    assert (metric_sum(m, "mesh_router_failovers_total") or 0) >= 1
    # everything answered after n1 left routing ran on n2 (less a few answers counted late)
    assert served(cluster.nodes["n2"]) - n2_before >= load.done - at_detection - CONCURRENCY
    rows = {r["name"]: r for r in cluster.router.index()}
    assert rows["add_sub"]["state"] == "READY"


def test_sigstop_of_a_replica_under_load_then_sigcont_rejoins(cluster):
    incarnation = cluster.node_info("n1")["incarnation"]
    pid = cluster.nodes["n1"].proc.pid
    load, took = kill_mid_load(cluster, "n1", lambda n: os.killpg(pid, signal.SIGSTOP))
    print(f"\nn1 (SIGSTOP) left routing {took * 1000:.0f} ms after it froze")
    try:
        assert cluster.state("n1") in ("lost", "silent"), cluster.node_info("n1")
        load.wait_done(load.done + 300)  # served by n2 alone meanwhile
    finally:
        os.killpg(pid, signal.SIGCONT)
    info = cluster.wait_joined("n1", timeout=60)
    assert info["incarnation"] == incarnation, "the same process came back, not a new one"
    before = served(cluster.nodes["n1"])
    wait_until(lambda: served(cluster.nodes["n1"]) > before + 20, 60, "n1 to get traffic again after SIGCONT")
    load.wait_done(MIN_REQUESTS)
    load.stop()
    print(load.summary())
    load.assert_all_ok()


def test_rolling_sigterm_restart_of_every_node_under_load(cluster):
    load = start_load(cluster)
    load.wait_done(200)
    for name in ["n1", "n2", "n3"]:
        node = cluster.nodes[name]
        old = cluster.node_info(name)["incarnation"]
        node.stop(grace=20)
        assert node.proc.returncode == 0, f"{name} exited with {node.proc.returncode} on SIGTERM"
        assert log_has(node, r"every router released this node"), f"{name} did not drain:\n{node.log_tail(20)}"
        # The router logs the release once its write returns, which may be after the node already left.
        wait_until(lambda: log_has(cluster.router, rf"drained node released node={name}\b"), 30,
                   lambda: f"the router to log that it released {name}")
        node.start(node.wait_models)
        info = cluster.wait_joined(name, not_incarnation=old, timeout=60)
        print(f"\n{name} restarted: incarnation {old} -> {info['incarnation']}")
        if name != "n3":
            wait_until(lambda: served(node) > 0, 60, f"the new {name} to get traffic")
        load.wait_done(load.done + 150)
    load.wait_done(MIN_REQUESTS)
    load.stop()
    print(load.summary())
    load.assert_all_ok()


def test_a_killed_node_restarted_under_its_name_rejoins_and_gets_traffic(cluster):
    """kill -9 n1, then a new n1 process: the router replaces the lost member with the new
    incarnation and routes to it, with nothing done to the router."""
    old = cluster.node_info("n1")["incarnation"]
    cluster.nodes["n1"].kill()
    took = cluster.wait_not_routable("n1", timeout=LEAVE_ROUTING_GUARD_S)
    print(f"\nn1 (SIGKILL, idle) left routing after {took * 1000:.0f} ms")
    assert cluster.state("n1") == "lost"
    cluster.nodes["n1"].start(cluster.nodes["n1"].wait_models)
    info = cluster.wait_joined("n1", not_incarnation=old, timeout=60)
    assert info["incarnation"] != old
    names = [n["name"] for n in cluster.view()["nodes"]]
    assert sorted(names) == ["n1", "n2", "n3"], "the new incarnation replaced the old entry"
    http = httpclient.InferenceServerClient(cluster.router.http_url)
    try:
        for i in range(40):
            a, b = add_sub_inputs(i)
            ins = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
            ins[0].set_data_from_numpy(a)
            ins[1].set_data_from_numpy(b)
            np.testing.assert_array_equal(http.infer("add_sub", ins).as_numpy("OUTPUT0"), a + b)
    finally:
        http.close()
    assert served(cluster.nodes["n1"]) > 0, "the new n1 took part of the traffic"
    assert router_counter(cluster, "mesh_router_requests_total", node="n1") > 0


def mlp_infer(client, k, **kw):
    x = np.full((1, 64), float(k % 7), np.float32)
    t = httpclient.InferInput("x", [1, 64], "FP32")
    t.set_data_from_numpy(x)
    return client.infer("mlp", [t], **kw)


def test_requests_wait_for_a_replica_while_the_only_node_restarts(patient_cluster):
    """mlp has one replica (n3). While n3 restarts (SIGTERM, new process) requests wait for it (the
    router's route wait, 60 s here: far longer than a restart) and succeed; with n3 gone for good a
    request fails at its own deadline (1 s), not at the route wait, with a clear error."""
    cluster = patient_cluster
    c = httpclient.InferenceServerClient(cluster.router.http_url, network_timeout=120)
    try:
        expected = {k: mlp_infer(c, k).get_response()["outputs"] for k in range(7)}
        errors, slowest, done, answered = [], 0.0, threading.Event(), [0]

        def keep_asking():
            nonlocal slowest
            client = httpclient.InferenceServerClient(cluster.router.http_url, network_timeout=120)
            k = 0
            try:
                while not done.is_set():
                    t0 = time.monotonic()
                    try:
                        out = mlp_infer(client, k).get_response()["outputs"]
                        if out != expected[k % 7]:
                            errors.append(f"request {k}: wrong answer")
                    except Exception as e:  # noqa: BLE001
                        errors.append(f"request {k}: {e}")
                    slowest = max(slowest, time.monotonic() - t0)
                    answered[0] += 1
                    k += 1
            finally:
                client.close()

        asker = threading.Thread(target=keep_asking, daemon=True)
        asker.start()
        wait_until(lambda: answered[0] >= 3, 60, "requests before the restart")
        cluster.restart("n3")
        at_rejoin = answered[0]
        wait_until(lambda: answered[0] >= at_rejoin + 3, 120, "requests after the restart")
        done.set()
        asker.join(120)
        assert not asker.is_alive(), "the asking thread did not finish"
        print(f"\nslowest mlp request across n3's restart: {slowest * 1000:.0f} ms")
        assert not errors, errors[:5]

        cluster.nodes["n3"].kill()
        cluster.wait_not_routable("n3")
        t0 = time.monotonic()
        with pytest.raises(InferenceServerException) as e:
            mlp_infer(c, 1, timeout=1_000_000)  # the request's own deadline: 1 s
        took = time.monotonic() - t0
        print(f"no replica: failed after {took * 1000:.0f} ms: {e.value}")
        assert "mlp" in str(e.value) and "n3" in str(e.value), str(e.value)
        assert e.value.status() in ("503", "504"), e.value.status()
        # Its own deadline (1 s) ended it, not the route wait (60 s): the bound tells them apart.
        assert took < LONG_ROUTE_WAIT_MS / 1000 / 2, f"failed only after {took:.1f}s"
    finally:
        c.close()


def test_a_request_waiting_for_a_replica_goes_as_soon_as_one_joins(patient_cluster):
    """mlp's only node (n3) restarts several times, each time with a request waiting for a replica;
    each request must be routed when the new n3 joins, not when the route wait (60 s here) runs out.
    The delay after the join is printed; the bound (half the route wait) only tells "went when the
    replica joined" from "waited the route wait out", whatever the machine's load."""
    cluster = patient_cluster
    bound = LONG_ROUTE_WAIT_MS / 1000 / 2
    stalls = []
    for cycle in range(6):
        node = cluster.nodes["n3"]
        old = cluster.node_info("n3")["incarnation"]
        node.stop(grace=20)
        finished = {}

        def ask():
            c = httpclient.InferenceServerClient(cluster.router.http_url, network_timeout=60)
            try:
                mlp_infer(c, cycle)
                finished["ok"] = time.monotonic()
            except Exception as e:  # noqa: BLE001
                finished["error"] = str(e)
            finally:
                c.close()

        asker = threading.Thread(target=ask, daemon=True)
        asker.start()
        time.sleep(0.1)  # the request is (most likely) waiting for a replica now
        node.start(node.wait_models)
        cluster.wait_joined("n3", not_incarnation=old, interval=0.01)
        joined = time.monotonic()
        asker.join(LONG_ROUTE_WAIT_MS / 1000 + 60)
        assert not asker.is_alive(), "the waiting request never finished"
        assert "error" not in finished, finished
        stalls.append(finished["ok"] - joined)
        if stalls[-1] >= bound:
            break  # seen once: enough
    print("\nrequest done after the replica was routable (s):", [round(s, 3) for s in stalls])
    assert max(stalls) < bound, f"a waiting request stalled after its replica joined: {stalls}"


def test_a_node_stopped_with_sigterm_drains_and_leaves_the_cluster(cluster):
    """Each node in turn: SIGTERM, drain, release, exit 0, and shown as 'left' in the router's view (a
    goodbye, not a lost link; kept a while so requests for its models wait for it to come back rather
    than fail as unknown). Also prints how long each took to exit."""
    for name in ["n3", "n2", "n1"]:
        node = cluster.nodes[name]
        t0 = time.monotonic()
        node.stop(grace=20)
        print(f"\n{name} exited {time.monotonic() - t0:.2f}s after SIGTERM")
        assert node.proc.returncode == 0
        assert log_has(node, r"every router released this node") and log_has(node, r"left the cluster")
        # The router logs the release once its write returns, which may be after the node already left.
        wait_until(lambda: log_has(cluster.router, rf"drained node released node={name}\b"), 30,
                   lambda: f"the router to log that it released {name}")
        wait_until(lambda: (cluster.node_info(name) or {}).get("state") == "left", 30,
                   lambda: f"{name} to show as left in the router's view (it is {cluster.node_info(name)})")
    assert {n["name"]: n["state"] for n in cluster.view()["nodes"]} == {"n1": "left", "n2": "left", "n3": "left"}
    rows = cluster.router.index()
    assert rows and all(r["state"] == "UNAVAILABLE" and "left the cluster" in r.get("reason", "") for r in rows), rows
