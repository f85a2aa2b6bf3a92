"""`--busy-poll-us`: between requests that come closer than the window, the async workers poll
their sockets instead of sleeping (crates/mesh/src/busy.rs): a spinner task per worker yields
through each window. The server counts the windows its spinners polled through
(`mesh_busy_poll_windows_total`): requests open them, and a server without the flag has no
spinners. Whether the workers then sleep less is the OS scheduler's business, and is measured in
benches/scheduling.py (voluntary context switches per request, with and without the flag)."""
import os
import subprocess

import numpy as np
import pytest
import tritonclient.http as httpclient
from cluster_util import add_sub_inputs, wait_until
from mesh_util import metric_sum, parse_metrics

REQUESTS = 200


def windows(server) -> float | None:
    """The server's count of busy-polling windows; None when it has no spinners."""
    return metric_sum(parse_metrics(server.metrics()), "mesh_busy_poll_windows_total")


def send_requests(url: str, model: str) -> None:
    """REQUESTS requests from one client, one after the other, each checked."""
    client = httpclient.InferenceServerClient(url)
    try:
        a, b = add_sub_inputs(0)
        inputs = [httpclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        for _ in range(REQUESTS):
            out = client.infer(model, inputs).as_numpy("OUTPUT0")
            np.testing.assert_array_equal(out, a + b)
    finally:
        client.close()


@pytest.mark.parametrize("busy", [False, True], ids=["sleeps", "polls"])
def test_a_node_with_busy_polling_polls_through_the_windows_its_requests_open(fresh_server, add_sub_repo, busy):
    args = ["--busy-poll-us", "50000"] if busy else []
    srv = fresh_server([add_sub_repo], args, wait_models=["add_sub"])
    before = windows(srv)
    send_requests(srv.http_url, "add_sub")
    after = windows(srv)
    if busy:
        assert "busy polling" in srv.log_path.read_text(errors="replace")
        assert after is not None and after > (before or 0), f"no window polled through: {before} -> {after}"
    else:
        assert after is None, f"a node without --busy-poll-us polled through {after} windows"


def test_a_router_with_busy_polling_polls_through_the_windows_of_routed_requests(cluster_factory, models_dir):
    """Routed requests answer the same, and the router's spinners poll through the windows they open."""
    c = cluster_factory()
    router = c.start_router(args=["--busy-poll-us", "50000"])
    c.start_node("n1", [models_dir / "simple"], wait_models=["add_sub"])
    probe = httpclient.InferenceServerClient(router.http_url)
    try:
        wait_until(lambda: probe.is_model_ready("add_sub"), 60, "add_sub routable through the router")
    finally:
        probe.close()
    before = windows(router) or 0
    send_requests(router.http_url, "add_sub")
    after = windows(router)
    assert after is not None and after > before, f"no window polled through: {before} -> {after}"


def test_busy_poll_refuses_a_window_over_a_second(mesh_bin, tmp_path):
    r = subprocess.run([str(mesh_bin), "--model-repository", str(tmp_path), "--busy-poll-us", "2000000"],
                       capture_output=True, text=True, timeout=30, env=dict(os.environ))
    assert r.returncode != 0
    assert "--busy-poll-us" in r.stderr and "2000000" in r.stderr, r.stderr
