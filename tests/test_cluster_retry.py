"""The router's retry rules when a node dies under a request that is running (and a clean drain
when it is stopped with SIGTERM instead): an idempotent request
is run again on another node and succeeds; a model whose config says mesh.idempotent "false" is not
run again (the client gets an error, the other node never sees it); a decoupled stream that already
answered is not restarted elsewhere (the client gets an error, no tick from a new start).
Two nodes serve the same Python models; the one running the request is found in the router's view
(its in-flight count) and killed with SIGKILL, then restarted for the next test. The sleeping requests
sleep until the test opens their gate (a file named by the request parameter `gate`), at most SLEEP_MS:
whatever the machine's load, the kill or SIGTERM lands while the request runs."""
import queue
import signal
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from cluster_util import GATED_SLEEP, copy_models, log_has, wait_until
from mesh_util import metric_sum, parse_metrics

pytestmark = [pytest.mark.server, pytest.mark.cluster]

PY_MODELS = Path(__file__).parent / "python_models"
PY_ARGS = ["--backend-config", f"python,interpreter={sys.executable}",
           "--backend-config", "python,execute-timeout-seconds=30"]
# Time for a node to finish its requests after SIGTERM: far more than the test needs to open a gate.
NODE_ARGS = PY_ARGS + ["--exit-timeout-secs", "120"]
NODES = ["p1", "p2"]
# A gated request's longest sleep (a hang guard: the test opens the gate); below the execute timeout.
SLEEP_MS = 20_000


@pytest.fixture(scope="module")
def cluster(module_cluster_factory, tmp_path_factory):
    repo = copy_models(PY_MODELS, tmp_path_factory.mktemp("retry") / "repo", ["sleep_py", "ticker_py"])
    copy_models(PY_MODELS, repo, ["sleep_py"], rename={"sleep_py": "sleep_once"})
    for name in ("sleep_py", "sleep_once"):
        (repo / name / "1" / "model.py").write_text(GATED_SLEEP)
    cfg = repo / "sleep_once" / "config.pbtxt"
    cfg.write_text(cfg.read_text() + 'parameters { key: "mesh.idempotent" value { string_value: "false" } }\n')
    c = module_cluster_factory("cl-retry")
    c.start_router()
    for name in NODES:
        c.start_node(name, [repo], NODE_ARGS)
    return c


@pytest.fixture
def gate(tmp_path):
    """A gate file for gated sleep requests: opened (created) by the test, and at the end anyway."""
    path = tmp_path / "gate"
    yield path
    path.touch()


@pytest.fixture
def both_up(cluster):
    """Both nodes up (a node killed by an earlier test is started again)."""
    for name in NODES:
        if not cluster.nodes[name].running():
            cluster.restart(name, kill=True)
    return cluster


def stats(cluster, node, model):
    c = httpclient.InferenceServerClient(cluster.nodes[node].http_url)
    try:
        s = c.get_inference_statistics(model)["model_stats"][0]["inference_stats"]
        return int(s["success"]["count"]), int(s["fail"]["count"])
    finally:
        c.close()


def runner(cluster, timeout=60):
    """The node the router has a request in flight on."""
    def find():
        busy = [n["name"] for n in cluster.view()["nodes"] if n["inflight"] > 0 and n["state"].lower() == "up"]
        return busy[0] if len(busy) == 1 else None
    return wait_until(find, timeout, "a node with the request in flight", 0.02)


def retries(cluster):
    return metric_sum(parse_metrics(cluster.router.metrics()), "mesh_router_retries_total") or 0


def sleep_inputs(x, ms=SLEEP_MS):
    ins = [httpclient.InferInput("X", [1], "FP32"), httpclient.InferInput("MS", [1], "INT32")]
    ins[0].set_data_from_numpy(np.array([x], np.float32))
    ins[1].set_data_from_numpy(np.array([ms], np.int32))
    return ins


def kill_under_request(cluster, model, x, gate):
    """Sends one gated sleep request through the router, kills the node running it while it sleeps,
    then opens the gate (a run elsewhere ends at once); returns (the killed node, the other node, the
    other's counts before, the async result)."""
    http = httpclient.InferenceServerClient(cluster.router.http_url, network_timeout=120, concurrency=4)
    before = {n: stats(cluster, n, model) for n in NODES}
    pending = http.async_infer(model, sleep_inputs(x), parameters={"gate": str(gate)})
    victim = runner(cluster)
    other = next(n for n in NODES if n != victim)
    cluster.nodes[victim].kill()
    gate.touch()
    return victim, other, before[other], pending, http


def test_an_idempotent_request_lost_with_its_node_runs_again_elsewhere(both_up, gate):
    cluster = both_up
    r0 = retries(cluster)
    victim, other, other_before, pending, http = kill_under_request(cluster, "sleep_py", 41.0, gate)
    try:
        result = pending.get_result()
        assert result.as_numpy("Y")[0] == 41.0
    finally:
        http.close()
    ok, fail = stats(cluster, other, "sleep_py")
    assert ok - other_before[0] == 1, f"{other} ran the retried request"
    assert retries(cluster) - r0 >= 1


def test_a_non_idempotent_request_is_not_run_again_after_its_node_died(both_up, gate):
    cluster = both_up
    r0 = retries(cluster)
    victim, other, other_before, pending, http = kill_under_request(cluster, "sleep_once", 42.0, gate)
    try:
        with pytest.raises(InferenceServerException) as e:
            pending.get_result()
    finally:
        http.close()
    print(f"\nnon-idempotent request lost with {victim}: {e.value}")
    time.sleep(0.5)  # a wrong second run would be in flight there or (the gate is open) done
    assert cluster.node_info(other)["inflight"] == 0, cluster.node_info(other)
    assert stats(cluster, other, "sleep_once") == other_before, f"{other} must not run it again"
    assert retries(cluster) == r0
    assert "sleep_once" in str(e.value) or victim in str(e.value), str(e.value)


def test_a_stream_that_answered_is_not_restarted_on_another_node(both_up):
    cluster = both_up
    answers = queue.Queue()
    client = grpcclient.InferenceServerClient(cluster.router.grpc_url)
    client.start_stream(callback=partial(lambda q, result, error: q.put((result, error)), answers))
    try:
        before = {n: stats(cluster, n, "ticker_py") for n in NODES}
        t = grpcclient.InferInput("PERIOD_MS", [1], "INT32")
        t.set_data_from_numpy(np.array([20], np.int32))
        client.async_stream_infer("ticker_py", [t])
        ticks = []
        for _ in range(3):
            result, error = answers.get(timeout=30)
            assert error is None, error
            ticks.append(int(result.as_numpy("TICK")[0]))
        assert ticks == [0, 1, 2]
        victim = runner(cluster)
        other = next(n for n in NODES if n != victim)
        cluster.nodes[victim].kill()
        error = None
        while error is None:
            result, error = answers.get(timeout=30)
            if error is None:
                tick = int(result.as_numpy("TICK")[0])
                assert tick == ticks[-1] + 1, f"ticks {ticks} then {tick}: the stream started again"
                ticks.append(tick)
        print(f"\nstream on {victim} ended with: {error}")
        time.sleep(0.5)
        assert stats(cluster, other, "ticker_py") == before[other], f"{other} must not run the stream"
        with pytest.raises(queue.Empty):
            answers.get(timeout=0.5)
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


def test_sigterm_drains_a_node_while_its_running_request_finishes_there(both_up, gate):
    """SIGTERM on the node running a request: the router sends it nothing new (it shows 'draining'),
    the running request finishes on it with its answer (once the test opens its gate), then the
    router releases it and it exits."""
    cluster = both_up
    http = httpclient.InferenceServerClient(cluster.router.http_url, network_timeout=120, concurrency=4)
    try:
        r0 = retries(cluster)
        pending = http.async_infer("sleep_py", sleep_inputs(43.0), parameters={"gate": str(gate)})
        victim = runner(cluster)
        other = next(n for n in NODES if n != victim)
        other_before = stats(cluster, other, "sleep_py")
        node = cluster.nodes[victim]
        node.signal(signal.SIGTERM)
        wait_until(lambda: cluster.state(victim) == "draining", 30,
                   lambda: f"{victim} to drain: {cluster.node_info(victim)}")
        for k in range(3):  # new work goes to the other node meanwhile
            assert http.infer("sleep_py", sleep_inputs(float(k), ms=0)).as_numpy("Y")[0] == k
        assert node.running() and cluster.state(victim) == "draining", "still finishing its request"
        gate.touch()
        assert pending.get_result().as_numpy("Y")[0] == 43.0
        assert node.proc.wait(timeout=60) == 0
        assert log_has(node, r"the router released this node") and log_has(node, r"every router released")
        ok, fail = stats(cluster, other, "sleep_py")
        assert (ok - other_before[0], fail - other_before[1]) == (3, 0), "the drained request did not move"
        assert retries(cluster) == r0
    finally:
        http.close()


def test_a_streamed_request_gives_up_at_its_deadline_before_the_first_answer(both_up):
    """A request on a gRPC stream through the router must get its first answer within its `timeout`:
    sleep_py sleeps 3 s, the request allows 0.5 s, so the client gets a clear error long before the
    sleep ends (the router stops the stream, which cancels the request on the node)."""
    answers = queue.Queue()
    client = grpcclient.InferenceServerClient(both_up.router.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        x = grpcclient.InferInput("X", [1], "FP32")
        x.set_data_from_numpy(np.array([1.0], dtype=np.float32))
        ms = grpcclient.InferInput("MS", [1], "INT32")
        ms.set_data_from_numpy(np.array([3000], dtype=np.int32))
        t0 = time.monotonic()
        client.async_stream_infer("sleep_py", [x, ms], request_id="late", timeout=500_000)
        result, error = answers.get(timeout=20)
        took = time.monotonic() - t0
        print(f"\nstream gave up after {took * 1000:.0f} ms")
        assert result is None and error is not None, "a late stream must end with an error"
        # Without the deadline the sleep would be waited out and the request would succeed.
        assert "deadline passed before node" in str(error), str(error)
    finally:
        client.stop_stream()
        client.close()
