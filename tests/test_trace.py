"""The trace extension (issue 16, item 4): settings of the server and of each model over HTTP
(`/v2/trace/setting`, `/v2/models/{m}/trace/setting`) and gRPC `TraceSetting`, with Triton's values
and errors; and traced requests writing their timestamps (the frontends' too) to the trace file in
Triton's JSON form, every `log_frequency` traces, when the count runs out, or at exit (issue 27);
those of generate requests, and of requests cancelled while they queue or run."""
import json
import shutil
import sys
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from test_trace_otel import (CANCEL_MODELS, PYTHON, QUEUE_RUNS_S, RUNS_S, all_required_inputs, cancel_after,
                             cancel_repo, fp32_inputs, in_background)

pytestmark = [pytest.mark.server]

CORE = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START",
        "COMPUTE_END", "REQUEST_END"]


def repo_with_add_sub(models_dir, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(models_dir / "simple" / "add_sub", repo / "add_sub")
    return repo


def ones(client_module):
    """add_sub's two inputs, all ones, for tritonclient's http or grpc module."""
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        t = client_module.InferInput(name, [1, 16], "FP32")
        t.set_data_from_numpy(np.ones((1, 16), np.float32))
        inputs.append(t)
    return inputs


def infer(server, request_id):
    client = httpclient.InferenceServerClient(server.http_url)
    client.infer("add_sub", ones(httpclient), request_id=request_id)


def post(server, path, body):
    r = server.post(path, json.dumps(body).encode())
    return r.status, json.loads(r.body)


def test_settings_round_trip_over_http_and_grpc(fresh_server, models_dir, tmp_path):
    trace_file = str(tmp_path / "trace.json")
    server = fresh_server([repo_with_add_sub(models_dir, tmp_path)], ["--trace-config", f"triton,file={trace_file}"],
                          wait_models=["add_sub"])
    assert server.get_json("/v2/trace/setting") == {
        "trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1", "log_frequency": "0",
        "trace_file": trace_file, "trace_mode": "triton"}
    status, body = post(server, "/v2/trace/setting", {"trace_level": ["TIMESTAMPS"], "trace_rate": "10"})
    assert status == 200 and body["trace_level"] == ["TIMESTAMPS"] and body["trace_rate"] == "10"
    # a model's settings start as the server's, and a null gives a setting back to them
    status, body = post(server, "/v2/models/add_sub/trace/setting", {"trace_rate": "2", "trace_count": "5"})
    assert (status, body["trace_rate"], body["trace_count"], body["trace_level"]) == (200, "2", "5", ["TIMESTAMPS"])
    assert server.get_json("/v2/trace/setting")["trace_rate"] == "10", "the server's own are unchanged"
    status, body = post(server, "/v2/models/add_sub/trace/setting", {"trace_rate": None})
    assert body["trace_rate"] == "10" and body["trace_count"] == "5"
    # gRPC sees and changes the same settings
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    got = grpc.get_trace_settings(model_name="add_sub", as_json=True)["settings"]
    assert got["trace_count"]["value"] == ["5"] and got["trace_rate"]["value"] == ["10"]
    changed = grpc.update_trace_settings(settings={"trace_rate": "3"}, as_json=True)["settings"]
    assert changed["trace_rate"]["value"] == ["3"]
    assert server.get_json("/v2/trace/setting")["trace_rate"] == "3"
    with pytest.raises(InferenceServerException) as e:
        grpc.update_trace_settings(model_name="nope", settings={"trace_rate": "3"})
    assert "Request for unknown model : nope" in e.value.message()


@pytest.mark.parametrize("path,body,words", [
    ("/v2/trace/setting", {"trace_rate": "x"}, "Unable to parse 'trace_rate', got: x"),
    ("/v2/trace/setting", {"trace_rate": "0"}, "sample rate must be non-zero"),
    ("/v2/trace/setting", {"trace_count": "-5"}, "Expecting value >= -1, got:-5"),
    ("/v2/trace/setting", {"trace_file": "/tmp/elsewhere.json"}, "can not be updated through network protocol"),
    ("/v2/trace/setting", {"trace_level": ["LOUD"]}, "got 'LOUD'"),
    ("/v2/trace/setting", {"trace_count": "10000000000"},
     "Unable to parse 'trace_count', value is out of range [ -1, 2147483647 ], got: 10000000000"),
    ("/v2/trace/setting", {"trace_rate": "10000000000"},
     "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ], got: 10000000000"),
    ("/v2/trace/setting", {"log_frequency": "10000000000"},
     "Unable to parse 'log_frequency', value is out of range [ 0, 4294967295 ], got: 10000000000"),
    ("/v2/trace/setting", {"trace_level": ["OFF", "TIMESTAMPS"]}, "Expect only one trace level 'OFF' is specified"),
    ("/v2/models/nope/trace/setting", {"trace_rate": "3"}, "Request for unknown model : nope"),
])
def test_bad_settings_get_tritons_errors_and_change_nothing(fresh_server, models_dir, tmp_path, path, body, words):
    server = fresh_server([repo_with_add_sub(models_dir, tmp_path)], [], wait_models=["add_sub"])
    before = server.get_json("/v2/trace/setting")
    status, answer = post(server, path, body)
    assert status == 400 and words in answer["error"], (status, answer)
    assert server.get_json("/v2/trace/setting") == before


def test_traced_requests_write_their_timestamps_every_log_frequency(fresh_server, models_dir, tmp_path):
    trace_file = tmp_path / "trace.json"
    args = ["--trace-config", f"triton,file={trace_file}", "--trace-config", "level=TIMESTAMPS",
            "--trace-config", "rate=1", "--trace-config", "log-frequency=2"]
    server = fresh_server([repo_with_add_sub(models_dir, tmp_path)], args, wait_models=["add_sub"])
    infer(server, "first")
    assert not (tmp_path / "trace.json.0").exists(), "written once two traces are held"
    infer(server, "second")
    entries = json.loads((tmp_path / "trace.json.0").read_text())
    heads = [e for e in entries if "model_name" in e]
    assert [(h["model_name"], h["model_version"], h["request_id"]) for h in heads] == [
        ("add_sub", 1, "first"), ("add_sub", 1, "second")]
    first = heads[0]["id"]
    stamps = [(e["timestamps"][0]["name"], e["timestamps"][0]["ns"]) for e in entries
              if e["id"] == first and "timestamps" in e]
    names = [n for n, _ in stamps]
    assert [n for n in names if n in CORE] == CORE, names
    times = dict(stamps)
    assert [times[n] for n in CORE] == sorted(times[n] for n in CORE), "in the order they happened"


def test_the_count_runs_out_and_the_traces_are_written_at_once(fresh_server, models_dir, tmp_path):
    """As Triton: when trace_count reaches 0 the collected traces go to trace_file.<n> at once,
    whatever log_frequency says (0: otherwise only at exit)."""
    trace_file = tmp_path / "trace.json"
    server = fresh_server([repo_with_add_sub(models_dir, tmp_path)], ["--trace-config", f"triton,file={trace_file}"],
                          wait_models=["add_sub"])
    post(server, "/v2/models/add_sub/trace/setting", {"trace_level": ["TIMESTAMPS"], "trace_rate": "1",
                                                      "trace_count": "1"})
    infer(server, "traced")
    infer(server, "not traced")
    assert server.get_json("/v2/models/add_sub/trace/setting")["trace_count"] == "0"
    entries = json.loads((tmp_path / "trace.json.0").read_text())
    assert [e["request_id"] for e in entries if "request_id" in e] == ["traced"]
    assert server.stop() == 0
    assert not trace_file.exists(), "nothing was left to write at exit"


def test_each_setting_writes_its_own_traces(fresh_server, models_dir, tmp_path):
    """Triton's L0_trace (count): traces held by a setting stay with it when a change makes a new
    one; the new setting writes only its own to trace_file.0 when its count runs out, and the
    first setting's traces go to trace_file at exit."""
    trace_file = tmp_path / "trace.json"
    args = ["--trace-config", f"triton,file={trace_file}", "--trace-config", "level=TIMESTAMPS",
            "--trace-config", "rate=1"]
    server = fresh_server([repo_with_add_sub(models_dir, tmp_path)], args, wait_models=["add_sub"])
    for n in range(4):
        infer(server, f"before{n}")
    status, body = post(server, "/v2/trace/setting", {"trace_count": "2"})
    assert (status, body["trace_count"]) == (200, "2")
    for n in range(3):
        infer(server, f"after{n}")
    ids = lambda path: [e["request_id"] for e in json.loads(path.read_text()) if "request_id" in e]  # noqa: E731
    assert ids(tmp_path / "trace.json.0") == ["after0", "after1"]
    assert server.stop() == 0
    assert ids(trace_file) == [f"before{n}" for n in range(4)]
    assert not (tmp_path / "trace.json.1").exists()


def test_the_rate_th_request_is_traced_with_the_frontends_timestamps(fresh_server, models_dir, tmp_path):
    """trace_rate 2 traces the 2nd and 4th requests (Triton takes the N-th of every N). Each trace
    carries its frontend's stamps around the core ones, as Triton's trace docs show them."""
    trace_file = tmp_path / "trace.json"
    args = ["--trace-config", f"triton,file={trace_file}", "--trace-config", "level=TIMESTAMPS",
            "--trace-config", "rate=2", "--trace-config", "log-frequency=2"]
    server = fresh_server([repo_with_add_sub(models_dir, tmp_path)], args, wait_models=["add_sub"])
    infer(server, "1")
    infer(server, "2")
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    grpc.infer("add_sub", ones(grpcclient), request_id="3")
    grpc.infer("add_sub", ones(grpcclient), request_id="4")
    entries = json.loads((tmp_path / "trace.json.0").read_text())
    heads = {e["id"]: e["request_id"] for e in entries if "request_id" in e}
    assert sorted(heads.values()) == ["2", "4"], heads
    for trace_id, request_id in heads.items():
        stamps = [(e["timestamps"][0]["name"], e["timestamps"][0]["ns"]) for e in entries
                  if e["id"] == trace_id and "timestamps" in e]
        front = (["HTTP_RECV_START", "HTTP_RECV_END"], ["HTTP_SEND_START", "HTTP_SEND_END"]) if request_id == "2" \
            else (["GRPC_WAITREAD_START", "GRPC_WAITREAD_END"], ["GRPC_SEND_START", "GRPC_SEND_END"])
        order = front[0] + CORE + front[1]
        names = [n for n, _ in stamps if n in order]
        assert names == order, (request_id, names)
        times = dict(stamps)
        assert [times[n] for n in order] == sorted(times[n] for n in order), "in the order they happened"


def test_null_returns_a_server_setting_to_its_start_up_value(fresh_server, models_dir, tmp_path):
    trace_file = tmp_path / "trace.json"
    args = ["--trace-config", f"triton,file={trace_file}", "--trace-config", "rate=7",
            "--trace-config", "level=TIMESTAMPS"]
    server = fresh_server([repo_with_add_sub(models_dir, tmp_path)], args, wait_models=["add_sub"])
    post(server, "/v2/trace/setting", {"trace_rate": "3", "trace_level": ["OFF"]})
    status, body = post(server, "/v2/trace/setting", {"trace_rate": None, "trace_level": None})
    assert (status, body["trace_rate"], body["trace_level"]) == (200, "7", ["TIMESTAMPS"]), body


def test_settings_of_an_unloaded_model_are_refused(fresh_server, models_dir, tmp_path):
    server = fresh_server([repo_with_add_sub(models_dir, tmp_path)], ["--model-control-mode", "explicit"],
                          wait_models=[])
    for method in ("GET", "POST"):
        r = server.get("/v2/models/add_sub/trace/setting") if method == "GET" else \
            server.post("/v2/models/add_sub/trace/setting", b'{"trace_rate": "2"}')
        assert r.status == 400 and b"Request for unknown model : add_sub" in r.body, (method, r.status, r.body)


BLS_TRACED = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            inputs = [pb_utils.get_input_tensor_by_name(r, n) for n in ("INPUT0", "INPUT1")]
            assert r.trace().get_context() is None
            child = pb_utils.InferenceRequest(model_name="add_sub", requested_output_names=["OUTPUT0"],
                                              inputs=inputs, request_id="child", trace=r.trace()).exec()
            plain = pb_utils.InferenceRequest(model_name="add_sub", requested_output_names=["OUTPUT0"],
                                              inputs=inputs, request_id="plain").exec()
            assert not child.has_error() and not plain.has_error()
            out.append(pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(child, "OUTPUT0")]))
        return out
'''


def test_a_bls_call_made_with_request_trace_is_traced_as_its_child(fresh_server, models_dir, tmp_path):
    """python_backend's `request.trace()`: a BLS request made with `trace=request.trace()` is traced
    as the calling request's child (`parent_id`), even where its model's own setting traces
    nothing; a BLS request without it is not traced, as in Triton, which samples only the
    requests clients make (add_sub's setting would trace every one of its own)."""
    repo = repo_with_add_sub(models_dir, tmp_path)
    (repo / "bls_traced" / "1").mkdir(parents=True)
    (repo / "bls_traced" / "1" / "model.py").write_text(BLS_TRACED)
    (repo / "bls_traced" / "config.pbtxt").write_text(
        'backend: "python"\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1, 16 ] },'
        ' { name: "INPUT1" data_type: TYPE_FP32 dims: [ 1, 16 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1, 16 ] } ]\n')
    trace_file = tmp_path / "trace.json"
    args = ["--trace-config", f"triton,file={trace_file}", "--trace-config", "level=TIMESTAMPS",
            "--trace-config", "rate=1", "--backend-config", f"python,interpreter={sys.executable}"]
    server = fresh_server([repo], args, wait_models=["add_sub", "bls_traced"])
    client = httpclient.InferenceServerClient(server.http_url)
    for level in (["TIMESTAMPS"], ["OFF"]):
        status, _ = post(server, "/v2/models/add_sub/trace/setting", {"trace_level": level, "trace_rate": "1"})
        assert status == 200
        answer = client.infer("bls_traced", ones(httpclient), request_id="outer").as_numpy("OUTPUT0")
        np.testing.assert_array_equal(answer, np.full((1, 16), 2, np.float32))
    assert server.stop() == 0
    heads = [e for e in json.loads(trace_file.read_text()) if "request_id" in e]
    assert sorted(e["request_id"] for e in heads) == ["child", "child", "outer", "outer"], heads
    outer = {e["id"] for e in heads if e["request_id"] == "outer"}
    for child in (e for e in heads if e["request_id"] == "child"):
        assert child["model_name"] == "add_sub" and child["parent_id"] in outer, heads
    assert all("parent_id" not in e for e in heads if e["request_id"] == "outer")


BLS_ENSEMBLE = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            inputs = [pb_utils.get_input_tensor_by_name(r, n) for n in ("INPUT0", "INPUT1")]
            # The model name as numpy gives it (bytes), as Triton's qa model bls_simple passes it.
            name = np.array([b"ens"], np.object_)[0]
            call = pb_utils.InferenceRequest(model_name=name, requested_output_names=["OUTPUT0"],
                                             inputs=inputs, request_id="child", trace=r.trace()).exec()
            assert not call.has_error(), call.error().message()
            out.append(pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(call, "OUTPUT0")]))
        return out
'''


def test_an_ensemble_is_traced_with_its_steps_as_children_and_only_clients_requests_are_sampled(
        fresh_server, models_dir, tmp_path):
    """Triton's L0_trace (rate 4, four requests to a BLS model calling an ensemble with
    `trace=request.trace()`): only the requests clients make are sampled, so exactly the fourth is
    traced, with its ensemble as its child and the ensemble's step as the ensemble's child; the
    ensemble has no compute timestamps of its own."""
    repo = repo_with_add_sub(models_dir, tmp_path)
    (repo / "bls_ens" / "1").mkdir(parents=True)
    (repo / "bls_ens" / "1" / "model.py").write_text("import numpy as np\n" + BLS_ENSEMBLE)
    (repo / "bls_ens" / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },'
        ' { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]\n')
    (repo / "ens" / "1").mkdir(parents=True)
    (repo / "ens" / "config.pbtxt").write_text(
        'platform: "ensemble"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },'
        ' { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
        'ensemble_scheduling { step [ { model_name: "add_sub" model_version: -1 '
        'input_map { key: "INPUT0" value: "INPUT0" } input_map { key: "INPUT1" value: "INPUT1" } '
        'output_map { key: "OUTPUT0" value: "OUTPUT0" } } ] }\n')
    trace_file = tmp_path / "trace.json"
    args = ["--trace-config", f"triton,file={trace_file}", "--trace-config", "level=TIMESTAMPS",
            "--trace-config", "rate=4", "--trace-config", "count=6",
            "--backend-config", f"python,interpreter={sys.executable}"]
    server = fresh_server([repo], args, wait_models=["add_sub", "ens", "bls_ens"])
    client = httpclient.InferenceServerClient(server.http_url)
    for n in range(4):
        answer = client.infer("bls_ens", ones(httpclient), request_id=f"outer{n}").as_numpy("OUTPUT0")
        np.testing.assert_array_equal(answer, np.full((1, 16), 2, np.float32))
    assert server.stop() == 0
    entries = json.loads(trace_file.read_text())
    heads = {e["id"]: e for e in entries if "model_name" in e}
    assert sorted(e["model_name"] for e in heads.values()) == ["add_sub", "bls_ens", "ens"], heads
    by_model = {e["model_name"]: e for e in heads.values()}
    assert by_model["bls_ens"]["request_id"] == "outer3" and "parent_id" not in by_model["bls_ens"]
    assert by_model["ens"]["parent_id"] == by_model["bls_ens"]["id"], heads
    assert by_model["add_sub"]["parent_id"] == by_model["ens"]["id"], heads
    stamps = {}
    for e in entries:
        for t in e.get("timestamps", []):
            stamps.setdefault(heads[e["id"]]["model_name"], set()).add(t["name"])
    assert "COMPUTE_INPUT_END" in stamps["bls_ens"] and "COMPUTE_INPUT_END" in stamps["add_sub"], stamps
    assert not any(s.startswith("COMPUTE") for s in stamps["ens"]), stamps
    assert {"REQUEST_START", "REQUEST_END"} <= stamps["ens"], stamps


def trace_args(trace_file, *extra):
    return ["--trace-config", f"triton,file={trace_file}", "--trace-config", "level=TIMESTAMPS",
            "--trace-config", "rate=1"] + [a for e in extra for a in ("--trace-config", e)]


def written_traces(path):
    """The traces of a trace file: {request_id: [(name, ns), ...]} in the file's order."""
    entries = json.loads(path.read_text())
    heads = {e["id"]: e["request_id"] for e in entries if "request_id" in e}
    out = {r: [] for r in heads.values()}
    for e in entries:
        for t in e.get("timestamps", []):
            out[heads[e["id"]]].append((t["name"], t["ns"]))
    return out


def wait_file(path, timeout):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} not written in {timeout} s"
        time.sleep(0.05)
    time.sleep(0.2)
    return path


def in_order(stamps):
    return [ns for _, ns in stamps] == sorted(ns for _, ns in stamps)


GRPC_RECV = ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END"]


def test_a_request_cancelled_while_it_runs_is_written_with_its_compute(fresh_server, tmp_path):
    """Triton's all_input_required cancel, in trace file mode: the request's trace is written once
    its model has run its batch to the end, with the real compute stamps and the frontend's, and
    no SEND stamps (nothing was sent)."""
    trace_file = tmp_path / "trace.json"
    server = fresh_server([cancel_repo(tmp_path)], PYTHON + trace_args(trace_file, "log-frequency=1"),
                          wait_models=CANCEL_MODELS)
    cancel_after(server.grpc_url, "input_all_required", all_required_inputs(), 1.0, "cancelled")
    written = tmp_path / "trace.json.0"
    assert not written.exists(), "its compute still runs"
    stamps = written_traces(wait_file(written, RUNS_S + 5))["cancelled"]
    assert [n for n, _ in stamps] == GRPC_RECV + CORE, stamps
    assert in_order(stamps), stamps
    times = dict(stamps)
    assert times["COMPUTE_END"] - times["COMPUTE_START"] >= (RUNS_S - 0.3) * 1e9, "the compute's real end"


def test_a_request_cancelled_in_the_queue_is_written_at_once_without_compute(fresh_server, tmp_path):
    """Triton's model_cancel_in_queue, in trace file mode: the request cancelled while it waits
    behind another is written as its client goes away (its frontend's trace is not lost), with
    QUEUE_START and no compute; the other is written when it ends."""
    trace_file = tmp_path / "trace.json"
    server = fresh_server([cancel_repo(tmp_path)], PYTHON + trace_args(trace_file, "log-frequency=1"),
                          wait_models=CANCEL_MODELS)
    ins = fp32_inputs(["INPUT0"], batched=True)
    first, answer = in_background(server.grpc_url, "dynamic_batch", ins, "first")
    try:
        time.sleep(1.0)
        cancel_after(server.grpc_url, "dynamic_batch", ins, 0.2, "cancelled")
        traces = written_traces(wait_file(tmp_path / "trace.json.0", QUEUE_RUNS_S - 3))
        assert list(traces) == ["cancelled"], traces
        stamps = traces["cancelled"]
        assert [n for n, _ in stamps] == GRPC_RECV + ["REQUEST_START", "QUEUE_START", "REQUEST_END"], stamps
        assert in_order(stamps), stamps
    finally:
        first.join()
    assert not isinstance(answer[0], InferenceServerException), answer
    stamps = written_traces(wait_file(tmp_path / "trace.json.1", 5))["first"]
    assert [n for n, _ in stamps if n in CORE] == CORE, stamps


@pytest.mark.parametrize("endpoint", ["generate", "generate_stream"])
def test_generate_requests_have_the_frontends_timestamps(fresh_server, models_dir, tmp_path, endpoint):
    """Triton traces /generate and /generate_stream as it traces infer requests: the HTTP stamps
    around the core ones."""
    trace_file = tmp_path / "trace.json"
    server = fresh_server([repo_with_add_sub(models_dir, tmp_path)], trace_args(trace_file, "log-frequency=1"),
                          wait_models=["add_sub"])
    body = {"id": endpoint, "INPUT0": [1.0] * 16, "INPUT1": [1.0] * 16}
    r = server.post(f"/v2/models/add_sub/{endpoint}", json.dumps(body).encode())
    assert r.status == 200 and b"OUTPUT0" in r.body, r.body
    stamps = written_traces(wait_file(tmp_path / "trace.json.0", 5))[endpoint]
    order = ["HTTP_RECV_START", "HTTP_RECV_END"] + CORE + ["HTTP_SEND_START", "HTTP_SEND_END"]
    assert [n for n, _ in stamps if n in order] == order, stamps
    assert in_order(stamps), stamps
