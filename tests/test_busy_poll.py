"""`--busy-poll-us`: between requests that come closer than the window, the async workers poll
their sockets instead of sleeping (crates/mesh/src/busy.rs). Sleeping shows as a voluntary context
switch of a worker thread, so over sequential requests a polling server's workers switch far less
often than once per request, and a server without the flag at least about once per request (its
workers sleep in epoll_wait between a Python client's requests).

The servers run one async worker (TOKIO_WORKER_THREADS=1), as a process started on a core of its own
does. With several workers each gets a spinner, but tokio may move spinners between workers, and a
worker left without one sleeps now and then (more often on a host whose CPUs are busy elsewhere)."""
import os
import subprocess

import numpy as np
import pytest
import tritonclient.http as httpclient
from cluster_util import add_sub_inputs, wait_until
from proc_util import voluntary_switches

REQUESTS = 200


def worker_switches(pid: int) -> int:
    """Voluntary context switches of the process's async worker threads, summed."""
    return voluntary_switches(pid, "tokio-rt-worker") or 0


def switches_over_requests(url: str, model: str, pid: int) -> int:
    """Worker switches of `pid` while one client sends REQUESTS requests, one after the other."""
    client = httpclient.InferenceServerClient(url)
    try:
        a, b = add_sub_inputs(0)
        inputs = [httpclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        client.infer(model, inputs)  # connection and model warm
        before = worker_switches(pid)
        for _ in range(REQUESTS):
            out = client.infer(model, inputs).as_numpy("OUTPUT0")
            np.testing.assert_array_equal(out, a + b)
        return worker_switches(pid) - before
    finally:
        client.close()


@pytest.mark.parametrize("busy", [False, True], ids=["sleeps", "polls"])
def test_a_node_with_busy_polling_does_not_sleep_between_close_requests(fresh_server, add_sub_repo, busy):
    args = ["--busy-poll-us", "50000"] if busy else []
    fresh_server.env = dict(fresh_server.env, TOKIO_WORKER_THREADS="1")
    srv = fresh_server([add_sub_repo], args, wait_models=["add_sub"])
    switches = switches_over_requests(srv.http_url, "add_sub", srv.proc.pid)
    if busy:
        assert switches < REQUESTS // 4, switches
        assert "busy polling" in srv.log_path.read_text(errors="replace")
    else:
        assert switches >= REQUESTS // 2, switches


def test_a_router_with_busy_polling_does_not_sleep_between_routed_requests(cluster_factory, models_dir):
    """Routed requests answer the same, and the router's workers stay awake between them: they read
    the node's answer and the client's next request without a wake-up."""
    c = cluster_factory()
    c.env = dict(c.env, TOKIO_WORKER_THREADS="1")
    router = c.start_router(args=["--busy-poll-us", "50000"])
    c.start_node("n1", [models_dir / "simple"], wait_models=["add_sub"])
    probe = httpclient.InferenceServerClient(router.http_url)
    try:
        wait_until(lambda: probe.is_model_ready("add_sub"), 30, "add_sub routable through the router")
    finally:
        probe.close()
    switches = switches_over_requests(router.http_url, "add_sub", router.proc.pid)
    assert switches < REQUESTS // 4, switches


def test_busy_poll_refuses_a_window_over_a_second(mesh_bin, tmp_path):
    r = subprocess.run([str(mesh_bin), "--model-repository", str(tmp_path), "--busy-poll-us", "2000000"],
                       capture_output=True, text=True, timeout=30, env=dict(os.environ))
    assert r.returncode != 0
    assert "--busy-poll-us" in r.stderr and "2000000" in r.stderr, r.stderr
