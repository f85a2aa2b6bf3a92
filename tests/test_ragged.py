"""Ragged batching through tritonclient, as Triton's model configuration documents it: requests
whose `allow_ragged_batch` input differs in length batch together, the ONNX model sees that input
flat with `batch_input`s describing the batch (element counts, offsets), and a `batch_output`
scattered in each request's input shape comes back to the request it belongs to.

The model (written here with onnx.helper) doubles the flat input, and returns each batch input once
per request, so every request shows the whole batch it ran in."""
import queue
import threading
from functools import partial

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper

from cluster_util import wait_until

pytestmark = [pytest.mark.server]

CONFIG = """
name: "ragged"
backend: "onnxruntime"
max_batch_size: 16
input [ { name: "RAGGED_INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
batch_input [
  { kind: BATCH_ELEMENT_COUNT target_name: "COUNT" data_type: TYPE_FP32 source_input: "RAGGED_INPUT" },
  { kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO target_name: "OFFSET" data_type: TYPE_FP32
    source_input: "RAGGED_INPUT" }
]
output [
  { name: "DOUBLED" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "COUNTS" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "OFFSETS" data_type: TYPE_FP32 dims: [ -1 ] }
]
batch_output [ { target_name: "DOUBLED" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "RAGGED_INPUT" } ]
dynamic_batching { max_queue_delay_microseconds: 300000 }
"""

# The same model, whose batch runs once four requests are queued (30 s is only the hang guard).
CONFIG_OF_FOUR = CONFIG.replace('name: "ragged"', 'name: "ragged_four"').replace(
    "dynamic_batching { max_queue_delay_microseconds: 300000 }",
    "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 30000000 }")


def ragged_onnx() -> bytes:
    flat = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [-1])  # noqa: E731
    table = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [-1, -1])  # noqa: E731
    const = lambda name, v: helper.make_node(  # noqa: E731
        "Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, [2], v))
    nodes = [
        helper.make_node("Add", ["RAGGED_INPUT", "RAGGED_INPUT"], ["DOUBLED"]),
        const("row", [1, -1]), const("column", [-1, 1]),
        # One row of ones per request (COUNT has one element per request) ...
        helper.make_node("Div", ["COUNT", "COUNT"], ["ones"]),
        helper.make_node("Reshape", ["ones", "column"], ["per_request"]),
        # ... times the batch input as a row: every request gets the whole batch input.
        helper.make_node("Reshape", ["COUNT", "row"], ["count_row"]),
        helper.make_node("MatMul", ["per_request", "count_row"], ["COUNTS"]),
        helper.make_node("Reshape", ["OFFSET", "row"], ["offset_row"]),
        helper.make_node("MatMul", ["per_request", "offset_row"], ["OFFSETS"]),
    ]
    graph = helper.make_graph(nodes, "ragged", [flat("RAGGED_INPUT"), flat("COUNT"), flat("OFFSET")],
                              [flat("DOUBLED"), table("COUNTS"), table("OFFSETS")])
    model = helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


@pytest.fixture
def ragged_server(fresh_server, tmp_path):
    for name, config in (("ragged", CONFIG), ("ragged_four", CONFIG_OF_FOUR)):
        d = tmp_path / "repo" / name
        (d / "1").mkdir(parents=True)
        (d / "1" / "model.onnx").write_bytes(ragged_onnx())
        (d / "config.pbtxt").write_text(config)
    return fresh_server([tmp_path / "repo"])


def ragged_input(n: int):
    x = grpcclient.InferInput("RAGGED_INPUT", [1, n], "FP32")
    x.set_data_from_numpy(np.arange(1, n + 1, dtype=np.float32).reshape(1, n))
    return [x]


def test_requests_of_different_lengths_run_as_one_ragged_batch(ragged_server):
    """ragged_four runs its batch once four requests are queued, so the four form one batch however
    long they take to arrive."""
    client = grpcclient.InferenceServerClient(ragged_server.grpc_url)
    answers = queue.Queue()
    client.start_stream(callback=partial(lambda q, result, error: q.put(error or result), answers))
    sizes = [2, 4, 1, 3]
    try:
        for i, n in enumerate(sizes):
            client.async_stream_infer("ragged_four", ragged_input(n), request_id=str(i))
        results = {}
        for _ in sizes:
            r = answers.get(timeout=30)
            assert not isinstance(r, Exception), r
            results[int(r.get_response().id)] = r
    finally:
        client.stop_stream()
    # The stream's requests run side by side, so they may join the batch in any order: the batch
    # inputs describe the batch as it ran, the same for every request of it.
    counts = results[0].as_numpy("COUNTS")
    assert sorted(counts[0].tolist()) == sorted(sizes), counts
    np.testing.assert_array_equal(results[0].as_numpy("OFFSETS"), [[0, *np.cumsum(counts[0]).tolist()]])
    for i, n in enumerate(sizes):
        r = results[i]
        doubled = r.as_numpy("DOUBLED")
        assert doubled.shape == (1, n), "a scattered output takes the shape of its request's input"
        np.testing.assert_array_equal(doubled, 2 * np.arange(1, n + 1, dtype=np.float32).reshape(1, n))
        np.testing.assert_array_equal(r.as_numpy("COUNTS"), counts)
        np.testing.assert_array_equal(r.as_numpy("OFFSETS"), results[0].as_numpy("OFFSETS"))
    stats = lambda: client.get_inference_statistics("ragged_four", as_json=True)["model_stats"][0]  # noqa: E731
    # Statistics are recorded as each request ends, which may be just after its answer went out.
    wait_until(lambda: int(stats()["inference_count"]) == 4, 30, lambda: f"four requests counted: {stats()}")
    assert int(stats()["execution_count"]) == 1, "the four lengths batched together"


def test_a_request_alone_sees_a_batch_of_one(ragged_server):
    client = grpcclient.InferenceServerClient(ragged_server.grpc_url)
    r = client.infer("ragged", ragged_input(3))
    np.testing.assert_array_equal(r.as_numpy("DOUBLED"), [[2, 4, 6]])
    np.testing.assert_array_equal(r.as_numpy("COUNTS"), [[3]])
    np.testing.assert_array_equal(r.as_numpy("OFFSETS"), [[0, 3]])


def test_clients_cannot_send_the_batch_inputs(ragged_server):
    client = grpcclient.InferenceServerClient(ragged_server.grpc_url)
    count = grpcclient.InferInput("COUNT", [1, 1], "FP32")
    count.set_data_from_numpy(np.ones((1, 1), np.float32))
    with pytest.raises(Exception, match="COUNT"):
        client.infer("ragged", ragged_input(2) + [count])


def test_concurrent_http_clients_of_mixed_lengths_each_get_their_own_rows(ragged_server):
    import tritonclient.http as httpclient

    sizes = [5, 1, 7, 2, 3, 6]
    out, errors = {}, []

    def one(n):
        try:
            c = httpclient.InferenceServerClient(ragged_server.http_url)
            x = httpclient.InferInput("RAGGED_INPUT", [1, n], "FP32")
            x.set_data_from_numpy(np.full((1, n), n, np.float32))
            out[n] = c.infer("ragged", [x]).as_numpy("DOUBLED")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(n,)) for n in sizes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    for n in sizes:
        np.testing.assert_array_equal(out[n], np.full((1, n), 2 * n, np.float32))
