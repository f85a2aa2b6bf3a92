"""Concurrent requests: each caller gets its own answer back, whatever the
server batches together (mlp has dynamic batching)."""

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

import gen_models
from mesh_util import binary_body, binary_input, http_request, infer_path, output_array, parse_infer_response

pytestmark = [pytest.mark.server]

W = gen_models.mlp_weights()


def _inputs(n_requests, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((int(rng.integers(1, 5)), gen_models.MLP_IN)).astype(np.float32)
            for _ in range(n_requests)]


@pytest.mark.http
def test_concurrent_http_mlp(main_server):
    xs = _inputs(48, 21)

    def call(x):
        h, raw = binary_input("x", x, "FP32")
        body, headers = binary_body({"inputs": [h], "parameters": {"binary_data_output": True}}, [raw])
        r = http_request(main_server.http_port, "POST", infer_path("mlp"), body, headers=headers)
        assert r.status == 200, r
        header, blobs = parse_infer_response(r)
        return output_array(header, blobs, "y")

    with ThreadPoolExecutor(8) as pool:
        ys = list(pool.map(call, xs))
    for x, y in zip(xs, ys):
        assert y.shape == (x.shape[0], gen_models.MLP_OUT)
        np.testing.assert_allclose(y, gen_models.mlp_reference(x, W), rtol=1e-4, atol=1e-5)


@pytest.mark.grpc
def test_concurrent_grpc_mlp(main_server):
    xs = _inputs(48, 22)
    client = grpcclient.InferenceServerClient(main_server.grpc_url)

    def call(x):
        inp = grpcclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        return client.infer("mlp", [inp]).as_numpy("y")

    try:
        with ThreadPoolExecutor(8) as pool:
            ys = list(pool.map(call, xs))
    finally:
        client.close()
    for x, y in zip(xs, ys):
        np.testing.assert_allclose(y, gen_models.mlp_reference(x, W), rtol=1e-4, atol=1e-5)


@pytest.mark.http
def test_concurrent_mixed_good_and_bad(main_server):
    """Bad requests interleaved with good ones do not disturb the good ones."""
    xs = _inputs(24, 23)

    def good(x):
        body = json.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                       "data": x.flatten().tolist()}]})
        r = http_request(main_server.http_port, "POST", infer_path("mlp"), body)
        assert r.status == 200, r
        header, blobs = parse_infer_response(r)
        np.testing.assert_allclose(output_array(header, blobs, "y"), gen_models.mlp_reference(x, W),
                                   rtol=1e-4, atol=1e-5)

    def bad(i):
        body = json.dumps({"inputs": [{"name": "x", "shape": [1, gen_models.MLP_IN + 1], "datatype": "FP32",
                                       "data": [0.0] * (gen_models.MLP_IN + 1)}]})
        r = http_request(main_server.http_port, "POST", infer_path("mlp"), body)
        assert r.status == 400, r

    with ThreadPoolExecutor(8) as pool:
        futs = [pool.submit(good, x) for x in xs] + [pool.submit(bad, i) for i in range(24)]
        for f in futs:
            f.result()
