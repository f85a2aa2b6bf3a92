"""HTTP behaviours of tritonserver 2.51, checked against it: raw binary request bodies
(Inference-Header-Content-Length: 0), chunked request bodies (plain, gzip, deflate), optional
inputs and Triton's input-count messages, the status codes of unready models and of load/unload
outside explicit mode, and the repository index in every control mode. Python models, so the same
repository runs on real Triton."""
import gzip
import http.client
import json
import shutil
import struct
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from mesh_util import HOST, deserialize_bytes, parse_infer_response, output_array

pytestmark = [pytest.mark.server]

PY_MODELS = Path(__file__).parent / "python_models"

# Copies each input to the output at the same position; inputs left out give no output.
IDENTITY = '''
import json
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.cfg = json.loads(args["model_config"])

    def execute(self, requests):
        answers = []
        for r in requests:
            outs = []
            for i, o in zip(self.cfg["input"], self.cfg["output"]):
                t = pb_utils.get_input_tensor_by_name(r, i["name"])
                if t is not None:
                    outs.append(pb_utils.Tensor(o["name"], t.as_numpy()))
            answers.append(pb_utils.InferenceResponse(outs))
        return answers
'''

MODELS = {
    "raw_var": 'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2, -1 ] } ]\n'
               'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2, -1 ] } ]',
    "raw_batch": 'max_batch_size: 8\ninput [ { name: "IN" data_type: TYPE_INT32 dims: [ 3 ] } ]\n'
                 'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 3 ] } ]',
    "raw_two_var": 'input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1, -1 ] } ]\n'
                   'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1, -1 ] } ]',
    "raw_two_in": 'input [ { name: "A" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
                  'output [ { name: "OA" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "OB" data_type: TYPE_FP32 dims: [ 1 ] } ]',
    "raw_str": 'max_batch_size: 4\ninput [ { name: "IN" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
               'output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]',
    "raw_str2": 'input [ { name: "IN" data_type: TYPE_STRING dims: [ 2 ] } ]\n'
                'output [ { name: "OUT" data_type: TYPE_STRING dims: [ 2 ] } ]',
    "opt": 'input [ { name: "A" data_type: TYPE_FP32 dims: [ 1 ] },\n'
           '        { name: "B" data_type: TYPE_FP32 dims: [ 1 ] optional: true },\n'
           '        { name: "C" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
           'output [ { name: "OA" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "OB" data_type: TYPE_FP32 dims: [ 1 ] },\n'
           '         { name: "OC" data_type: TYPE_FP32 dims: [ 1 ] } ]',
}
BROKEN = "broken_py"


def make_repo(root: Path) -> Path:
    repo = root / "repo"
    for name, io in MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(IDENTITY)
        (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n{io}\n')
    (repo / BROKEN / "1").mkdir(parents=True)
    (repo / BROKEN / "1" / "model.py").write_text('raise RuntimeError("boom at import")\n')
    (repo / BROKEN / "config.pbtxt").write_text(
        f'name: "{BROKEN}"\nbackend: "python"\n{MODELS["raw_var"]}\n')
    shutil.copytree(PY_MODELS / "repeat_py", repo / "repeat_py")
    return repo


def py_args():
    return ["--backend-config", f"python,interpreter={sys.executable}", "--exit-on-error", "false",
            "--strict-readiness", "false"]


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    return make_repo(tmp_path_factory.mktemp("http_triton"))


@pytest.fixture(scope="module")
def server(server_factory, repo):
    srv = server_factory([repo], py_args(), name="http_triton", wait_models=[*MODELS, "repeat_py"])
    srv.settle([BROKEN])
    return srv


def post(srv, path, body=b"", headers=None, chunks=None):
    """POST with http.client; `chunks` sends the body with Transfer-Encoding: chunked."""
    conn = http.client.HTTPConnection(HOST, srv.http_port, timeout=60)
    try:
        hdrs = dict(headers or {})
        if chunks is not None:
            conn.request("POST", path, body=iter(chunks), headers=hdrs, encode_chunked=True)
        else:
            conn.request("POST", path, body=body, headers=hdrs)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def error_of(body: bytes) -> str:
    return json.loads(body)["error"]


RAW = {"Inference-Header-Content-Length": "0"}


def raw_outputs(status, headers, body):
    assert status == 200, body
    n = int(headers["inference-header-content-length"])
    header = json.loads(body[:n])
    return header, body[n:]


# --------------------------------------------------------------------------
# Raw binary bodies
# --------------------------------------------------------------------------

def test_a_raw_body_is_the_one_input_its_variable_dimension_sized_from_the_bytes(server):
    data = np.arange(6, dtype=np.float32)
    header, blob = raw_outputs(*post(server, "/v2/models/raw_var/infer", data.tobytes(), RAW))
    # Every output comes back in binary, as Triton answers a raw request.
    assert header["outputs"] == [{"name": "OUT", "datatype": "FP32", "shape": [2, 3],
                                  "parameters": {"binary_data_size": 24}}]
    assert blob == data.tobytes()
    header, blob = raw_outputs(*post(server, "/v2/models/raw_var/versions/1/infer", b"", RAW))
    assert header["outputs"][0]["shape"] == [2, 0] and blob == b""


def test_a_raw_body_gets_a_batch_dimension_of_one_and_may_be_compressed(server):
    data = np.array([7, 8, 9], np.int32)
    header, blob = raw_outputs(*post(server, "/v2/models/raw_batch/infer", data.tobytes(), RAW))
    assert header["outputs"][0]["shape"] == [1, 3] and blob == data.tobytes()
    headers = {**RAW, "Content-Encoding": "gzip"}
    header, blob = raw_outputs(*post(server, "/v2/models/raw_batch/infer", gzip.compress(data.tobytes()), headers))
    assert blob == data.tobytes()


def test_a_raw_body_for_a_bytes_input_is_its_one_element(server):
    header, blob = raw_outputs(*post(server, "/v2/models/raw_str/infer", b"hello\0world", RAW))
    assert header["outputs"][0]["shape"] == [1, 1]
    assert deserialize_bytes(blob) == [b"hello\0world"]


@pytest.mark.parametrize("model,body,status,message", [
    ("raw_var", np.zeros(5, np.float32).tobytes(), 400,
     "input byte size mismatch for input 'IN' for model 'raw_var'. Expected 16, got 20"),
    ("raw_var", b"1234567", 400, "input byte size mismatch for input 'IN' for model 'raw_var'. Expected 0, got 7"),
    ("raw_batch", np.zeros(6, np.int32).tobytes(), 400,
     "input byte size mismatch for input 'IN' for model 'raw_batch'. Expected 12, got 24"),
    ("raw_two_var", np.zeros(4, np.float32).tobytes(), 400,
     "The shape of the raw input 'IN' can not be deduced because there are more than one variable-sized dimension"),
    ("raw_two_in", np.zeros(2, np.float32).tobytes(), 400,
     "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'raw_two_in' model configuration"),
    ("raw_str2", b"ab", 400, "For BYTE datatype raw input 'IN', the model must have input shape [1]"),
    ("nope", b"1234", 404, "unknown model: 'nope' is not found"),
])
def test_raw_bodies_that_cannot_be_deduced_get_tritons_errors(server, model, body, status, message):
    st, _, out = post(server, f"/v2/models/{model}/infer", body, RAW)
    assert st == status and message in error_of(out), out


# --------------------------------------------------------------------------
# Chunked request bodies
# --------------------------------------------------------------------------

def opt_body(a=1.5, c=2.5) -> bytes:
    return json.dumps({"inputs": [
        {"name": "A", "shape": [1], "datatype": "FP32", "data": [a]},
        {"name": "C", "shape": [1], "datatype": "FP32", "data": [c]},
    ]}).encode()


def pieces(data: bytes, n: int = 7):
    return [data[i:i + n] for i in range(0, len(data), n)]


@pytest.mark.parametrize("encoding", [None, "gzip", "deflate"])
def test_chunked_json_bodies_plain_and_compressed(server, encoding):
    body = opt_body()
    headers = {"Content-Type": "application/json"}
    if encoding == "gzip":
        body = gzip.compress(body)
    elif encoding == "deflate":
        body = zlib.compress(body)
    if encoding:
        headers["Content-Encoding"] = encoding
    st, _, out = post(server, "/v2/models/opt/infer", headers=headers, chunks=pieces(body))
    assert st == 200, out
    assert {o["name"]: o["data"] for o in json.loads(out)["outputs"]} == {"OA": [1.5], "OC": [2.5]}


def test_chunked_bodies_with_binary_tensors_and_raw_bodies(server):
    a, c = np.array([3.0], np.float32), np.array([4.0], np.float32)
    header = json.dumps({"inputs": [
        {"name": "A", "shape": [1], "datatype": "FP32", "parameters": {"binary_data_size": 4}},
        {"name": "C", "shape": [1], "datatype": "FP32", "parameters": {"binary_data_size": 4}},
    ], "parameters": {"binary_data_output": True}}).encode()
    body = header + a.tobytes() + c.tobytes()
    st, headers, out = post(server, "/v2/models/opt/infer", headers={"Inference-Header-Content-Length": str(len(header))},
                            chunks=pieces(body, 5))
    assert st == 200, out
    from mesh_util import Response
    hdr, blobs = parse_infer_response(Response(st, "", headers, out))
    assert output_array(hdr, blobs, "OC").tolist() == [4.0]
    data = np.arange(8, dtype=np.float32).tobytes()
    hdr, blob = raw_outputs(*post(server, "/v2/models/raw_var/infer", headers=RAW, chunks=pieces(data, 3)))
    assert hdr["outputs"][0]["shape"] == [2, 4] and blob == data


# --------------------------------------------------------------------------
# Optional inputs and Triton's input-count messages
# --------------------------------------------------------------------------

def infer_json(srv, model, names):
    body = json.dumps({"inputs": [{"name": n, "shape": [1], "datatype": "FP32", "data": [float(i)]}
                                  for i, n in enumerate(names)]})
    st, _, out = post(srv, f"/v2/models/{model}/infer", body.encode())
    return st, json.loads(out)


def test_optional_inputs_may_be_left_out(server):
    st, out = infer_json(server, "opt", ["A", "C"])
    assert st == 200 and [o["name"] for o in out["outputs"]] == ["OA", "OC"]
    st, out = infer_json(server, "opt", ["A", "B", "C"])
    assert st == 200 and [o["name"] for o in out["outputs"]] == ["OA", "OB", "OC"]


@pytest.mark.parametrize("model,names,message", [
    ("opt", ["A"], "expected number of inputs between 2 and 3 but got 1 inputs for model 'opt'. "
                   "Got input(s) ['A'], but missing required input(s) ['C']. Please provide all required input(s)."),
    ("opt", [], "expected number of inputs between 2 and 3 but got 0 inputs for model 'opt'. "
                "Got input(s) [], but missing required input(s) ['A','C']. Please provide all required input(s)."),
    ("opt", ["A", "B"], "Got input(s) ['A','B'], but missing required input(s) ['C']"),
    ("raw_two_in", ["A"], "expected 2 inputs but got 1 inputs for model 'raw_two_in'. "
                          "Got input(s) ['A'], but missing required input(s) ['B']."),
    ("raw_two_in", ["A", "B", "X"], "expected 2 inputs but got 3 inputs for model 'raw_two_in'. "
                                    "Got input(s) ['A','B','X']"),
    ("raw_two_in", ["A", "X"], "unexpected inference input 'X' for model 'raw_two_in'"),
    ("opt", ["A", "A", "C"], "input 'A' already exists in request"),
])
def test_wrong_inputs_get_tritons_messages(server, model, names, message):
    st, out = infer_json(server, model, names)
    assert st == 400 and message in out["error"], out


# --------------------------------------------------------------------------
# Status codes
# --------------------------------------------------------------------------

def test_a_model_that_is_not_ready_is_unavailable(server):
    st, _, out = post(server, f"/v2/models/{BROKEN}/infer", opt_body())
    assert st == 503 and "is not ready" in error_of(out), out
    g = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        t = grpcclient.InferInput("IN", [2, 1], "FP32")
        t.set_data_from_numpy(np.zeros((2, 1), np.float32))
        with pytest.raises(InferenceServerException) as e:
            g.infer(BROKEN, [t])
        assert e.value.status() == "StatusCode.UNAVAILABLE"
    finally:
        g.close()


def test_load_and_unload_outside_explicit_mode_are_unavailable(server):
    message = "explicit model load / unload is not allowed if polling is enabled"
    for path in ("/v2/repository/models/opt/load", "/v2/repository/models/opt/unload",
                 "/v2/repository/models/nope/load"):
        st, _, out = post(server, path)
        assert st == 503 and error_of(out) == message, (path, out)
    g = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for call in (g.load_model, g.unload_model):
            with pytest.raises(InferenceServerException) as e:
                call("opt")
            assert e.value.status() == "StatusCode.UNAVAILABLE" and message in e.value.message()
    finally:
        g.close()


# --------------------------------------------------------------------------
# The repository index in every control mode
# --------------------------------------------------------------------------

def index_of(srv):
    st, _, out = post(srv, "/v2/repository/index", b"{}")
    assert st == 200, out
    return {row["name"]: row for row in json.loads(out)}


def test_the_index_lists_every_model_with_state_and_reason_in_none_mode(server):
    rows = index_of(server)
    assert set(rows) == {*MODELS, "repeat_py", BROKEN}
    assert all(rows[m]["state"] == "READY" and rows[m]["version"] == "1" for m in MODELS)
    assert rows[BROKEN]["state"] == "UNAVAILABLE" and "boom at import" in rows[BROKEN]["reason"]
    g = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        grpc_rows = {m["name"]: m for m in g.get_model_repository_index(as_json=True)["models"]}
        assert grpc_rows[BROKEN]["state"] == "UNAVAILABLE" and "boom at import" in grpc_rows[BROKEN]["reason"]
        assert set(grpc_rows) == set(rows)
    finally:
        g.close()


def test_the_index_in_explicit_mode_lists_unloaded_models_too(fresh_server, tmp_path):
    repo = make_repo(tmp_path)
    srv = fresh_server([repo], [*py_args(), "--model-control-mode", "explicit", "--load-model", "opt",
                                "--load-model", "raw_var"], wait_models=["opt", "raw_var"])
    st, _, out = post(srv, "/v2/repository/models/raw_var/unload")
    assert st == 200, out
    deadline = time.time() + 30
    while index_of(srv)["raw_var"].get("state") != "UNAVAILABLE" and time.time() < deadline:
        time.sleep(0.1)
    rows = index_of(srv)
    assert set(rows) == {*MODELS, "repeat_py", BROKEN}
    assert rows["opt"]["state"] == "READY"
    # As Triton: unloaded → UNAVAILABLE "unloaded"; never loaded → the name alone.
    assert rows["raw_var"]["state"] == "UNAVAILABLE" and rows["raw_var"].get("reason") == "unloaded", rows["raw_var"]
    assert rows["raw_batch"].get("state", "") == "" and "version" not in rows["raw_batch"], rows["raw_batch"]


def test_the_index_in_poll_mode_lists_every_model(fresh_server, tmp_path):
    repo = make_repo(tmp_path)
    srv = fresh_server([repo], [*py_args(), "--model-control-mode", "poll", "--repository-poll-secs", "1"],
                       wait_models=list(MODELS))
    srv.settle([BROKEN])
    rows = index_of(srv)
    assert set(rows) == {*MODELS, "repeat_py", BROKEN}
    assert rows[BROKEN]["state"] == "UNAVAILABLE" and "boom at import" in rows[BROKEN]["reason"]
    st, _, out = post(srv, "/v2/repository/models/opt/load")
    assert st == 503, out


def test_an_onnx_input_with_a_default_is_optional(fresh_server, tmp_path):
    """A graph input backed by an initializer (ONNX Runtime's overridable initializer) is a config
    input with `optional: true`: left out, the model uses its default."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    graph = helper.make_graph(
        [helper.make_node("Add", ["A", "B"], ["Y"])], "opt_onnx",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1]),
         helper.make_tensor_value_info("B", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1])],
        [numpy_helper.from_array(np.array([10.0], np.float32), "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    (tmp_path / "repo" / "opt_onnx" / "1").mkdir(parents=True)
    onnx.save(model, str(tmp_path / "repo" / "opt_onnx" / "1" / "model.onnx"))
    (tmp_path / "repo" / "opt_onnx" / "config.pbtxt").write_text(
        'name: "opt_onnx"\nplatform: "onnxruntime_onnx"\n'
        'input [ { name: "A" data_type: TYPE_FP32 dims: [ 1 ] }, '
        '{ name: "B" data_type: TYPE_FP32 dims: [ 1 ] optional: true } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n')
    srv = fresh_server([tmp_path / "repo"])
    st, out = infer_json(srv, "opt_onnx", ["A"])  # A = 0.0
    assert st == 200 and out["outputs"][0]["data"] == [10.0], out
    st, out = infer_json(srv, "opt_onnx", ["B", "A"])  # B = 0.0, A = 1.0
    assert st == 200 and out["outputs"][0]["data"] == [1.0], out
    st, out = infer_json(srv, "opt_onnx", [])
    assert st == 400 and "missing required input(s) ['A']" in out["error"], out
