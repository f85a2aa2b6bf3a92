"""Prometheus metrics with Triton's names and labels, on a private server so
that counts are exact."""

import json
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from mesh_util import infer_path, json_input, metric, metric_sum, parse_metrics

pytestmark = [pytest.mark.server]

HTTP_BATCHES = [1, 2, 3]
GRPC_BATCHES = [1, 4]


@pytest.fixture(scope="module")
def metrics_server(server_factory, models_dir):
    srv = server_factory([models_dir / "simple"], name="metrics")
    yield srv
    srv.stop()


def _add_sub_inputs(mod, batch):
    a = np.full((batch, 16), 1.5, np.float32)
    b = np.full((batch, 16), 0.5, np.float32)
    ins = [mod.InferInput("INPUT0", [batch, 16], "FP32"), mod.InferInput("INPUT1", [batch, 16], "FP32")]
    ins[0].set_data_from_numpy(a)
    ins[1].set_data_from_numpy(b)
    return ins


@pytest.fixture(scope="module")
def traffic(metrics_server):
    """Send a known mix of requests once; return the metrics text after."""
    before = parse_metrics(metrics_server.metrics())
    assert not metric_sum(before, "nv_inference_request_success", model="add_sub", version="1")

    hc = httpclient.InferenceServerClient(metrics_server.http_url)
    gc = grpcclient.InferenceServerClient(metrics_server.grpc_url)
    try:
        for n in HTTP_BATCHES:
            out = hc.infer("add_sub", _add_sub_inputs(httpclient, n)).as_numpy("OUTPUT0")
            assert (out == 2.0).all()
        for n in GRPC_BATCHES:
            out = gc.infer("add_sub", _add_sub_inputs(grpcclient, n)).as_numpy("OUTPUT0")
            assert (out == 2.0).all()
        # one request that reaches add_sub and fails validation (wrong shape)
        bad = {"inputs": [json_input("INPUT0", np.zeros((1, 15), np.float32), "FP32"),
                          json_input("INPUT1", np.zeros((1, 15), np.float32), "FP32")]}
        assert metrics_server.post(infer_path("add_sub"), json.dumps(bad)).status == 400
        # one mlp request, to check that counts are per model
        x = np.zeros((2, 64), np.float32)
        inp = httpclient.InferInput("x", [2, 64], "FP32")
        inp.set_data_from_numpy(x)
        hc.infer("mlp", [inp])
    finally:
        hc.close()
        gc.close()

    # counters may be published a moment after the response
    want = len(HTTP_BATCHES) + len(GRPC_BATCHES)
    deadline = time.monotonic() + 10
    while True:
        samples = parse_metrics(metrics_server.metrics())
        done = metric_sum(samples, "nv_inference_request_success", model="add_sub", version="1") == want
        failed = metric_sum(samples, "nv_inference_request_failure", model="add_sub", version="1")
        if (done and failed) or time.monotonic() > deadline:
            return samples
        time.sleep(0.1)


def test_request_success_count(traffic):
    n = metric_sum(traffic, "nv_inference_request_success", model="add_sub", version="1")
    assert n == len(HTTP_BATCHES) + len(GRPC_BATCHES)
    assert metric_sum(traffic, "nv_inference_request_success", model="mlp", version="1") == 1


def test_request_failure_has_reason(traffic):
    found = metric(traffic, "nv_inference_request_failure", model="add_sub", version="1")
    assert found, "no nv_inference_request_failure sample for add_sub"
    assert all(lab.get("reason") for lab, _ in found), found
    assert sum(v for _, v in found) == 1


def test_inference_count_counts_batch_elements(traffic):
    n = metric_sum(traffic, "nv_inference_count", model="add_sub", version="1")
    assert n == sum(HTTP_BATCHES) + sum(GRPC_BATCHES)


def test_exec_count(traffic):
    # sequential requests and no dynamic batching for add_sub: one execution each
    n = metric_sum(traffic, "nv_inference_exec_count", model="add_sub", version="1")
    assert n == len(HTTP_BATCHES) + len(GRPC_BATCHES)


def test_request_duration_present(traffic):
    found = metric(traffic, "nv_inference_request_duration_us", model="add_sub", version="1")
    assert found, "no nv_inference_request_duration_us sample for add_sub"
    assert all(v >= 0 for _, v in found)


def test_unused_model_has_no_successes(traffic):
    assert not metric_sum(traffic, "nv_inference_request_success", model="auto_batched", version="1")


def test_metrics_content_type(metrics_server):
    from mesh_util import http_request
    r = http_request(metrics_server.metrics_port, "GET", "/metrics")
    assert r.status == 200
    assert r.header("content-type", "").startswith("text/plain")


def test_every_family_has_its_help_line(metrics_server, traffic):
    # As tritonserver's: a `# HELP` line before each family's `# TYPE` (a family without one came
    # first on /metrics now and then, and a reader that shows help texts shows nothing for it).
    lines = metrics_server.metrics().splitlines()
    typed = [line.split()[2] for line in lines if line.startswith("# TYPE ")]
    helped = {line.split()[2] for line in lines if line.startswith("# HELP ")}
    assert typed and "mesh_instance_restarts_total" in typed and "mesh_instance_ready" in typed
    assert [name for name in typed if name not in helped] == []
