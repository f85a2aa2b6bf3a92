"""Rollouts through the router (issue 59): a router placing model `ver` (a Python model whose every
answer says which version gave it: Y = 10 X + version) on two empty nodes, its config serving
version 1 (`version_policy: { specific: { versions: [1] } }`), rolled out to version 2 with
`POST /mesh/v1/models/ver/rollout` while eight client threads send checked requests that name no
version.

- A healthy candidate goes step by step (20, 50, 100 %) to promotion: every answer is correct for
  the version that gave it (its value and the response's model_version agree), nothing is lost, the
  share of version 2 in each step is within statistical bounds of the step's share, sequences keep
  one version from start to end, and a request that names a version gets it.
- A candidate that fails a fifth of its requests, and one five times slower, are rolled back by
  themselves; clients see no error (the candidate's failures are answered by version 1) and the
  reason is in `mesh-ops status`.
- A router with etcd, killed and started again twice: a rollout started on replicas the new router
  adopted places the candidate there, and one under way when the router dies goes on from the step
  it had reached, to promotion, with every answer right.
- Two routers sharing etcd, every request through the follower: the leader's guard judges on the
  follower's reported tallies alone and rolls a failing candidate back.
- Shadow traffic: a client whose key keeps it on version 1 gets only version 1's answers while every
  one of its requests is also sent to version 2; the router compares them (every one mismatched by
  exactly 1, version 2's answer being one more) and version 2 ran them.
"""
import json
import math
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from cluster_util import free_udp_port, wait_until
from etcd_util import Etcd, require_etcd
from mesh_util import metric_sum, parse_metrics
from test_cluster_placement import empty_node, ops, python_args, ready_nodes  # noqa: F401

pytestmark = [pytest.mark.server, pytest.mark.cluster]

MODEL = "ver"

CONFIG = """
name: "ver"
backend: "python"
max_batch_size: 0
input [ { name: "X", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "Y", data_type: TYPE_INT32, dims: [ 1 ] } ]
instance_group [ { count: 2, kind: KIND_CPU } ]
version_policy: { specific: { versions: [ 1 ] } }
"""

# Each version's model.py: Y = 10 X + version, after SLEEP_MS; every FAIL_EVERY-th X fails.
MODEL_PY = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils

SLEEP_MS = {sleep}
FAIL_EVERY = {fail}


class TritonPythonModel:
    def initialize(self, args):
        self.version = int(args["model_version"])

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            if SLEEP_MS:
                time.sleep(SLEEP_MS / 1000)
            if FAIL_EVERY and int(x[0]) % FAIL_EVERY == 0:
                err = pb_utils.TritonError("version %d failed X=%d" % (self.version, int(x[0])))
                out.append(pb_utils.InferenceResponse(error=err))
                continue
            y = (x * 10 + self.version).astype(np.int32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]))
        return out
"""


def make_repo(root: Path, v1=(0, 0), v2=(0, 0)) -> Path:
    """A repository with `ver`, each version's (sleep ms, fail every n-th) as given."""
    d = root / MODEL
    d.mkdir(parents=True)
    (d / "config.pbtxt").write_text(CONFIG)
    for v, (sleep, fail) in ((1, v1), (2, v2)):
        (d / str(v)).mkdir()
        (d / str(v) / "model.py").write_text(MODEL_PY.format(sleep=sleep, fail=fail))
    return root


def at(c):
    """The router of cluster `c` (the last one started), or `c` itself when it is a router."""
    return getattr(c, "router", None) or c


def rollout(c, body: dict | None = None) -> dict:
    """POSTs `body` to the router's rollout API of `ver` (GET without one)."""
    url = f"http://{at(c).http_url}/mesh/v1/models/{MODEL}/rollout"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if body is not None else "GET",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def version_ready(c, v: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{at(c).http_url}/v2/models/{MODEL}/versions/{v}/ready", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


class Load:
    """Eight threads of requests that name no version, each X unique; every answer is checked
    against the version that gave it and kept as (sent, answered, version, error)."""

    def __init__(self, url, threads: int = 8, sequences: int = 0, key: str | None = None):
        # The router's address, or a function giving it now (a router started again has new ports).
        self.url_of = url if callable(url) else (lambda: url)
        self.stop_, self.lock = threading.Event(), threading.Lock()
        self.params = {"rollout_key": key} if key else None
        self.done: list[tuple[float, float, int | None, str | None]] = []
        self.wrong: list[str] = []
        self.sequences: dict[int, set[str]] = {}
        self.next_x = 1
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(threads)]
        self.seq_stop = threading.Event()
        self.seq_threads = [threading.Thread(target=self.sequence, args=(1000 + i,), daemon=True)
                            for i in range(sequences)]
        for t in self.threads + self.seq_threads:
            t.start()

    def x(self) -> int:
        with self.lock:
            self.next_x += 1
            return self.next_x

    def infer(self, client, x: int, version: str = "", **kwargs):
        inp = httpclient.InferInput("X", [1], "INT32")
        inp.set_data_from_numpy(np.array([x], dtype=np.int32))
        r = client.infer(MODEL, [inp], model_version=version, **kwargs)
        got, v = int(r.as_numpy("Y")[0]), int(r.get_response()["model_version"])
        if got != 10 * x + v or v not in (1, 2):
            with self.lock:
                self.wrong.append(f"X={x}: Y={got} from version {v}")
        return v

    def run(self) -> None:
        client, at = None, None
        while not self.stop_.is_set():
            if self.url_of() != at:
                at = self.url_of()
                client = httpclient.InferenceServerClient(at, network_timeout=60)
            x, sent = self.x(), time.monotonic()
            try:
                v, err = self.infer(client, x, parameters=self.params), None
            except Exception as e:  # noqa: BLE001 (every failure is recorded and fails the test)
                v, err = None, str(e)
            with self.lock:
                self.done.append((sent, time.monotonic(), v, err))

    def sequence(self, sid: int) -> None:
        """Sequences of 20 requests each; the versions each one got."""
        client = httpclient.InferenceServerClient(self.url_of(), network_timeout=60)
        while not self.stop_.is_set() and not self.seq_stop.is_set():
            sid += 100
            got = set()
            for i in range(20):
                flags = {"sequence_id": sid, "sequence_start": i == 0, "sequence_end": i == 19}
                try:
                    got.add(str(self.infer(client, self.x(), **flags)))
                except Exception as e:  # noqa: BLE001
                    got.add(f"error: {e}")
                time.sleep(0.01)
            with self.lock:
                self.sequences[sid] = got

    def count(self) -> int:
        with self.lock:
            return len(self.done)

    def stop_sequences(self) -> None:
        """Lets each sequence thread finish the sequence it is in, and stop."""
        self.seq_stop.set()
        for t in self.seq_threads:
            t.join(60)

    def stop(self) -> None:
        self.stop_.set()
        for t in self.threads + self.seq_threads:
            t.join(60)


class Shares:
    """Polls the rollout's share: the moments each share began."""

    def __init__(self, c):
        self.c, self.stop_, self.changes = c, threading.Event(), []
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self) -> None:
        last = None
        while not self.stop_.is_set():
            now = rollout(self.c)
            key = (now["share"], now["state"])
            if key != last:
                self.changes.append((time.monotonic(), now["share"], now["state"]))
                last = key
            time.sleep(0.02)

    def stop(self) -> None:
        self.stop_.set()
        self.t.join(30)


@pytest.fixture
def cluster(cluster_factory):
    def start(repo: Path):
        c = cluster_factory()
        c.start_router([repo], ["--load-timeout-ms", "60000"])
        for name in ("n1", "n2"):
            empty_node(c, name)
        wait_until(lambda: version_ready(c, 1), 90, "version 1 of ver placed and ready")
        return c
    return start


def start_rollout(c, **guard) -> dict:
    """Starts the rollout held (paused) until both versions are placed and ready: resume() runs it,
    its first step starting then."""
    body = {"action": "start", "candidate": "2", "steps": [20, 50, 100], "min_step_seconds": 2,
            "min_step_requests": 150, "min_requests": 60, **guard}
    r = rollout(c, body)
    assert (r["serving"], r["candidate"], r["state"], r["share"]) == ("1", "2", "running", 20), r
    assert rollout(c, {"action": "pause"})["state"] == "paused"
    wait_until(lambda: version_ready(c, 2) and version_ready(c, 1), 90, "both versions placed for the rollout")
    return r


def resume(c) -> None:
    assert rollout(c, {"action": "resume"})["state"] == "running"


def router_metric(c, name: str, **labels) -> float:
    return metric_sum(parse_metrics(at(c).metrics()), name, **labels) or 0.0


def test_a_healthy_candidate_goes_step_by_step_to_promotion(cluster, tmp_path):
    c = cluster(make_repo(tmp_path / "repo"))
    start_rollout(c, max_p99_ratio=20.0)
    load = Load(c.router.http_url, sequences=2)
    resume(c)
    shares = Shares(c)
    try:
        # A request that names a version gets it, whatever the split (both are placed now).
        client = httpclient.InferenceServerClient(c.router.http_url)
        assert [load.infer(client, 7, version=v) for v in ("1", "2", "1")] == [1, 2, 1]
        # Sequences run until the last step: once promoted, version 1 is unloaded (the config's own
        # policy serves it only), and a sequence still on it would end with an error.
        wait_until(lambda: rollout(c)["share"] == 100, 120, lambda: f"the last step: {rollout(c)}")
        load.stop_sequences()
        wait_until(lambda: rollout(c)["state"] == "promoted" and load.count() >= 2000, 180,
                   lambda: f"promotion and 2000 requests: {rollout(c)}, {load.count()} done")
    finally:
        load.stop()
        shares.stop()
    errors = [d for d in load.done if d[3] is not None]
    assert not errors and not load.wrong, (errors[:5], load.wrong[:5])
    assert len(load.done) >= 2000
    # Step by step: 20, 50 then 100 % while running, then promoted.
    steps = [(share, state) for _, share, state in shares.changes]
    assert steps == [(20, "running"), (50, "running"), (100, "running"), (100, "promoted")], steps
    # Each step's split, from requests sent and answered well inside it (the poll's 20 ms and the
    # router's tick on either side), within five standard deviations of its share.
    bounds = [(t, share) for t, share, state in shares.changes if state == "running"]
    bounds.append((shares.changes[-1][0], None))
    for (begin, share), (end, _) in zip(bounds, bounds[1:]):
        inside = [v for sent, answered, v, _ in load.done if begin + 0.3 < sent and answered < end - 0.3]
        if share == 100:
            assert inside and all(v == 2 for v in inside), f"{share}%: {len(inside)} requests"
            continue
        n, p = len(inside), share / 100
        to_2 = sum(1 for v in inside if v == 2)
        sd = math.sqrt(n * p * (1 - p))
        assert n >= 50 and abs(to_2 - n * p) <= 5 * sd + 1, f"{share}%: {to_2} of {n} went to version 2"
    # Sequences never change version mid-sequence.
    assert load.sequences and all(len(v) == 1 and not next(iter(v)).startswith("error")
                                  for v in load.sequences.values()), load.sequences
    assert router_metric(c, "mesh_router_rollout_events_total", model=MODEL, event="advance") == 2
    assert router_metric(c, "mesh_router_rollout_events_total", model=MODEL, event="auto_promote") == 1
    assert router_metric(c, "nv_inference_request_success", model=MODEL, version="2") > 0
    assert router_metric(c, "mesh_router_rollout_share", model=MODEL) == 100
    status = ops(c, "status")
    assert status.returncode == 0 and "promoted" in status.stdout, status.stdout + status.stderr


@pytest.mark.parametrize("v2,guard,why", [
    ((0, 5), {}, "version 2 failed"),
    ((100, 0), {"max_p99_ratio": 2.0}, "p99 latency"),
], ids=["fails-a-fifth", "five-times-slower"])
def test_a_bad_candidate_is_rolled_back_and_clients_see_no_error(cluster, tmp_path, v2, guard, why):
    v1 = (20, 0) if v2[0] else (0, 0)
    c = cluster(make_repo(tmp_path / "repo", v1=v1, v2=v2))
    start_rollout(c, **guard)
    load = Load(c.router.http_url)
    resume(c)
    try:
        wait_until(lambda: rollout(c)["state"] == "rolled_back", 120,
                   lambda: f"the rollback: {rollout(c)}, {load.count()} done")
        seen = time.monotonic()
        wait_until(lambda: sum(1 for d in load.done[-500:] if d[0] > seen + 0.3) >= 200, 60,
                   "200 requests sent after the rollback")
    finally:
        load.stop()
    errors = [d for d in load.done if d[3] is not None]
    assert not errors and not load.wrong, (len(errors), errors[:3], load.wrong[:3])
    r = rollout(c)
    assert r["share"] == 0 and why in r["reason"], r
    # After the rollback every request that names no version goes to version 1.
    last = [v for sent, _, v, _ in load.done if sent > seen + 0.3]
    assert last and set(last) == {1}, last
    if v2[1]:
        assert router_metric(c, "mesh_router_rollout_retries_total", model=MODEL) > 0
    assert router_metric(c, "mesh_router_rollout_events_total", model=MODEL, event="roll_back") == 1
    status = ops(c, "status")
    assert status.returncode == 0 and "rolled_back" in status.stdout and why in status.stdout, status.stdout


def bucket(key: str) -> int:
    """The router's split bucket of a client key (FNV-1a 64 of its bytes, modulo 10 000)."""
    h = 0xCBF29CE484222325
    for b in key.encode():
        h = ((h ^ b) * 0x100000001B3) & (2**64 - 1)
    return h % 10_000


@pytest.mark.parametrize("slow", [False, True], ids=["fast-candidate", "slow-candidate"])
def test_shadow_answers_are_compared_and_never_reach_a_client(cluster, tmp_path, slow):
    """With a candidate far slower than the requests come (200 ms a request, 4 instances in all),
    shadows are dropped once their own budget is full, and the clients are still answered."""
    want = 30 if slow else 300
    c = cluster(make_repo(tmp_path / "repo", v2=(200, 0) if slow else (0, 0)))
    start_rollout(c, shadow=100)  # held paused at 20 %: the split and the shadows run, nothing advances
    assert rollout(c)["shadow"] == 100
    key = next(k for k in (f"client-{i}" for i in range(100)) if bucket(k) >= 2_500)
    load = Load(c.router.http_url, key=key)
    try:
        wait_until(lambda: (rollout(c).get("shadow_results") or {}).get("compared", 0) >= want, 60,
                   lambda: f"{want} shadows compared: {rollout(c)}")
    finally:
        load.stop()
    errors = [d for d in load.done if d[3] is not None]
    assert not errors and not load.wrong, (errors[:3], load.wrong[:3])
    assert {v for _, _, v, _ in load.done} == {1}, "a shadow's answer reached the client"
    shadow = rollout(c)["shadow_results"]
    assert shadow["mismatched"] == shadow["compared"] and shadow["mismatch_rate"] == 1.0, shadow
    assert shadow["largest_abs_difference"] == {"Y": 1.0}, shadow
    assert shadow["failed"] == 0 and shadow["candidate_p99_ms"] > 0, shadow
    assert router_metric(c, "mesh_router_rollout_shadows_total", model=MODEL, outcome="mismatched") >= want
    if slow:
        # The clients outpace the candidate many times over: most shadows are dropped, none waits.
        assert shadow["dropped"] > shadow["compared"], shadow
    # Version 2 ran them (the nodes' own statistics).
    ran = 0
    for n in c.nodes.values():
        with urllib.request.urlopen(f"http://{n.http_url}/v2/models/{MODEL}/versions/2/stats", timeout=5) as r:
            ran += sum(s["inference_stats"]["success"]["count"] for s in json.loads(r.read())["model_stats"])
    assert ran >= shadow["compared"], (ran, shadow)


def test_the_leaders_guard_judges_on_a_followers_reports(cluster_factory, tmp_path):
    require_etcd()
    etcd = Etcd(tmp_path / "etcd", tmp_path / "etcd.log").start()
    try:
        repo = make_repo(tmp_path / "repo", v2=(0, 5))
        c = cluster_factory()
        ha = ["--etcd-endpoints", etcd.endpoint, "--etcd-lease-secs", "5", "--load-timeout-ms", "60000"]
        r1 = c.start_router([repo], ha + ["--router-name", "r1"], name="r1")
        wait_until(lambda: r1.view()["router"]["lead"]["role"] == "leader", 60, "r1 to lead")
        r2 = c.start_router([repo], ha + ["--router-name", "r2"], name="r2")
        wait_until(lambda: r2.view()["router"]["lead"]["role"] == "follower", 60, "r2 to follow")
        for name in ("n1", "n2"):
            c.start_node(name, [], ["--cluster-cache", str(tmp_path / f"{name}-cache"),
                                    "--cluster-join", r2.cluster_addr] + python_args(),
                         wait_models=[], join=r1.cluster_addr, joined=False)
        wait_until(lambda: version_ready(r1, 1) and version_ready(r2, 1), 90, "version 1 placed and ready")
        start_rollout(c)  # sent to the follower, made by the leader
        load = Load(r2.http_url)  # every request through the follower
        resume(c)
        try:
            wait_until(lambda: rollout(r1)["state"] == "rolled_back", 120,
                       lambda: f"the rollback: {rollout(r1)}, {load.count()} done")
        finally:
            load.stop()
        errors = [d for d in load.done if d[3] is not None]
        assert not errors and not load.wrong, (len(errors), errors[:3], load.wrong[:3])
        wait_until(lambda: "version 2 failed" in rollout(r2)["reason"], 30,
                   lambda: f"the follower to show the leader's rollback: {rollout(r2)}")
        # The leader decided on the follower's answers: it routed none itself.
        assert router_metric(r1, "mesh_router_rollout_events_total", model=MODEL, event="roll_back") == 1
        assert router_metric(r1, "nv_inference_request_success", model=MODEL) == 0
        assert router_metric(r2, "mesh_router_rollout_retries_total", model=MODEL) > 0
    finally:
        etcd.stop()


def test_a_router_killed_mid_rollout_leaves_it_where_it_was(cluster_factory, tmp_path):
    require_etcd()
    etcd = Etcd(tmp_path / "etcd", tmp_path / "etcd.log").start()
    try:
        c = cluster_factory()
        args = ["--etcd-endpoints", etcd.endpoint, "--etcd-lease-secs", "2", "--load-timeout-ms", "60000",
                "--router-name", "r1"]
        # A fixed cluster port, so that the nodes find the router started again.
        r1 = c.start_router([make_repo(tmp_path / "repo")], args, name="r1", cluster_port=free_udp_port())
        for name in ("n1", "n2"):
            empty_node(c, name)
        wait_until(lambda: len(ready_nodes(r1, MODEL)) == 2, 90, "version 1 placed and ready on both nodes")

        def restart():
            r1.kill()
            r1.start([], timeout=60)
            wait_until(lambda: r1.view()["router"]["lead"]["role"] == "leader", 60, "r1 to lead again")
            wait_until(lambda: len(ready_nodes(r1, MODEL)) == 2, 60, "both nodes back with the new router")

        # The new router adopts the replicas; the rollout it starts reaches them.
        restart()
        start_rollout(c, max_p99_ratio=20.0, min_step_seconds=3)
        load = Load(lambda: r1.http_url)
        resume(c)
        try:
            wait_until(lambda: rollout(c)["share"] == 50, 120, lambda: f"the second step: {rollout(c)}")
            # Killed mid-rollout: the next router goes on from the step it had reached.
            restart()
            r = rollout(c)
            assert (r["state"], r["share"]) in {("running", 50), ("running", 100), ("promoted", 100)}, r
            wait_until(lambda: rollout(c)["state"] == "promoted", 120, lambda: f"promotion: {rollout(c)}")
        finally:
            load.stop()
        # Every answer right for the version that gave it; failures only while no router ran, or
        # one just started had no node back yet (it knows no model then).
        assert not load.wrong, load.wrong[:3]
        answered = [v for _, _, v, err in load.done if err is None]
        assert 2 in answered and 1 in answered, "both versions answered"
        down = ("Connection refused", "connection closed", "unknown model: 'ver' is not found")
        assert all(any(d in err for d in down) for *_, err in load.done if err), \
            {err for *_, err in load.done if err}
    finally:
        etcd.stop()
