"""Several routers over one cluster (issue 14): every node joins both routers, and exactly one of
them, elected through a real etcd, decides placement. The leader is killed under checked load on
both routers (the other router's clients see nothing, placement carries on from what etcd holds);
a frozen leader is deposed and stays so when it wakes (nodes refuse its epoch); etcd itself frozen:
routing goes on, placement changes wait and are answered so, nothing is lost."""
import json
import shutil
import signal
import time
import urllib.error
import urllib.request

import pytest

from cluster_util import AddSubLoad, copy_models, log_has, wait_until
from etcd_util import Etcd, require_etcd
from mesh_util import metric_sum, parse_metrics
from test_cluster_placement import FAST, check_add_sub, python_args

pytestmark = [pytest.mark.server, pytest.mark.cluster]

# The leader's etcd lease: long enough that a router or etcd stalled a moment by a loaded machine keeps it.
LEASE_S = 5
# The lease of the tests whose takeover times benches/faults.py gathers (etcd's minimum with its default
# timings): only they run with it, and they assert no time, only behaviour within a hang guard.
TIMED_LEASE_S = 2
# Hang guard on a takeover or a change reaching etcd and the other router (the measured time is
# printed; benches/results/faults-vm.md records it).
TAKEOVER_GUARD_S = 60.0
SETTLE_S = 30.0


@pytest.fixture
def etcd(tmp_path, request):
    require_etcd()
    e = Etcd(tmp_path / "etcd", tmp_path / "etcd.log").start()
    yield e
    e.stop()


def lead(router) -> dict:
    return router.view()["router"]["lead"]


def placement(router) -> dict:
    return {m["name"]: m for m in router.view()["placement"]["models"]}


def ready(router, model) -> set[str]:
    m = placement(router).get(model)
    return {r["node"] for r in m["replicas"] if r["state"] == "ready"} if m else set()


def scale(router, model, lo, hi) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://{router.http_url}/mesh/v1/models/{model}/scale",
                                 data=json.dumps({"min": lo, "max": hi}).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=15) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def two_routers(cluster_factory, models_dir, etcd, tmp_path, lease_s):
    """Routers r1 (started first: the leader) and r2 sharing etcd; nodes n1..n3 join both."""
    repo = copy_models(models_dir / "simple", tmp_path / "repo", ["add_sub"])
    c = cluster_factory()
    c.lease_s = lease_s
    c.loads = []
    ha = ["--etcd-endpoints", etcd.endpoint, "--etcd-lease-secs", str(lease_s)]
    c.r1 = c.start_router([repo], FAST + ha + ["--router-name", "r1"], name="r1")
    wait_until(lambda: lead(c.r1)["role"] == "leader", 60, lambda: f"r1 to lead: {lead(c.r1)}")
    c.r2 = c.start_router([repo], FAST + ha + ["--router-name", "r2"], name="r2")
    wait_until(lambda: lead(c.r2)["role"] == "follower", 60, lambda: f"r2 to follow: {lead(c.r2)}")
    assert lead(c.r2)["leader"] == "r1"
    for name in ("n1", "n2", "n3"):
        cache = tmp_path / f"{name}-cache"
        c.start_node(name, [], ["--cluster-cache", str(cache), "--cluster-join", c.r2.cluster_addr] + python_args(),
                     wait_models=[], join=c.r1.cluster_addr, joined=False)
    for r in (c.r1, c.r2):
        wait_until(lambda r=r: len(ready(r, "add_sub")) == 2, 60, lambda r=r: f"add_sub placed: {placement(r)}")
    return c


def routers_with_lease(cluster_factory, models_dir, etcd, tmp_path, lease):
    """`two_routers` for a fixture: the checked loads started on it are stopped at its end."""
    c = two_routers(cluster_factory, models_dir, etcd, tmp_path, lease)
    yield c
    for load in c.loads:
        load.abort()


@pytest.fixture
def pair(cluster_factory, models_dir, etcd, tmp_path):
    """Two routers and three nodes, the leader's lease LEASE_S."""
    yield from routers_with_lease(cluster_factory, models_dir, etcd, tmp_path, LEASE_S)


@pytest.fixture
def timed_pair(cluster_factory, models_dir, etcd, tmp_path):
    """The same with the short lease, TIMED_LEASE_S, for the tests whose takeover times are gathered."""
    yield from routers_with_lease(cluster_factory, models_dir, etcd, tmp_path, TIMED_LEASE_S)


def test_one_leader_places_and_a_follower_hands_changes_to_it(pair):
    c = pair
    epoch = lead(c.r1)["epoch"]
    assert epoch > 0, lead(c.r1)
    # Both routers serve; only the leader sent placement commands (nodes learned its epoch).
    check_add_sub(c.r1.http_url)
    check_add_sub(c.r2.http_url)
    wait_until(lambda: all(log_has(n, "this router leads placement now") for n in c.nodes.values()), SETTLE_S,
               "every node to learn the leader's epoch")
    assert lead(c.r2)["leader_http"] == c.r1.http_url
    # A change sent to the follower is made by the leader, and answered with the leader's answer.
    status, body = scale(c.r2, "add_sub", 1, 1)
    assert status == 200 and (body["min"], body["max"]) == (1, 1), (status, body)
    wait_until(lambda: (placement(c.r1)["add_sub"]["min"], placement(c.r1)["add_sub"]["max"]) == (1, 1), SETTLE_S,
               lambda: f"r1's bounds of add_sub: {placement(c.r1).get('add_sub')}")
    wait_until(lambda: len(ready(c.r1, "add_sub")) == 1, 60, lambda: f"one replica: {placement(c.r1)}")
    # The leader's errors come back as they are.
    status, body = scale(c.r2, "add_sub", 3, 2)
    assert status == 400 and "more than max" in body["error"], (status, body)
    # The follower shadows the intent the leader stored in etcd.
    wait_until(lambda: (placement(c.r2)["add_sub"]["min"], placement(c.r2)["add_sub"]["max"]) == (1, 1), SETTLE_S,
               lambda: f"r2's view of add_sub bounds: {placement(c.r2).get('add_sub')}")


def test_leader_killed_under_load_other_router_takes_over_and_carries_on(timed_pair):
    c = timed_pair
    assert scale(c.r1, "add_sub", 1, 3)[0] == 200
    on_r1 = AddSubLoad(c.r1, concurrency=4, min_requests=0)
    on_r2 = AddSubLoad(c.r2, concurrency=6, min_requests=1500)
    c.loads += [on_r1, on_r2]
    on_r1.start(), on_r2.start()
    on_r2.wait_done(300)
    epoch = lead(c.r1)["epoch"]
    c.r1.kill()
    killed = time.monotonic()
    on_r1.abort()  # its clients lose their router; they retry on the surviving one below
    wait_until(lambda: lead(c.r2)["role"] == "leader", TAKEOVER_GUARD_S, lambda: f"r2 to lead: {lead(c.r2)}")
    took = time.monotonic() - killed
    print(f"\ntakeover after kill -9 of the leader: {took:.2f}s (lease {c.lease_s}s)")
    assert lead(c.r2)["epoch"] > epoch
    check_add_sub(c.r2.http_url)  # a client of the killed router, retrying on r2
    # The new leader carries on from etcd: the bounds set on r1 (acknowledged once etcd held them)
    # hold, 1..3, not the default 2..4.
    wait_until(lambda: (placement(c.r2)["add_sub"]["min"], placement(c.r2)["add_sub"]["max"]) == (1, 3), SETTLE_S,
               lambda: f"the bounds set on r1, on r2: {placement(c.r2).get('add_sub')}")
    # And it places: the node of one replica dies, another gets it, the load never fails.
    holder = sorted(ready(c.r2, "add_sub"))[0]
    c.nodes[holder].kill()
    wait_until(lambda: holder not in ready(c.r2, "add_sub") and len(ready(c.r2, "add_sub")) >= 1, 60,
               lambda: f"add_sub re-placed: {placement(c.r2)}")
    on_r2.stop()
    print(f"clients of r2: {on_r2.summary()}; clients of r1 before the kill: {on_r1.summary()}")
    on_r2.assert_all_ok()


def test_frozen_leader_is_deposed_and_its_epoch_fenced(pair):
    c = pair
    load = AddSubLoad(c.r2, concurrency=4, min_requests=600)
    c.loads.append(load)
    load.start()
    old = lead(c.r1)["epoch"]
    c.r1.proc.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: lead(c.r2)["role"] == "leader", TAKEOVER_GUARD_S, lambda: f"r2 to lead: {lead(c.r2)}")
        new = lead(c.r2)["epoch"]
        assert new > old
        # Every node learns the new epoch before the old leader wakes.
        wait_until(lambda: all(log_has(n, rf"leads placement now.*epoch={new}|epoch={new}.*leads placement now")
                               for n in c.nodes.values()), SETTLE_S, "nodes fenced at the new epoch")
    finally:
        c.r1.proc.send_signal(signal.SIGCONT)
    # Awake, the old leader finds its lease gone and follows; it never acts at its old epoch again.
    wait_until(lambda: lead(c.r1)["role"] == "follower", TAKEOVER_GUARD_S, lambda: f"r1 to follow: {lead(c.r1)}")
    assert lead(c.r1)["leader"] == "r2"
    assert log_has(c.r1, "stopped leading placement")
    status, body = scale(c.r1, "add_sub", 1, 1)  # handed to r2, the leader now
    assert status == 200, body
    wait_until(lambda: (placement(c.r2)["add_sub"]["min"], placement(c.r2)["add_sub"]["max"]) == (1, 1), SETTLE_S,
               lambda: f"r2 applied the change sent to r1: {placement(c.r2).get('add_sub')}")
    load.stop()
    load.assert_all_ok()
    fenced = sum(metric_sum(parse_metrics(n.metrics()), "mesh_node_fenced_commands_total") or 0
                 for n in c.nodes.values())
    print(f"\ncommands of the deposed leader refused by nodes: {fenced}")


def test_etcd_unreachable_routing_goes_on_placement_waits(timed_pair, etcd):
    c = timed_pair
    assert scale(c.r1, "add_sub", 2, 2)[0] == 200  # no autoscaling: the replicas must stay as they are
    loads = [AddSubLoad(r, concurrency=3, min_requests=400) for r in (c.r1, c.r2)]
    c.loads += loads
    for load in loads:
        load.start()
    before = {r.name: ready(r, "add_sub") for r in (c.r1, c.r2)}
    etcd.freeze()
    frozen = time.monotonic()
    try:
        wait_until(lambda: lead(c.r1)["role"] == "unknown", TAKEOVER_GUARD_S,
                   lambda: f"r1 to stop leading: {lead(c.r1)}")
        print(f"\nthe leader stopped deciding {time.monotonic() - frozen:.2f}s after etcd froze")
        status, body = scale(c.r1, "add_sub", 1, 1)
        assert status == 503 and "etcd" in body["error"], body
        time.sleep(2)
        for r in (c.r1, c.r2):
            check_add_sub(r.http_url)
    finally:
        etcd.thaw()
    wait_until(lambda: "leader" in (lead(c.r1)["role"], lead(c.r2)["role"]), TAKEOVER_GUARD_S,
               lambda: f"a leader again: {lead(c.r1)} {lead(c.r2)}")
    leader = c.r1 if lead(c.r1)["role"] == "leader" else c.r2
    assert scale(leader, "add_sub", 2, 2)[0] == 200
    for load in loads:
        load.stop()
        load.assert_all_ok()
    # Nothing was re-placed while placement waited.
    assert {r.name: ready(r, "add_sub") for r in (c.r1, c.r2)} == before


def test_leader_stopped_gracefully_hands_placement_over_at_once(timed_pair):
    c = timed_pair
    load = AddSubLoad(c.r2, concurrency=4, min_requests=500)
    c.loads.append(load)
    load.start()
    load.wait_done(100)
    stopping = time.monotonic()
    c.r1.stop(grace=20)
    wait_until(lambda: lead(c.r2)["role"] == "leader", TAKEOVER_GUARD_S, lambda: f"r2 to lead: {lead(c.r2)}")
    print(f"\ntakeover after SIGTERM of the leader: {time.monotonic() - stopping:.2f}s (lease {c.lease_s}s)")
    assert log_has(c.r1, "handed placement leadership back")
    load.stop()
    load.assert_all_ok()
