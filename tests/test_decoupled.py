"""Decoupled Python models through tritonclient's gRPC stream: zero or more responses per request,
sent from execute() or from the model's threads, errors per response, cancellation seen by
is_cancelled(), and a clear error on the paths that can only carry one answer."""
import queue
import time
import shutil
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.server]

PY_MODELS = Path(__file__).parent / "python_models"
MODELS = ["repeat_py", "ticker_py", "add_sub_py", "bls_cancel_py"]


@pytest.fixture(scope="module")
def server(server_factory, tmp_path_factory):
    repo = tmp_path_factory.mktemp("decoupled") / "repo"
    for name in MODELS:
        shutil.copytree(PY_MODELS / name, repo / name)
    args = ["--backend-config", f"python,interpreter={sys.executable}",
            "--backend-config", "python,execute-timeout-seconds=30"]
    return server_factory([repo], args, name="decoupled", wait_models=MODELS)


class Stream:
    """A gRPC stream whose answers land in a queue."""

    def __init__(self, url):
        self.client = grpcclient.InferenceServerClient(url)
        self.answers = queue.Queue()
        self.client.start_stream(callback=partial(lambda q, result, error: q.put((result, error)), self.answers))

    def send(self, values, request_id="", model="repeat_py", **parameters):
        t = grpcclient.InferInput("IN", [len(values)], "INT32")
        t.set_data_from_numpy(np.array(values, np.int32))
        self.client.async_stream_infer(model, [t], request_id=request_id, parameters=parameters or None,
                                       enable_empty_final_response=True)

    def next(self, timeout=30):
        result, error = self.answers.get(timeout=timeout)
        if error is not None:
            return None, error
        return result, None

    def until_final(self):
        """Every answer of one request up to its empty final response: (outputs, errors)."""
        outputs, errors = [], []
        while True:
            result, error = self.next()
            if error is not None:
                errors.append(str(error))
                continue
            response = result.get_response()
            if response.parameters["triton_final_response"].bool_param and not response.outputs:
                return outputs, errors
            outputs.append((int(result.as_numpy("OUT")[0]), int(result.as_numpy("IDX")[0]), response.id))

    def close(self, cancel=False):
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


@pytest.fixture
def stream(server):
    s = Stream(server.grpc_url)
    yield s
    s.close()


@pytest.mark.parametrize("mode", ["inline", "thread"])
def test_one_request_gets_a_response_per_element_then_the_final_flag(stream, mode):
    stream.send([5, 6, 7], request_id="r1", mode=mode)
    outputs, errors = stream.until_final()
    assert errors == []
    assert outputs == [(5, 0, "r1"), (6, 1, "r1"), (7, 2, "r1")]


def test_zero_responses_is_only_the_final_flag(stream):
    stream.send([], request_id="none")
    assert stream.until_final() == ([], [])


def test_requests_on_one_stream_keep_their_ids(stream):
    stream.send([1, 2], request_id="a", mode="thread")
    stream.send([3], request_id="b", mode="thread")
    seen, finals = [], 0
    while finals < 2:
        result, error = stream.next()
        assert error is None, error
        response = result.get_response()
        if response.parameters["triton_final_response"].bool_param and not response.outputs:
            finals += 1
            continue
        seen.append((response.id, int(result.as_numpy("OUT")[0])))
    assert sorted(seen) == [("a", 1), ("a", 2), ("b", 3)]


def test_an_error_response_fails_only_that_answer(stream):
    stream.send([10, 11, 12], request_id="e", error_at=1)
    outputs, errors = stream.until_final()
    assert [o[:2] for o in outputs] == [(10, 0), (12, 2)]
    assert len(errors) == 1 and "no answer for element 1" in errors[0]


def test_an_exception_in_execute_ends_the_request_with_its_message(stream):
    stream.send([1], request_id="x", mode="raise")
    result, error = stream.next()
    assert error is not None and "asked to fail" in str(error)
    stream.send([4], request_id="after")
    assert stream.until_final() == ([(4, 0, "after")], []), "the model keeps serving"


def test_bls_from_the_models_own_thread(stream):
    stream.send([3, 9], request_id="bls", mode="thread", bls=True)
    outputs, errors = stream.until_final()
    assert errors == [] and [o[:2] for o in outputs] == [(3, 0), (9, 1)]


def test_cancelling_the_stream_reaches_is_cancelled(server, tmp_path):
    marker = tmp_path / "cancelled.txt"
    s = Stream(server.grpc_url)
    t = grpcclient.InferInput("PERIOD_MS", [1], "INT32")
    t.set_data_from_numpy(np.array([5], np.int32))
    s.client.async_stream_infer("ticker_py", [t], parameters={"marker": str(marker)})
    ticks = [int(s.next()[0].as_numpy("TICK")[0]) for _ in range(3)]
    assert ticks == [0, 1, 2]
    s.close(cancel=True)
    deadline = time.time() + 30
    while not marker.exists() and time.time() < deadline:
        time.sleep(0.05)
    text = marker.read_text()
    assert text.startswith("cancelled=True"), text
    assert int(text.split("ticks=")[1]) < 3000, "the model stopped early, not at its bound"
    again = Stream(server.grpc_url)
    try:
        again.send([8], request_id="next")
        assert again.until_final() == ([(8, 0, "next")], [])
    finally:
        again.close()


def test_auto_complete_can_make_a_model_decoupled(server):
    c = httpclient.InferenceServerClient(server.http_url)
    try:
        assert c.get_model_config("ticker_py")["model_transaction_policy"]["decoupled"] is True
    finally:
        c.close()


def test_single_answer_paths_refuse_decoupled_models_clearly(server):
    h = httpclient.InferenceServerClient(server.http_url)
    t = httpclient.InferInput("IN", [1], "INT32")
    t.set_data_from_numpy(np.array([1], np.int32))
    try:
        with pytest.raises(InferenceServerException) as e:
            h.infer("repeat_py", [t])
        # Triton answers UNSUPPORTED: 501 / UNIMPLEMENTED
        assert e.value.status() == "501" and "decoupled" in str(e.value) and "ModelStreamInfer" in str(e.value)
        assert h.is_model_ready("add_sub_py")
    finally:
        h.close()
    g = grpcclient.InferenceServerClient(server.grpc_url)
    t = grpcclient.InferInput("IN", [1], "INT32")
    t.set_data_from_numpy(np.array([1], np.int32))
    try:
        with pytest.raises(InferenceServerException) as e:
            g.infer("repeat_py", [t])
        assert e.value.status() == "StatusCode.UNIMPLEMENTED" and "decoupled" in str(e.value)
    finally:
        g.close()


def test_a_plain_model_on_the_stream_flags_its_one_answer_final(stream):
    a = grpcclient.InferInput("INPUT0", [4], "FP32")
    a.set_data_from_numpy(np.ones(4, np.float32))
    b = grpcclient.InferInput("INPUT1", [4], "FP32")
    b.set_data_from_numpy(np.ones(4, np.float32))
    stream.client.async_stream_infer("add_sub_py", [a, b], request_id="plain", enable_empty_final_response=True)
    result, error = stream.next()
    assert error is None, error
    response = result.get_response()
    assert response.id == "plain" and response.parameters["triton_final_response"].bool_param
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [2, 2, 2, 2])


def test_only_requested_outputs_are_streamed(stream):
    t = grpcclient.InferInput("IN", [2], "INT32")
    t.set_data_from_numpy(np.array([4, 5], np.int32))
    stream.client.async_stream_infer("repeat_py", [t], request_id="only-idx",
                                     outputs=[grpcclient.InferRequestedOutput("IDX")])
    for expected in (0, 1):
        result, error = stream.next()
        assert error is None, error
        assert result.as_numpy("OUT") is None, "OUT was not asked for"
        assert int(result.as_numpy("IDX")[0]) == expected


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_cancel_on_a_decoupled_bls_iterator_cancels_the_call(server, tmp_path, mode):
    """python_backend's `cancel()` on the iterator of `exec(decoupled=True)` (and of
    `await async_exec(decoupled=True)`): the called model (ticker_py) sees is_cancelled() and stops
    long before its 3000 ticks, and the caller's iterator ends with a CANCELLED error."""
    marker = tmp_path / f"ticker-{mode}.txt"
    c = httpclient.InferenceServerClient(server.http_url)
    t = httpclient.InferInput("PERIOD_MS", [1], "INT32")
    t.set_data_from_numpy(np.array([5], np.int32))
    r = c.infer("bls_cancel_py", [t], parameters={"marker": str(marker), "mode": mode})
    ticks, after, code = (int(r.as_numpy(n)[0]) for n in ("TICKS", "AFTER", "CODE"))
    assert ticks == 3
    assert code == 7 and after >= 1, (after, code)  # pb_utils.TritonError.CANCELLED
    deadline = time.time() + 30
    while not marker.exists() and time.time() < deadline:
        time.sleep(0.05)
    text = marker.read_text()
    assert text.startswith("cancelled=True"), text
    assert int(text.split("ticks=")[1]) < 3000, text
    c.close()
