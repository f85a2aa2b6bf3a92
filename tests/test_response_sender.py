"""A Python model's response sender as Triton 2.51's Python backend defines it (issue 27 item 7),
and `request.is_cancelled()` in a model that is not decoupled:
a model that is not decoupled may answer a request through `request.get_response_sender()` instead
of returning the response, with exactly one response and the final flag, before, while or after
`execute` returns (from its own thread, or an asyncio task of an `async def execute`); later sends
are refused in the model. A final flag without a response is Triton's error, and a decoupled
model's `execute` that returns responses fails the requests still open.

Each response carries an INDEX telling when it was made: 0 returned by execute, 1000+ sent before
the return, 2000+ sent after it (the scheme of Triton's own response-sender test)."""
import queue
import sys

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from cluster_util import wait_until

pytestmark = [pytest.mark.server]

MODEL = '''
import asyncio
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def value(request, name):
    return int(pb_utils.get_input_tensor_by_name(request, name).as_numpy().sum())


def response(index):
    return pb_utils.InferenceResponse([pb_utils.Tensor("INDEX", np.array([index], np.uint16))])


def send(sender, count, final, offset):
    for k in range(count):
        try:
            sender.send(response(offset + k))
        except pb_utils.TritonModelException as e:
            pb_utils.Logger.log_info(f"refused: {e}")
            if offset < 2000:  # before the return, the refusal fails execute(), as in Triton's test
                raise
    if final:
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


class TritonPythonModel:
    def plan(self, requests):
        later, returned = [], []
        for r in requests:
            sender = r.get_response_sender()
            send(sender, value(r, "BEFORE"), value(r, "FINAL_BEFORE"), 1000)
            later.append((sender, value(r, "AFTER"), value(r, "FINAL_AFTER")))
            returned.append(response(0) if value(r, "RETURN") else None)
        return later, (None if returned == [None] * len(requests) else returned)

    ASYNC_EXECUTE
'''

SYNC = '''def execute(self, requests):
        later, returned = self.plan(requests)

        def after():
            time.sleep(0.3)
            for s, n, f in later:
                send(s, n, f, 2000)

        threading.Thread(target=after, daemon=True).start()
        return returned'''

ASYNC = '''async def execute(self, requests):
        later, returned = self.plan(requests)

        async def after():
            await asyncio.sleep(0.3)
            for s, n, f in later:
                send(s, n, f, 2000)

        self.task = asyncio.get_running_loop().create_task(after())
        return returned'''

CANCEL_MODEL = '''
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            seconds = float(pb_utils.get_input_tensor_by_name(request, "SECONDS").as_numpy()[0][0])
            error = pb_utils.TritonError("not cancelled")
            waited = 0.0
            while waited < seconds:
                time.sleep(0.25)
                waited += 0.25
                if request.is_cancelled():
                    pb_utils.Logger.log_info(f"[cancel_py] Request cancelled at {waited} s")
                    error = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
                    break
                pb_utils.Logger.log_info(f"[cancel_py] Request not cancelled at {waited} s")
            responses.append(pb_utils.InferenceResponse(error=error))
        return responses
'''

RAISE_ASYNC = '''
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        for request in requests:
            if pb_utils.get_input_tensor_by_name(request, "WAIT_SECONDS").as_numpy()[0][0] < 0:
                # As Triton's async test model: every request is finished, then the coroutine raises.
                for r in requests:
                    r.get_response_sender().send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                raise ValueError("wait_secs cannot be negative")
        await asyncio.sleep(0.01)
        for request in requests:
            out = pb_utils.Tensor("DUMMY_OUT", np.zeros([1], np.float32))
            request.get_response_sender().send(pb_utils.InferenceResponse([out]),
                                               flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

INPUTS = ["BEFORE", "FINAL_BEFORE", "RETURN", "AFTER", "FINAL_AFTER"]


def config(name, extra=""):
    ins = ", ".join(f'{{ name: "{n}" data_type: TYPE_UINT8 dims: [ 1 ] }}' for n in INPUTS)
    return (f'name: "{name}"\nbackend: "python"\nmax_batch_size: 8\ninput [ {ins} ]\n'
            f'output [ {{ name: "INDEX" data_type: TYPE_UINT16 dims: [ 1 ] }} ]\n{extra}')


@pytest.fixture(scope="module")
def server(server_factory, tmp_path_factory):
    repo = tmp_path_factory.mktemp("sender") / "repo"
    models = {
        "sender": (SYNC, ""),
        "sender_async": (ASYNC, ""),
        # The batch runs once three requests are queued (30 s is only the hang guard).
        "sender_batching": (SYNC, "dynamic_batching { preferred_batch_size: [ 3 ] "
                                  "max_queue_delay_microseconds: 30000000 }"),
        "sender_decoupled": (SYNC, "model_transaction_policy { decoupled: true }"),
    }
    (repo / "raise_async" / "1").mkdir(parents=True)
    (repo / "raise_async" / "1" / "model.py").write_text(RAISE_ASYNC)
    (repo / "raise_async" / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "WAIT_SECONDS" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "DUMMY_OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'model_transaction_policy { decoupled: true }\n')
    (repo / "cancel_py" / "1").mkdir(parents=True)
    (repo / "cancel_py" / "1" / "model.py").write_text(CANCEL_MODEL)
    (repo / "cancel_py" / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 1\n'
        'input [ { name: "SECONDS" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "DUMMY" data_type: TYPE_FP32 dims: [ 1 ] } ]\n')
    for name, (execute, extra) in models.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(MODEL.replace("ASYNC_EXECUTE", execute))
        (repo / name / "config.pbtxt").write_text(config(name, extra))
    return server_factory([repo], ["--backend-config", f"python,interpreter={sys.executable}"], name="sender")


def inputs(before=0, final_before=0, returned=0, after=0, final_after=0):
    out = []
    for name, v in zip(INPUTS, [before, final_before, returned, after, final_after]):
        t = grpcclient.InferInput(name, [1, 1], "UINT8")
        t.set_data_from_numpy(np.array([[v]], np.uint8))
        out.append(t)
    return out


def stream(server, model, *requests, wait=1.0):
    """Sends each request on one stream and returns every answer (index or error text) that
    arrives, waiting `wait` seconds after the last for strays."""
    answers = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    try:
        for r in requests:
            client.async_stream_infer(model, r)
        got = []
        while True:
            try:
                a = answers.get(timeout=wait if len(got) >= len(requests) else 30)
            except queue.Empty:
                break
            got.append(a.message() if isinstance(a, Exception) else int(a.as_numpy("INDEX").sum()))
    finally:
        client.stop_stream()
    return got


@pytest.mark.parametrize("model", ["sender", "sender_async"])
@pytest.mark.parametrize("case,expected", [
    (dict(returned=1), [0]),
    (dict(before=1, final_before=1), [1000]),
    (dict(after=1, final_after=1), [2000]),
    (dict(before=2, final_before=1), [1000]),          # the second send is refused in the model
    (dict(before=1, final_before=1, returned=1), [1000]),  # the returned one is ignored
    (dict(returned=1, after=1, final_after=1), [0]),   # the later send is refused
], ids=["on-return", "before-return", "after-return", "two-before", "before-and-on", "on-and-after"])
def test_a_plain_model_answers_once_through_its_sender_or_its_return(server, model, case, expected):
    assert stream(server, model, inputs(**case)) == expected


@pytest.mark.parametrize("model", ["sender", "sender_async"])
def test_a_final_flag_without_a_response_is_tritons_error(server, model):
    [answer] = stream(server, model, inputs(final_before=1))
    assert "Non-decoupled model cannot send complete final before sending a response" in answer


def test_one_batch_mixes_returned_early_and_late_answers(server):
    got = stream(server, "sender_batching", inputs(returned=1), inputs(before=1, final_before=1),
                 inputs(after=1, final_after=1))
    assert sorted(got) == [0, 1000, 2000]
    client = grpcclient.InferenceServerClient(server.grpc_url)
    stats = lambda: client.get_inference_statistics("sender_batching", as_json=True)["model_stats"][0]  # noqa: E731
    # Statistics are recorded as each request ends, which may be just after its answer went out.
    wait_until(lambda: int(stats()["inference_count"]) == 3, 30, lambda: f"three requests counted: {stats()}")
    assert int(stats()["execution_count"]) == 1, "the three requests ran as one execution"


def test_a_decoupled_execute_that_returns_responses_fails_its_open_requests(server):
    [answer] = stream(server, "sender_decoupled", inputs(returned=1))
    # Triton names the instance (L0_backend_python's decoupled test asserts this sentence; an
    # implicit instance group's instance is '<model>_0', as Triton 2.51 names it).
    assert ("Python model 'sender_decoupled_0' is using the decoupled mode and the execute function must "
            "return None.") in answer
    # A request whose sender finished before the return keeps its answers, and gets no error.
    assert stream(server, "sender_decoupled", inputs(before=1, final_before=1, returned=1)) == [1000]


def test_the_models_refusals_are_tritons_words(server):
    import time
    stream(server, "sender", inputs(before=2, final_before=1))
    stream(server, "sender", inputs(returned=1, after=1, final_after=1))
    # The model logs its refusals through the node, which writes them when they arrive.
    deadline = time.monotonic() + 30
    while "Non-decoupled model cannot send more than one response" not in server.log_tail(400):
        assert time.monotonic() < deadline, "the refusal never reached the log"
        time.sleep(0.05)


def test_a_plain_models_request_sees_its_client_cancel_during_execute(server):
    import time
    got = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    x = grpcclient.InferInput("SECONDS", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[8.0]], np.float32))
    future = client.async_infer("cancel_py", [x], lambda result, error: got.put(error or result))
    # Cancelled once execute() has looked at it (a request cancelled before it runs never reaches it).
    deadline = time.monotonic() + 30
    while "[cancel_py] Request not cancelled at 0.25 s" not in server.log_tail(200):
        assert time.monotonic() < deadline, "execute() never logged its first look at the request"
        time.sleep(0.05)
    assert got.empty(), "the request is still executing"
    future.cancel()
    answer = got.get(timeout=30)
    assert isinstance(answer, Exception) and "CANCELLED" in str(answer.status())
    deadline = time.monotonic() + 30
    while "[cancel_py] Request cancelled at" not in server.log_tail(200) and time.monotonic() < deadline:
        time.sleep(0.2)
    log = server.log_tail(200)
    assert "[cancel_py] Request not cancelled at 0.25 s" in log
    assert "[cancel_py] Request cancelled at" in log, "is_cancelled() turned true inside execute"
    # The model stopped early: it never logged the end of the 8 s it was asked to wait.
    assert "[cancel_py] Request not cancelled at 8.0 s" not in log
    y = grpcclient.InferInput("SECONDS", [1, 1], "FP32")
    y.set_data_from_numpy(np.array([[0.0]], np.float32))
    with pytest.raises(Exception, match="not cancelled"):
        client.infer("cancel_py", [y])


def test_an_exception_of_an_async_execute_is_logged_even_with_no_request_left_to_carry_it(server):
    import time
    assert "ValueError: wait_secs cannot be negative" not in server.log_tail(2000)
    x = grpcclient.InferInput("WAIT_SECONDS", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[-1.0]], np.float32))
    answers = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    client.async_stream_infer("raise_async", [x])
    deadline = time.monotonic() + 10
    while "ValueError: wait_secs cannot be negative" not in server.log_tail(2000) and time.monotonic() < deadline:
        time.sleep(0.1)
    client.stop_stream()
    assert "ValueError: wait_secs cannot be negative" in server.log_tail(2000), "Triton's async test reads its log"
