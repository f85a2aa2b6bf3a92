"""The rest of the Python backend API (issue 16, item 1), through tritonclient: custom metrics on
/metrics, Logger levels, request methods, TritonError codes as Triton answers them, `async def
execute` running several executions at once, request rescheduling, and finalize() errors logged."""
import json
import queue
import shutil
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from cluster_util import strip_ansi

pytestmark = [pytest.mark.server]

PY_MODELS = Path(__file__).parent / "python_models"
MODELS = ["api_py", "async_py", "async_plain_py", "resched_py", "iter_py", "finalize_fails", "seq_sum_py", "bls_api_py",
          "add_sub_py", "control_py", "bls_gather_py"]


@pytest.fixture(scope="module")
def server(server_factory, tmp_path_factory):
    repo = tmp_path_factory.mktemp("python_api") / "repo"
    for name in MODELS:
        shutil.copytree(PY_MODELS / name, repo / name)
    # iter_py is resched_py's model as an iterative sequence.
    shutil.copytree(PY_MODELS / "resched_py" / "1", repo / "iter_py" / "1")
    args = ["--backend-config", f"python,interpreter={sys.executable}",
            "--backend-config", "python,execute-timeout-seconds=60",
            "--model-control-mode", "explicit", "--load-model", "*"]
    return server_factory([repo], args, name="python-api", wait_models=MODELS)


def mode(value):
    t = httpclient.InferInput("MODE", [1], "BYTES")
    t.set_data_from_numpy(np.array([value.encode()], dtype=np.object_))
    return t


def ask(server, value, **kw):
    client = httpclient.InferenceServerClient(server.http_url)
    result = client.infer("api_py", [mode(value)], **kw)
    return result.as_numpy("OUT").reshape(-1)[0].decode()


def log_text(server):
    return strip_ansi(server.log_path.read_text(errors="replace"))


def test_custom_metrics_behave_and_are_exported(server):
    assert ask(server, "metrics") == "ok"
    text = server.metrics()
    assert "# HELP api_py_checks checks run\n# TYPE api_py_checks counter\n" in text
    assert 'api_py_checks{kind="counter"} 2.5\n' in text
    assert "\napi_py_level 5\n" in text and 'api_py_level{case="not a number"} +Inf\n' in text
    for line in ['api_py_sizes_bucket{model="api_py",le="1"} 1', 'api_py_sizes_bucket{model="api_py",le="10"} 2',
                 'api_py_sizes_bucket{model="api_py",le="+Inf"} 3', 'api_py_sizes_sum{model="api_py"} 55.5',
                 'api_py_sizes_count{model="api_py"} 3']:
        assert line + "\n" in text, line
    assert "api_py_short" not in text, "a deleted family is no longer exported"
    assert "nv_inference_request_success" in text, "Triton's own metrics stay"
    before = text.count('api_py_requests{mode="info"}')
    ask(server, "info")
    ask(server, "info")
    assert 'api_py_requests{mode="info"} 2\n' in server.metrics() or before


def test_request_methods_see_what_the_client_sent(server):
    info = json.loads(ask(server, "info", request_id="r-7", timeout=1500, parameters={"note": "hi"}))
    assert info["id"] == "r-7"
    assert info["timeout"] == 1500, info
    assert info["flags"] == 0 and info["correlation_id"] == 0
    assert info["parameters"]["note"] == "hi"


@pytest.mark.parametrize("code,status,grpc_code", [
    ("UNKNOWN", 400, "StatusCode.UNKNOWN"), ("INTERNAL", 500, "StatusCode.INTERNAL"),
    ("NOT_FOUND", 404, "StatusCode.NOT_FOUND"), ("INVALID_ARG", 400, "StatusCode.INVALID_ARGUMENT"),
    ("UNAVAILABLE", 503, "StatusCode.UNAVAILABLE"), ("UNSUPPORTED", 501, "StatusCode.UNIMPLEMENTED"),
    ("ALREADY_EXISTS", 400, "StatusCode.ALREADY_EXISTS"), ("CANCELLED", 400, "StatusCode.CANCELLED")])
def test_triton_error_codes_reach_clients_as_triton_sends_them(server, code, status, grpc_code):
    body = json.dumps({"inputs": [{"name": "MODE", "datatype": "BYTES", "shape": [1], "data": [f"code:{code}"]}]})
    r = server.post("/v2/models/api_py/infer", body.encode())
    assert r.status == status, (r.status, r.body)
    assert json.loads(r.body)["error"] == f"the model chose {code}"
    client = grpcclient.InferenceServerClient(server.grpc_url)
    t = grpcclient.InferInput("MODE", [1], "BYTES")
    t.set_data_from_numpy(np.array([f"code:{code}".encode()], dtype=np.object_))
    with pytest.raises(InferenceServerException) as e:
        client.infer("api_py", [t])
    assert e.value.status() == grpc_code and f"the model chose {code}" in e.value.message()


def test_logger_writes_each_message_once_and_verbose_only_when_asked(server):
    assert ask(server, "log") == "logged"
    text = log_text(server)
    for words in ["api_py says info", "api_py says warn", "api_py says error", "api_py logs at the WARNING level"]:
        assert text.count(words) == 1, (words, text.count(words))
    assert "api_py says verbose" not in text, "verbose messages need --log-verbose 1"
    server.post("/v2/logging", b'{"log_verbose_level": 1}')
    try:
        assert ask(server, "log") == "logged"
        text = log_text(server)
        assert text.count("api_py says verbose") == 1
        assert text.count("api_py says info") == 2
        line = next(ln for ln in text.splitlines() if "api_py says warn" in ln)
        assert "instance=api_py_0_0" in line and "at=model.py:" in line, "the line names the instance and the call"
    finally:
        server.post("/v2/logging", b'{"log_verbose_level": 0}')


def test_bls_to_a_missing_model_fails_the_call_with_a_clear_message(server):
    message = ask(server, "bls_missing")
    assert "no_such_model" in message and "unknown" in message.lower() or "not found" in message.lower(), message


def backend_failures(server, model):
    line = f'nv_inference_request_failure{{model="{model}",reason="BACKEND",version="1"}} '
    found = [ln for ln in server.metrics().splitlines() if ln.startswith(line)]
    return int(float(found[0].split()[-1])) if found else 0


def test_execute_that_raises_fails_its_request_as_triton_reports_it(server):
    before = backend_failures(server, "api_py")
    with pytest.raises(InferenceServerException) as e:
        ask(server, "raise")
    message = e.value.message()
    assert message.startswith("Failed to process the request(s) for model 'api_py_0"), message
    assert "message: ValueError: api_py was told to raise" in message
    assert "At:\n" in message and "model.py(" in message and "): answer" in message, message
    assert backend_failures(server, "api_py") == before + 1, "counted as a BACKEND failure"
    assert ask(server, "info")  # the instance serves on


def stream_of(server, headers=None):
    answers = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put(error or result), headers=headers)
    return client, answers


def send_mode(client, value):
    t = grpcclient.InferInput("MODE", [1], "BYTES")
    t.set_data_from_numpy(np.array([value.encode()], dtype=np.object_))
    client.async_stream_infer("api_py", [t])


def test_triton_grpc_error_ends_the_stream_with_the_errors_status(server):
    client, answers = stream_of(server, {"triton_grpc_error": "true"})
    try:
        send_mode(client, "info")
        assert not isinstance(answers.get(timeout=30), InferenceServerException)
        send_mode(client, "code:UNAVAILABLE")
        error = answers.get(timeout=30)
        assert isinstance(error, InferenceServerException)
        assert error.status() == "StatusCode.UNAVAILABLE" and "the model chose UNAVAILABLE" in error.message()
        try:
            send_mode(client, "info")  # the stream is over: nothing more is answered
        except InferenceServerException:
            pass
        with pytest.raises(queue.Empty):
            answers.get(timeout=1)
    finally:
        client.stop_stream()


def test_without_triton_grpc_error_errors_stay_in_the_stream(server):
    client, answers = stream_of(server)
    try:
        send_mode(client, "code:UNAVAILABLE")
        error = answers.get(timeout=30)
        assert isinstance(error, InferenceServerException) and "the model chose UNAVAILABLE" in error.message()
        send_mode(client, "info")
        assert not isinstance(answers.get(timeout=30), InferenceServerException), "the stream goes on"
    finally:
        client.stop_stream()


def async_stream(server, requests, model="async_py"):
    """Sends (gather, fail) requests to the decoupled async_py (or a model passing them on to it) on
    one stream; answers by request id."""
    answers = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    got = {}
    try:
        for n, (gather, fail) in enumerate(requests):
            inputs = []
            for name, v in (("GATHER", gather), ("FAIL", fail)):
                t = grpcclient.InferInput(name, [1], "INT32")
                t.set_data_from_numpy(np.array([v], np.int32))
                inputs.append(t)
            client.async_stream_infer(model, inputs, request_id=str(n))
        while len(got) < len(requests):
            result, error = answers.get(timeout=60)
            if error is not None:
                got[f"error {len(got)}"] = error.message()
            else:
                got[result.get_response().id] = int(result.as_numpy("SEEN")[0])
    finally:
        client.stop_stream()
    return got


def test_a_decoupled_async_execute_runs_several_executions_at_once(server):
    # Each request waits until three are in flight at once: only overlapping executions get there
    # (one at a time, each would give up after 20 s having seen one).
    assert async_stream(server, [(3, 0)] * 3) == {"0": 3, "1": 3, "2": 3}


def test_awaiting_a_decoupled_bls_call_lets_other_executes_run(server):
    """Triton's concurrent_execute_multi_request_bls: `await async_exec(decoupled=True)` returns
    once the first answer is in, so bls_gather_py's three executes all reach async_py, which sees
    three at once (an await that returned at once would block the loop in next(): one each)."""
    assert async_stream(server, [(3, 0)] * 3, model="bls_gather_py") == {"0": 3, "1": 3, "2": 3}


def test_a_decoupled_async_execute_that_raises_fails_only_its_own_request(server):
    got = async_stream(server, [(2, 0), (2, 1)])
    assert got["0"] == 2
    errors = [v for k, v in got.items() if k.startswith("error")]
    assert len(errors) == 1 and "RuntimeError: async_py failed on purpose after seeing 2" in errors[0], got


def test_a_plain_async_execute_runs_one_execution_at_a_time_as_tritons(server):
    client = httpclient.InferenceServerClient(server.http_url, concurrency=3)
    t = httpclient.InferInput("GATHER", [1], "INT32")
    t.set_data_from_numpy(np.array([1], np.int32))
    pending = [client.async_infer("async_plain_py", [t]) for _ in range(3)]
    assert [int(p.get_result().as_numpy("SEEN")[0]) for p in pending] == [1, 1, 1]


@pytest.mark.parametrize("model", ["resched_py", "iter_py"])
def test_a_rescheduled_request_runs_again_until_the_model_finishes_it(server, model):
    """iter_py is an `iterative_sequence` model called without a correlation ID, as Triton's
    request-rescheduling test calls it: each request is a sequence of its own."""
    answers = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        t = grpcclient.InferInput("ROUNDS", [1], "INT32")
        t.set_data_from_numpy(np.array([4], np.int32))
        client.async_stream_infer(model, [t], request_id="again", enable_empty_final_response=True)
        rounds = []
        while True:
            result, error = answers.get(timeout=30)
            assert error is None, error
            if result.as_numpy("ROUND") is not None:
                rounds.append(int(result.as_numpy("ROUND")[0]))
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream()
    assert rounds == [1, 2, 3, 4]


def test_finalize_errors_are_logged_with_their_traceback(server):
    client = httpclient.InferenceServerClient(server.http_url)
    client.unload_model("finalize_fails")
    deadline = 0
    while "finalize_fails cannot let go" not in log_text(server) and deadline < 100:
        threading.Event().wait(0.1)
        deadline += 1
    text = log_text(server)
    assert "finalize_fails is finalizing" in text
    assert "finalize() failed" in text and "Traceback" in text and "RuntimeError: finalize_fails cannot let go" in text
    client.load_model("finalize_fails")
    assert client.is_model_ready("finalize_fails")


def bls_api(server, value):
    client = httpclient.InferenceServerClient(server.http_url)
    t = httpclient.InferInput("MODE", [1], "BYTES")
    t.set_data_from_numpy(np.array([value.encode()], dtype=np.object_))
    return json.loads(client.infer("bls_api_py", [t]).as_numpy("OUT").reshape(-1)[0])


def test_bls_correlation_id_and_flags_reach_a_sequence_model(server):
    assert bls_api(server, "sequence") == {"sums": [1, 3, 6]}


def test_bls_outputs_outlive_their_response_and_preferred_memory_is_accepted(server):
    assert bls_api(server, "memory") == {"kept": [6.0, 6.0, 6.0, 6.0], "cpu": True}


def control(server, what):
    client = httpclient.InferenceServerClient(server.http_url)
    return client.infer("control_py", [mode(what)]).as_numpy("OUT")[0].decode()


def test_a_model_unloads_and_loads_another_and_asks_whether_it_is_ready(server):
    """pb_utils.unload_model / load_model / is_model_ready (Triton's bls_request_rescheduling
    reloads models this way): add_sub_py is ready, then gone (a BLS call to it fails), then back
    and answering; a model the server does not know, or a version it does not serve, is not ready."""
    assert control(server, "cycle") == "True False error True [2.0, 2.0, 2.0, 2.0] False False"
    # It stays loaded for everyone else.
    client = httpclient.InferenceServerClient(server.http_url)
    assert client.is_model_ready("add_sub_py")


def test_load_model_of_a_missing_model_raises_the_servers_error_in_the_model(server):
    text = control(server, "missing")
    assert text.startswith("TritonModelException: ") and "no_such_model" in text, text
