"""`mesh-ops chaos relay` (issue 9's fault injection) on a real cluster link: a node joins its router
through the relay, and the relay's delay, loss and partitions reach the QUIC link as the commands on
its standard input say, while a second node serves the same model directly. The router prefers the
healthy node while the other's link is slow, and checked add_sub requests through the router keep
succeeding throughout. The cluster runs the product's link timings (idle timeout 750 ms): the time
until a cut node leaves routing is printed for benches/faults.py; only hang guards are asserted."""
import subprocess
import time

import pytest

from cluster_util import PRODUCT_LINK, AddSubLoad, copy_models, wait_until
from mesh_util import metric_sum, parse_metrics

pytestmark = [pytest.mark.server, pytest.mark.cluster]


class Relay:
    """One `mesh-ops chaos relay` process, driven through its standard input."""

    def __init__(self, ops_bin, target: str, *args):
        self.proc = subprocess.Popen([str(ops_bin), "chaos", "relay", "--listen", "127.0.0.1:0", "--target", target,
                                      "--seed", "7", *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, bufsize=1)
        first = self.proc.stdout.readline()
        assert first.startswith("relay 127.0.0.1:") and "seed=7" in first, first + self.proc.stderr.read()
        self.addr = first.split()[1]

    def tell(self, line: str) -> str:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def stats(self) -> dict[str, int]:
        return {k: int(v) for k, v in (kv.split("=") for kv in self.tell("stats").split())}

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def served(node) -> int:
    """The node's own count of add_sub requests it ran."""
    stats = node.get_json("/v2/models/add_sub/stats")
    return int(stats["model_stats"][0]["inference_stats"]["success"]["count"])


def rtt_ms(cluster, node: str) -> float:
    return (metric_sum(parse_metrics(cluster.router.metrics()), "mesh_router_link_rtt_us", node=node) or 0) / 1000


def cut_and_heal(c, load: AddSubLoad, direction: str, who: str) -> None:
    """Blocks the relayed link (`direction`: both, up or down) under `load` until node far leaves
    routing (the time is printed; benches/faults.py reads it), then unblocks it until far is back."""
    assert c.relay.tell(f"block {direction}") == f"ok blocked {direction}"
    took = c.wait_not_routable("far", timeout=60)  # a hang guard: the time is printed, not bounded
    print(f"\n{who} left routing {took * 1000:.0f} ms after the cut")
    load.wait_done(load.done + 200)
    assert c.relay.tell("unblock") == "ok unblocked"
    c.wait_joined("far", timeout=60)
    load.wait_done(600)


@pytest.fixture
def relayed(cluster_factory, models_dir, tmp_path):
    repo = copy_models(models_dir / "simple", tmp_path / "repo", ["add_sub"])
    c = cluster_factory(link_args=PRODUCT_LINK)
    c.start_router()
    relay = Relay(c.bins["ops"], c.router.cluster_addr)
    c.start_node("direct", [repo])
    c.start_node("far", [repo], join=relay.addr)
    c.relay = relay
    yield c
    relay.close()


def test_bad_settings_are_refused_at_start(cluster_bins):
    out = subprocess.run([str(cluster_bins["ops"]), "chaos", "relay", "--listen", "127.0.0.1:0", "--target",
                          "127.0.0.1:9", "--drop", "2"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "drop must be a probability" in out.stderr, out.stderr


def test_delay_loss_and_a_partition_reach_the_link_and_requests_keep_succeeding(relayed):
    c, relay = relayed, relayed.relay
    assert relay.tell("set delay_ms=40") == "ok"
    # Both ways: at least 80 ms round trip on the relayed link, and only there: the direct link's RTT
    # stays well below it (both estimates include the machine's own delays, so their difference shows
    # the relay's 80 ms, not an absolute bound on the direct link).
    rtts = lambda: f"far {rtt_ms(c, 'far')} ms, direct {rtt_ms(c, 'direct')} ms"  # noqa: E731
    wait_until(lambda: rtt_ms(c, "far") >= 75 and rtt_ms(c, "far") - rtt_ms(c, "direct") >= 60, 60,
               lambda: f"the far link's RTT to grow past the direct one's by the relay's delay ({rtts()})")
    print(f"\nlink RTTs with 80 ms on far's link: {rtts()}")
    # The router prefers the healthy node: the slow one holds each request 80 ms longer, so the router's
    # least-loaded pick sends it fewer (how many fewer depends on the machine's speed: only the order
    # is asserted).
    before = {n: served(c.nodes[n]) for n in ("far", "direct")}
    slow = AddSubLoad(c.router, concurrency=4, min_requests=400).start()
    slow.wait_done(400)
    slow.stop()
    slow.assert_all_ok()
    took = {n: served(c.nodes[n]) - before[n] for n in ("far", "direct")}
    print(f"\nwith 80 ms on far's link: {took}")
    assert took["direct"] > took["far"], took
    assert relay.tell("set delay_ms=0 drop=0.1 duplicate=0.05 reorder=0.05") == "ok"
    load = AddSubLoad(c.router, concurrency=4, min_requests=600).start()
    try:
        load.wait_done(300)
        # Cut the relayed node off in both directions: it leaves routing, requests go to the other.
        cut_and_heal(c, load, "both", "the partitioned node")
    finally:
        load.stop()
    print(load.summary())
    load.assert_all_ok()
    s = relay.stats()
    print("relay:", s)
    assert s["dropped"] > 0 and s["duplicated"] > 0 and s["reordered"] > 0 and s["blocked"] > 0, s
    assert relay.tell("block sideways").startswith("error: block takes up, down or both")


@pytest.mark.parametrize("direction", ["up", "down"])
def test_a_one_way_partition_takes_the_node_out_and_it_rejoins_as_itself(relayed, direction):
    """Only one direction blocked (the node's datagrams to the router, or the router's to the node):
    both ends stop hearing acknowledgements, the link times out, requests go to the other replica;
    unblocked, the same process rejoins."""
    c, relay = relayed, relayed.relay
    before = c.node_info("far")["incarnation"]
    load = AddSubLoad(c.router, concurrency=4, min_requests=600).start()
    try:
        load.wait_done(200)
        cut_and_heal(c, load, direction, f"one-way ({direction}) partition: the node")
    finally:
        load.stop()
    load.assert_all_ok()
    assert c.node_info("far")["incarnation"] == before, "the same process rejoins"
    assert relay.stats()["blocked"] > 0
