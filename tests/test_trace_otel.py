"""Triton's OpenTelemetry trace mode (issue 58): `--trace-config mode=opentelemetry`, spans sent over
OTLP/HTTP to a collector. The collector is tests/otlp_collector.py, a stand-in for the OpenTelemetry
Collector of Triton's tests (otelcol cannot be downloaded here): it receives OTLP/HTTP (protobuf, as Triton and the mesh send it) and writes
what the Collector's batch processor and file exporter write, one JSON line per batch.

The cases are those of Triton 2.51's qa/L0_trace/opentelemetry_unittest.py that these models can
serve (simple, ensemble, BLS, a non-decoupled Python model over HTTP, gRPC and gRPC streams, each
without and with a client `traceparent`; the rate change with triggered traces; the context a Python
model gets; a gRPC request cancelled while its model runs and while it queues, with Python models in
place of Triton's; generate requests), the settings API runs of L0_trace/test.sh (rate=0, count=1), its batch span processor
runs, its Python context runs, and the start-up failures of L0_cmdline_trace. Triton's `simple`
(qa_model_repository/onnx_int32_int32_int32) is an ONNX int32 add/sub made here."""
import json
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from mesh_util import free_ports
from otlp_collector import Collector

pytestmark = [pytest.mark.server]

PARENT = "00-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01"
# Copied for each use: tritonclient's HTTP infer() adds its own headers to the dict it is given.
HEADERS = {"traceparent": PARENT}
ENSEMBLE = "ensemble_add_sub_int32_int32_int32"
PYTHON = ["--backend-config", f"python,interpreter={sys.executable}"]

IO_INT32 = '''
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ {d} ] }}, {{ name: "INPUT1" data_type: TYPE_INT32 dims: [ {d} ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ {d} ] }}, {{ name: "OUTPUT1" data_type: TYPE_INT32 dims: [ {d} ] }} ]
'''

ENSEMBLE_STEP = '''
ensemble_scheduling { step [ {
  model_name: "simple" model_version: -1
  input_map { key: "INPUT0" value: "INPUT0" } input_map { key: "INPUT1" value: "INPUT1" }
  output_map { key: "OUTPUT0" value: "OUTPUT0" } output_map { key: "OUTPUT1" value: "OUTPUT1" }
} ] }
'''

# As Triton's qa/python_models/bls_simple: calls MODEL_NAME with the request's trace.
BLS_SIMPLE = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            name = pb_utils.get_input_tensor_by_name(r, "MODEL_NAME").as_numpy()[0].decode()
            inputs = [pb_utils.get_input_tensor_by_name(r, n) for n in ("INPUT0", "INPUT1")]
            call = pb_utils.InferenceRequest(model_name=name, requested_output_names=["OUTPUT0", "OUTPUT1"],
                                             inputs=inputs, trace=r.trace())
            answer = call.exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            out.append(pb_utils.InferenceResponse(answer.output_tensors()))
        return out
'''

# As Triton's qa/L0_trace/trace_context.py: OUTPUT0 is get_context(), checked against expect_none.
TRACE_CONTEXT = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            expect_none = pb_utils.get_input_tensor_by_name(r, "expect_none").as_numpy()[0]
            context = r.trace().get_context()
            if expect_none and context is not None:
                raise pb_utils.TritonModelException("Context should be None")
            if not expect_none and context is None:
                raise pb_utils.TritonModelException("Context should NOT be None")
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([context or ""], dtype=np.object_))]))
        return out
'''

# As Triton's repeat_int32 with `decoupled: False`: OUT = IN[0], IDX = 0.
REPEAT = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            first = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()[:1]
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", first.astype(np.int32)),
                                                   pb_utils.Tensor("IDX", np.zeros(1, np.uint32))]))
        return out
'''


def int32_add_sub_onnx() -> bytes:
    from onnx import TensorProto, helper
    shape = ["batch", 16]
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
         helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])], "simple",
        [vi("INPUT0", TensorProto.INT32, shape), vi("INPUT1", TensorProto.INT32, shape)],
        [vi("OUTPUT0", TensorProto.INT32, shape), vi("OUTPUT1", TensorProto.INT32, shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def model(repo, name, config, files=None):
    d = repo / name
    (d / "1").mkdir(parents=True)
    (d / "config.pbtxt").write_text(f'name: "{name}"\n' + config)
    for file, data in (files or {}).items():
        (d / "1" / file).write_bytes(data if isinstance(data, bytes) else data.encode())


def otel_repo(tmp_path):
    """Triton's L0_trace models that this project serves."""
    repo = tmp_path / "repo"
    model(repo, "simple", 'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n' + IO_INT32.format(d=16),
          {"model.onnx": int32_add_sub_onnx()})
    model(repo, ENSEMBLE, 'platform: "ensemble"\nmax_batch_size: 8\n' + IO_INT32.format(d=16) + ENSEMBLE_STEP)
    model(repo, "bls_simple", 'backend: "python"\nmax_batch_size: 0\n'
          'input [ { name: "MODEL_NAME" data_type: TYPE_STRING dims: [ 1 ] },'
          ' { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1, 16 ] }, { name: "INPUT1" data_type: TYPE_INT32 dims: [ 1, 16 ] } ]\n'
          'output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]\n',
          {"model.py": BLS_SIMPLE})
    model(repo, "trace_context", 'backend: "python"\nmax_batch_size: 0\n'
          'input [ { name: "expect_none" data_type: TYPE_BOOL dims: [ 1 ] } ]\n'
          'output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]\n', {"model.py": TRACE_CONTEXT})
    model(repo, "repeat_int32", 'backend: "python"\nmax_batch_size: 0\n'
          'input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }, { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] },'
          ' { name: "WAIT" data_type: TYPE_UINT32 dims: [ -1 ] } ]\n'
          'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]\n',
          {"model.py": REPEAT})
    return repo


MODELS = ["simple", ENSEMBLE, "bls_simple", "trace_context", "repeat_int32"]


def otel_args(port, *extra):
    args = PYTHON + ["--trace-config=level=TIMESTAMPS", "--trace-config=rate=1", "--trace-config=count=-1",
                     "--trace-config=mode=opentelemetry",
                     "--trace-config=opentelemetry,resource=test.key=test.value",
                     "--trace-config=opentelemetry,resource=service.name=test_triton",
                     f"--trace-config=opentelemetry,url=localhost:{port}/v1/traces"]
    return args + [f"--trace-config={e}" for e in extra]


def inputs(lib, binary=True):
    out = []
    for name in ("INPUT0", "INPUT1"):
        t = lib.InferInput(name, [1, 16], "INT32")
        t.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16), **({} if lib is grpcclient else
                                                                                 {"binary_data": binary}))
        out.append(t)
    return out


def send_bls(server, model_name=ENSEMBLE, headers=None):
    headers = dict(headers) if headers else None
    with httpclient.InferenceServerClient(server.http_url) as client:
        ins = inputs(httpclient)
        ins.append(httpclient.InferInput("MODEL_NAME", [1], "BYTES"))
        ins[-1].set_data_from_numpy(np.array([model_name], dtype=np.object_))
        client.infer("bls_simple", ins, headers=headers)


def read_lines(collector):
    text = collector.path.read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def wait_lines(collector, n, timeout=20.0, settle=1.5):
    """The collector's lines once it has written `n` (then `settle` s more for any stray one)."""
    deadline = time.monotonic() + timeout
    while len(read_lines(collector)) < n:
        assert time.monotonic() < deadline, f"{len(read_lines(collector))} collector lines, not {n}"
        time.sleep(0.1)
    time.sleep(settle)
    return read_lines(collector)


def spans_of(line):
    return line["resourceSpans"][0]["scopeSpans"][0]["spans"]


def nesting(spans):
    names = {s["spanId"]: s["name"] for s in spans}
    out = {}
    for s in spans:
        if s["parentSpanId"] in names:
            out.setdefault(names[s["parentSpanId"]], []).append(s["name"])
    return {k: sorted(v) for k, v in out.items()}


ROOT_EVENTS = {"http": ["HTTP_RECV_START", "HTTP_RECV_END", "INFER_RESPONSE_COMPLETE", "HTTP_SEND_START",
                        "HTTP_SEND_END"],
               "grpc": ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "INFER_RESPONSE_COMPLETE", "GRPC_SEND_START",
                        "GRPC_SEND_END"]}
MODEL_EVENTS = ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
COMPUTE_EVENTS = ["COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"]


def check_trace(collector, expected_tree, frontend, headers=None):
    """Triton's `_test_trace`: one collector line, its resource, the spans' events, their nesting,
    and the root's parent (the client's span, or none)."""
    lines = wait_lines(collector, 1)
    assert len(lines) == 1, lines
    resource = lines[0]["resourceSpans"][0]["resource"]["attributes"]
    assert {"key": "service.name", "value": {"stringValue": "test_triton"}} in resource
    assert {"key": "test.key", "value": {"stringValue": "test.value"}} in resource
    assert len(lines[0]["resourceSpans"]) == 1 and len(lines[0]["resourceSpans"][0]["scopeSpans"]) == 1, \
        "one request's spans in one OTLP request"
    scope = lines[0]["resourceSpans"][0]["scopeSpans"][0]["scope"]
    assert scope == {"name": "triton-server"}
    spans = spans_of(lines[0])
    assert nesting(spans) == expected_tree
    assert len(spans) == 1 + sum(len(v) for v in expected_tree.values())
    for s in spans:
        events = [e["name"] for e in s.get("events", [])]
        times = [int(e["timeUnixNano"]) for e in s.get("events", [])]
        assert times == sorted(times) and int(s["startTimeUnixNano"]) <= int(s["endTimeUnixNano"]), s
        assert s["kind"] == 2 and s["status"] == {}, s
        if s["name"] == "InferRequest":
            assert events == ROOT_EVENTS[frontend], events
        elif s["name"] == "compute":
            assert events == COMPUTE_EVENTS and "attributes" not in s, s
        else:
            assert events == MODEL_EVENTS, (s["name"], events)
            attrs = {a["key"]: a["value"] for a in s["attributes"]}
            assert attrs["triton.model_name"] == {"stringValue": s["name"]}
            assert attrs["triton.model_version"] == {"intValue": "1"}
            assert set(attrs) >= {"triton.trace_id", "triton.trace_parent_id"}
    assert len({s["traceId"] for s in spans}) == 1
    root = next(s for s in spans if s["name"] == "InferRequest")
    if headers:
        _, trace_id, span_id, _ = headers["traceparent"].split("-")
        assert (root["traceId"], root["parentSpanId"]) == (trace_id, span_id)
    else:
        assert root["parentSpanId"] == ""
    return spans


SIMPLE = {"InferRequest": ["simple"], "simple": ["compute"]}
ENSEMBLE_TREE = {"InferRequest": [ENSEMBLE], ENSEMBLE: ["simple"], "simple": ["compute"]}
BLS_TREE = {"InferRequest": ["bls_simple"], "bls_simple": sorted(["compute", ENSEMBLE]), ENSEMBLE: ["simple"],
            "simple": ["compute"]}


@pytest.fixture(scope="module")
def collector_port():
    return free_ports(1)[0]


@pytest.fixture
def collector(collector_port, tmp_path):
    """A fresh collector for each test (Triton's setUp starts otelcol for each)."""
    c = Collector(collector_port, tmp_path / "collected_traces.json", timeout=1.0).start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def otel_server(server_factory, tmp_path_factory, collector_port):
    repo = otel_repo(tmp_path_factory.mktemp("otel"))
    return server_factory([repo], otel_args(collector_port, "opentelemetry,bsp_schedule_delay=1000"),
                          name="otel", wait_models=MODELS)


@pytest.mark.parametrize("headers", [None, HEADERS], ids=["plain", "traceparent"])
def test_http_simple_model(otel_server, collector, headers):
    headers = dict(headers) if headers else None
    with httpclient.InferenceServerClient(otel_server.http_url) as client:
        client.infer("simple", inputs(httpclient), headers=headers, request_id="r1")
    spans = check_trace(collector, SIMPLE, "http", headers)
    model = next(s for s in spans if s["name"] == "simple")
    attrs = {a["key"]: a["value"] for a in model["attributes"]}
    assert attrs["triton.request_id"] == {"stringValue": "r1"} and attrs["triton.trace_parent_id"] == {"intValue": "0"}


@pytest.mark.parametrize("headers", [None, HEADERS], ids=["plain", "traceparent"])
def test_grpc_simple_model(otel_server, collector, headers):
    headers = dict(headers) if headers else None
    client = grpcclient.InferenceServerClient(otel_server.grpc_url)
    try:
        client.infer("simple", inputs(grpcclient), headers=headers)
    finally:
        client.close()
    check_trace(collector, SIMPLE, "grpc", headers)


@pytest.mark.parametrize("headers", [None, HEADERS], ids=["plain", "traceparent"])
def test_grpc_stream_simple_model(otel_server, collector, headers):
    """The stream's metadata is each of its requests' carrier."""
    headers = dict(headers) if headers else None
    client = grpcclient.InferenceServerClient(otel_server.grpc_url)
    answers = []
    try:
        client.start_stream(callback=lambda result, error: answers.append(error or result), headers=headers)
        client.async_stream_infer("simple", inputs(grpcclient))
        deadline = time.monotonic() + 10
        while not answers and time.monotonic() < deadline:
            time.sleep(0.05)
        client.stop_stream()
    finally:
        client.close()
    assert answers and not isinstance(answers[0], InferenceServerException)
    check_trace(collector, SIMPLE, "grpc", headers)


@pytest.mark.parametrize("headers", [None, HEADERS], ids=["plain", "traceparent"])
def test_http_ensemble(otel_server, collector, headers):
    headers = dict(headers) if headers else None
    with httpclient.InferenceServerClient(otel_server.http_url) as client:
        client.infer(ENSEMBLE, inputs(httpclient), headers=headers)
    check_trace(collector, ENSEMBLE_TREE, "http", headers)


@pytest.mark.parametrize("headers", [None, {"traceparent": PARENT, "tracestate": "k=v"}],
                         ids=["plain", "traceparent"])
def test_http_bls_calls_are_child_spans(otel_server, collector, headers):
    headers = dict(headers) if headers else None
    send_bls(otel_server, headers=headers)
    spans = check_trace(collector, BLS_TREE, "http", headers)
    if headers:
        assert {s.get("traceState") for s in spans} == {"k=v"}, "every span inherits the client's tracestate"


def test_grpc_non_decoupled_python_model(otel_server, collector):
    client = grpcclient.InferenceServerClient(otel_server.grpc_url)
    try:
        ins = []
        for name, dtype, value in (("IN", "INT32", np.int32), ("DELAY", "UINT32", np.uint32),
                                   ("WAIT", "UINT32", np.uint32)):
            ins.append(grpcclient.InferInput(name, [1], dtype))
            ins[-1].set_data_from_numpy(np.array([1 if name == "IN" else 0], dtype=value))
        r = client.infer("repeat_int32", ins)
    finally:
        client.close()
    assert (r.as_numpy("OUT")[0], r.as_numpy("IDX")[0]) == (1, 0)
    check_trace(collector, {"InferRequest": ["repeat_int32"], "repeat_int32": ["compute"]}, "grpc")


def context_of(server, headers=None, expect_none=False):
    with httpclient.InferenceServerClient(server.http_url) as client:
        t = httpclient.InferInput("expect_none", [1], "BOOL")
        t.set_data_from_numpy(np.array([expect_none]))
        r = client.infer("trace_context", [t], headers=dict(headers) if headers else None)
    return r.as_numpy("OUTPUT0")[0].decode()


def test_a_python_model_gets_its_spans_context(otel_server, collector):
    context = json.loads(context_of(otel_server))
    assert re.fullmatch(r"\d{2}-[0-9a-f]{32}-[0-9a-f]{16}-\d{2}", context["traceparent"]), context
    # With a client's context: its trace, the model span's id, its tracestate.
    context = json.loads(context_of(otel_server, {"traceparent": PARENT, "tracestate": "a=b"}))
    assert context["traceparent"].startswith("00-0af7651916cd43dd8448eb211c12666c-") and context["tracestate"] == "a=b"
    lines = wait_lines(collector, 1, settle=2.5)
    spans = [s for line in lines for rs in line["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    model = [s for s in spans if s["name"] == "trace_context" and s["traceId"] == "0af7651916cd43dd8448eb211c12666c"]
    assert [s["spanId"] for s in model] == [context["traceparent"].split("-")[2]]


def test_settings_api_in_opentelemetry_mode(otel_server, collector, collector_port):
    text = otel_server.get("/v2/models/bls_simple/trace/setting").body.decode()
    url = f"localhost:{collector_port}/v1/traces"
    assert text.startswith('{"trace_level":["TIMESTAMPS"],"trace_rate":"1","trace_count":"-1",'
                           '"trace_mode":"opentelemetry",'), text
    for part in ('"resource":"test.key=test.value","resource":"service.name=test_triton"', f'"url":"{url}"',
                 '"bsp_schedule_delay":"1000"', '"bsp_max_queue_size":"2048"', '"bsp_max_export_batch_size":"512"'):
        assert part in text, text
    assert '"trace_file":' not in text and '"log_frequency":' not in text
    grpc = grpcclient.InferenceServerClient(otel_server.grpc_url)
    try:
        got = grpc.get_trace_settings(as_json=True)["settings"]
        assert got["trace_mode"]["value"] == ["opentelemetry"]
        assert got["resource"]["value"] == ["test.key=test.value", "service.name=test_triton"]
        assert "trace_file" not in got and "log_frequency" not in got
        with pytest.raises(InferenceServerException) as e:
            grpc.update_trace_settings(settings={"trace_file": "/tmp/x"})
        assert e.value.status() == "StatusCode.UNIMPLEMENTED"
        assert "trace file location can not be updated through network protocol" in e.value.message()
    finally:
        grpc.close()
    r = otel_server.post("/v2/trace/setting", json.dumps({"trace_file": "/tmp/x"}).encode())
    assert r.status == 501 and "can not be updated" in r.json()["error"]
    # The mode and the OpenTelemetry settings cannot change at run time: ignored, as Triton ignores them.
    r = otel_server.post("/v2/trace/setting", json.dumps({"trace_mode": "triton", "url": "x",
                                                          "log_frequency": "2"}).encode())
    assert r.status == 200 and r.json()["trace_mode"] == "opentelemetry" and f'"url":"{url}"' in r.body.decode()
    r = otel_server.post("/v2/trace/setting", json.dumps({"trace_rate": "0"}).encode())
    assert r.status == 400 and "sample rate must be non-zero" in r.json()["error"]


def test_a_rate_change_and_requests_with_a_context(otel_server, collector):
    """Triton's test_http_trace_triggered, without its 10 s pauses: with rate 5 only the fifth
    request is traced; every request with a context is."""
    with httpclient.InferenceServerClient(otel_server.http_url) as client:
        client.update_trace_settings(settings={"trace_rate": "5"})
        try:
            assert client.get_trace_settings(model_name="simple")["trace_rate"] == "5"
            for _ in range(5):
                client.infer(ENSEMBLE, inputs(httpclient))
            lines = wait_lines(collector, 1, settle=2.5)
            assert len(lines) == 1 and len(spans_of(lines[0])) == 4
            for _ in range(3):
                client.infer(ENSEMBLE, inputs(httpclient), headers=dict(HEADERS))
            lines = wait_lines(collector, 2, settle=2.5)
            roots = [s for line in lines for rs in line["resourceSpans"] for s in rs["scopeSpans"][0]["spans"]
                     if s["name"] == "InferRequest"]
            assert sorted(r["parentSpanId"] for r in roots) == ["", "b7ad6b7169242424", "b7ad6b7169242424",
                                                                 "b7ad6b7169242424"]
        finally:
            client.update_trace_settings(settings={"trace_rate": "1"})
        assert client.get_trace_settings(model_name="simple")["trace_rate"] == "1"


def start_otel(fresh_server, tmp_path, port, *extra, models=("simple", ENSEMBLE, "bls_simple"), verbose=False):
    args = otel_args(port, *extra) + (["--log-verbose", "1"] if verbose else [])
    return fresh_server([otel_repo(tmp_path)], args, wait_models=list(models))


def test_rate_0_traces_only_requests_with_a_context(fresh_server, tmp_path, collector, collector_port):
    """L0_trace/test.sh's WAR run (rate=0), with the default batch processor (5 s): a traced BLS
    request's six spans go out in one OTLP request."""
    server = start_otel(fresh_server, tmp_path, collector_port, "rate=0")
    text = server.get("/v2/models/bls_simple/trace/setting").body.decode()
    for part in ('"trace_level":["TIMESTAMPS"]', '"trace_rate":"0"', '"trace_count":"-1"',
                 '"trace_mode":"opentelemetry"', '"bsp_max_export_batch_size":"512"', '"bsp_schedule_delay":"5000"',
                 '"bsp_max_queue_size":"2048"'):
        assert text.count(part) == 1, (part, text)
    for _ in range(10):
        send_bls(server)
    send_bls(server, headers=HEADERS)
    lines = wait_lines(collector, 1, timeout=20)
    assert len(lines) == 1 and len(lines[0]["resourceSpans"]) == 1
    assert text_count(lines, '"scopeSpans"') == 1
    assert len(spans_of(lines[0])) == 6 and nesting(spans_of(lines[0])) == BLS_TREE


def text_count(lines, what):
    return sum(json.dumps(line, separators=(",", ":")).count(what) for line in lines)


def test_count_1_then_only_requests_with_a_context(fresh_server, tmp_path, collector, collector_port):
    """L0_trace/test.sh's count=1 run: of 20 plain requests only the fifth is traced; then each
    request with a context is, in its own OTLP request, and plain ones are not."""
    server = start_otel(fresh_server, tmp_path, collector_port, "rate=5", "count=1",
                        "opentelemetry,bsp_schedule_delay=500")
    text = server.get("/v2/models/bls_simple/trace/setting").body.decode()
    assert '"trace_rate":"5"' in text and '"trace_count":"1"' in text
    for _ in range(20):
        send_bls(server)
    assert server.get_json("/v2/trace/setting")["trace_count"] == "0"
    time.sleep(2.5)
    for _ in range(3):
        send_bls(server, headers=HEADERS)
        send_bls(server)
        time.sleep(2.5)
    # test.sh counts the collector's lines with each (`grep -c`).
    raw = [json.dumps(line, separators=(",", ":")) for line in read_lines(collector)]
    assert len([line for line in raw if '"parentSpanId":""' in line]) == 1, raw
    assert len([line for line in raw if '"name":"InferRequest"' in line]) == 4, raw
    assert len([line for line in raw if '"parentSpanId":"b7ad6b7169242424"' in line]) == 3, raw


@pytest.mark.parametrize("setting,check", [
    ("bsp_max_queue_size=1", "dropped"),
    ("bsp_schedule_delay=0", "several"),
    ("bsp_max_export_batch_size=1", "six"),
])
def test_batch_span_processor_settings(fresh_server, tmp_path, collector, collector_port, setting, check):
    """L0_trace/test.sh's BSP runs: one BLS request (6 spans)."""
    server = start_otel(fresh_server, tmp_path, collector_port, f"opentelemetry,{setting}", verbose=True)
    send_bls(server)
    time.sleep(7)
    count = text_count(read_lines(collector), '"scopeSpans"')
    if check == "dropped":
        assert "BatchSpanProcessor queue is full - dropping span." in server.log_path.read_text()
    elif check == "several":
        assert count > 1
    else:
        assert count == 6


@pytest.mark.parametrize("env,flag,words", [
    ({"OTEL_BSP_MAX_QUEUE_SIZE": "bad_value"}, None, 'Bad option: "OTEL_BSP_MAX_QUEUE_SIZE"'),
    ({"OTEL_BSP_SCHEDULE_DELAY": "bad_value"}, None, 'Bad option: "OTEL_BSP_SCHEDULE_DELAY"'),
    ({"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "bad_value"}, None, 'Bad option: "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"'),
    ({}, "bsp_max_queue_size", 'Bad option: "--trace-config opentelemetry,bsp_max_queue_size"'),
    ({}, "bsp_schedule_delay", 'Bad option: "--trace-config opentelemetry,bsp_schedule_delay"'),
    ({}, "bsp_max_export_batch_size", 'Bad option: "--trace-config opentelemetry,bsp_max_export_batch_size"'),
])
def test_bad_batch_processor_settings_stop_the_start(mesh_bin, server_env, models_dir, tmp_path, env, flag, words):
    """L0_cmdline_trace: the server does not start, and its log says why in one line."""
    import shutil
    repo = tmp_path / "repo"
    shutil.copytree(models_dir / "simple" / "add_sub", repo / "add_sub")
    http, grpc, metrics = free_ports(3)
    cmd = [str(mesh_bin), "--model-repository", str(repo), "--http-port", str(http), "--grpc-port", str(grpc),
           "--metrics-port", str(metrics), "--trace-config", "mode=opentelemetry"]
    if flag:
        cmd += ["--trace-config", f"opentelemetry,{flag}=bad_value"]
    run = subprocess.run(cmd, env={**server_env, **env}, capture_output=True, text=True, timeout=60)
    log = run.stdout + run.stderr
    assert run.returncode != 0, log
    assert len([line for line in log.splitlines() if words in line]) == 1, log


def test_python_context_is_none_when_untraced(fresh_server, tmp_path):
    """L0_trace/test.sh's check_pbe_trace_context: trace file mode without a file, and
    OpenTelemetry mode with level OFF, give a Python model no context."""
    repo = otel_repo(tmp_path)
    for args in (["--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1", "--trace-config", "mode=triton"],
                 ["--trace-config", "level=OFF", "--trace-config", "rate=1", "--trace-config", "mode=opentelemetry"]):
        server = fresh_server([repo], PYTHON + args, wait_models=["trace_context"])
        assert context_of(server, HEADERS, expect_none=True) == ""
        server.stop()


# As Triton's qa/L0_trace/models/input_all_required (it sleeps while it runs), and its generated
# `dynamic_batch` (an identity model with dynamic batching, max_batch_size 1, that takes seconds),
# both Python here: Triton's tests cancel a gRPC request while the first runs and while the
# second queues behind another request.
SLEEPER = '''
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep({seconds})
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0")
                                                            .as_numpy())]) for r in requests]
'''
RUNS_S = 3.0
QUEUE_RUNS_S = 6.0


def cancel_repo(tmp_path):
    repo = tmp_path / "cancel"
    model(repo, "input_all_required", 'backend: "python"\nmax_batch_size: 0\ninput [ '
          + ", ".join(f'{{ name: "INPUT{i}" data_type: TYPE_FP32 dims: [ -1 ] }}' for i in range(3))
          + ' ]\noutput [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n',
          {"model.py": SLEEPER.format(seconds=RUNS_S)})
    model(repo, "dynamic_batch", 'backend: "python"\nmax_batch_size: 1\ndynamic_batching { }\n'
          'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
          'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n',
          {"model.py": SLEEPER.format(seconds=QUEUE_RUNS_S)})
    return repo


CANCEL_MODELS = ["input_all_required", "dynamic_batch"]


def fp32_inputs(names, batched=False):
    out = []
    for name in names:
        t = grpcclient.InferInput(name, [1, 4] if batched else [4], "FP32")
        t.set_data_from_numpy(np.ones((1, 4) if batched else 4, np.float32))
        out.append(t)
    return out


def all_required_inputs():
    return fp32_inputs(["INPUT0", "INPUT1", "INPUT2"])


def cancel_after(url, model_name, ins, seconds, request_id):
    """Triton's cancel tests: an async gRPC request, cancelled after `seconds`; the client sees
    CANCELLED."""
    client = grpcclient.InferenceServerClient(url)
    answers = []
    try:
        call = client.async_infer(model_name, ins, callback=lambda result, error: answers.append(error or result),
                                  request_id=request_id)
        time.sleep(seconds)
        call.cancel()
        deadline = time.monotonic() + 10
        while not answers and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        client.close()
    assert answers and isinstance(answers[0], InferenceServerException), answers
    assert "CANCELLED" in str(answers[0]), answers[0]


def in_background(url, model_name, ins, request_id):
    """A blocking gRPC request on its own thread (join it for its answer)."""
    out = []

    def run():
        client = grpcclient.InferenceServerClient(url)
        try:
            out.append(client.infer(model_name, ins, request_id=request_id))
        except InferenceServerException as e:
            out.append(e)
        finally:
            client.close()
    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def spans_by_request(lines):
    """Each request's spans (those of its trace), by the request id of its model span."""
    spans = [s for line in lines for rs in line["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    out = {}
    for s in spans:
        attrs = {a["key"]: a["value"] for a in s.get("attributes", [])}
        if "triton.request_id" in attrs:
            out[attrs["triton.request_id"]["stringValue"]] = [x for x in spans if x["traceId"] == s["traceId"]]
    return out


def events_of(span):
    return [e["name"] for e in span.get("events", [])]


@pytest.fixture(scope="module")
def cancel_server(server_factory, tmp_path_factory, collector_port):
    repo = cancel_repo(tmp_path_factory.mktemp("otel-cancel"))
    return server_factory([repo], otel_args(collector_port, "opentelemetry,bsp_schedule_delay=1000"),
                          name="otel-cancel", wait_models=CANCEL_MODELS)


def test_grpc_request_cancelled_while_it_runs_keeps_its_compute_span(cancel_server, collector):
    """Triton's test_grpc_trace_all_input_required_model_cancel: InferRequest, the model span and
    `compute` with its four events. The model ran its batch to the end: the compute span holds
    the real execution, past the cancellation."""
    cancelled_at = time.time_ns()
    cancel_after(cancel_server.grpc_url, "input_all_required", all_required_inputs(), 1.0, "cancelled")
    cancelled_at += 1_000_000_000
    lines = wait_lines(collector, 1, timeout=20)
    spans = spans_by_request(lines)["cancelled"]
    assert sorted(s["name"] for s in spans) == ["InferRequest", "compute", "input_all_required"], spans
    assert nesting(spans) == {"InferRequest": ["input_all_required"], "input_all_required": ["compute"]}
    by_name = {s["name"]: s for s in spans}
    compute = by_name["compute"]
    assert events_of(compute) == COMPUTE_EVENTS
    assert events_of(by_name["input_all_required"]) == MODEL_EVENTS
    assert events_of(by_name["InferRequest"]) == ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END"], \
        "a cancelled request's root has no answer"
    took = int(compute["endTimeUnixNano"]) - int(compute["startTimeUnixNano"])
    assert took >= (RUNS_S - 0.3) * 1e9, f"the compute's real end, {took} ns"
    assert int(compute["endTimeUnixNano"]) > cancelled_at
    for s in spans:
        times = [int(e["timeUnixNano"]) for e in s.get("events", [])]
        assert times == sorted(times), s


def test_grpc_request_cancelled_in_the_queue_has_no_compute_span(cancel_server, collector):
    """Triton's test_grpc_trace_model_cancel_in_queue: the request cancelled while it waits behind
    another is exported at once, as the model span and InferRequest only, before the spans of the
    request still running."""
    first, answer = in_background(cancel_server.grpc_url, "dynamic_batch", fp32_inputs(["INPUT0"], True), "first")
    try:
        time.sleep(1.0)
        cancel_after(cancel_server.grpc_url, "dynamic_batch", fp32_inputs(["INPUT0"], True), 0.2, "cancelled")
        lines = wait_lines(collector, 1, timeout=QUEUE_RUNS_S - 1.5, settle=0.2)
        assert list(spans_by_request(lines[:1])) == ["cancelled"], "the first line holds the cancelled request"
        spans = spans_by_request(lines)["cancelled"]
        assert sorted(s["name"] for s in spans) == ["InferRequest", "dynamic_batch"], spans
        by_name = {s["name"]: s for s in spans}
        assert events_of(by_name["dynamic_batch"]) == MODEL_EVENTS
        assert events_of(by_name["InferRequest"]) == ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END"]
    finally:
        first.join()
    assert not isinstance(answer[0], InferenceServerException), answer
    # The first request's own trace, with its compute (and nothing left for the next test).
    lines = wait_lines(collector, 2, timeout=20)
    assert sorted(s["name"] for s in spans_by_request(lines)["first"]) == ["InferRequest", "compute", "dynamic_batch"]


GENERATE = {"INPUT0": list(range(16)), "INPUT1": [1] * 16}


@pytest.mark.parametrize("endpoint", ["generate", "generate_stream"])
@pytest.mark.parametrize("headers", [None, HEADERS], ids=["plain", "traceparent"])
def test_generate_requests_have_the_http_events(otel_server, collector, endpoint, headers):
    """Triton samples generate and generate_stream requests as infer requests (http.cc), with the
    HTTP events on their root span and the client's traceparent."""
    r = otel_server.post(f"/v2/models/simple/{endpoint}", json.dumps(GENERATE).encode(),
                         headers=dict(headers) if headers else None)
    assert r.status == 200, r.body
    assert b"OUTPUT0" in r.body
    check_trace(collector, SIMPLE, "http", headers)
