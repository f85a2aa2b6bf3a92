"""Triton's generate extension over plain HTTP: `generate` (one JSON answer) and `generate_stream`
(server-sent events), JSON fields mapped to inputs and parameters, outputs mapped back to fields;
a decoupled Python model streams each answer as an event, errors come as `{"error": ...}` events
or, when the request fails as a whole, as an error response. Checked against tritonserver 2.51."""
import http.client
import json
import shutil
import sys
from pathlib import Path

import pytest

from mesh_util import HOST

pytestmark = [pytest.mark.server]

PY_MODELS = Path(__file__).parent / "python_models"

ECHO = '''
import json
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        answers = []
        for r in requests:
            text = pb_utils.get_input_tensor_by_name(r, "TEXT").as_numpy()
            n = pb_utils.get_input_tensor_by_name(r, "N").as_numpy()
            params = json.loads(r.parameters())
            answers.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", text),
                pb_utils.Tensor("TWICE", n * 2),
                pb_utils.Tensor("PARAMS", __import__("numpy").array([json.dumps(params, sort_keys=True).encode()],
                                                                   dtype=object)),
            ]))
        return answers
'''
ECHO_CONFIG = '''name: "echo_gen"
backend: "python"
max_batch_size: 4
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }, { name: "N" data_type: TYPE_INT64 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] }, { name: "TWICE" data_type: TYPE_INT64 dims: [ -1 ] },
         { name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] } ]
'''


@pytest.fixture(scope="module")
def server(server_factory, tmp_path_factory):
    repo = tmp_path_factory.mktemp("generate") / "repo"
    for name in ("repeat_py", "add_sub_py"):
        shutil.copytree(PY_MODELS / name, repo / name)
    (repo / "echo_gen" / "1").mkdir(parents=True)
    (repo / "echo_gen" / "1" / "model.py").write_text(ECHO)
    (repo / "echo_gen" / "config.pbtxt").write_text(ECHO_CONFIG)
    args = ["--backend-config", f"python,interpreter={sys.executable}"]
    return server_factory([repo], args, name="generate", wait_models=["repeat_py", "add_sub_py", "echo_gen"])


def post(srv, path, body):
    conn = http.client.HTTPConnection(HOST, srv.http_port, timeout=60)
    try:
        conn.request("POST", path, body=json.dumps(body) if not isinstance(body, bytes) else body,
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, r.getheader("Content-Type"), r.read()
    finally:
        conn.close()


def events(body: bytes) -> list[dict]:
    """The `data:` events of a server-sent event stream, each parsed as JSON."""
    text = body.decode()
    assert text == "" or text.endswith("\n\n"), text
    out = []
    for block in filter(None, text.split("\n\n")):
        assert block.startswith("data: "), block
        out.append(json.loads(block[len("data: "):]))
    return out


def test_generate_maps_fields_to_inputs_and_parameters_and_outputs_back(server):
    st, ctype, body = post(server, "/v2/models/echo_gen/generate",
                           {"TEXT": "hello", "N": [1, 2, 3], "temperature": 0.5, "top_k": 3, "stream": False,
                            "tag": "x", "id": "req-1"})
    assert st == 200 and ctype == "application/json", body
    out = json.loads(body)
    assert out["OUT"] == "hello"  # a one-element BYTES tensor → a string
    assert out["TWICE"] == [2, 4, 6]
    assert json.loads(out["PARAMS"]) == {"stream": False, "tag": "x", "temperature": 0.5, "top_k": 3}
    assert out["model_name"] == "echo_gen" and out["model_version"] == "1" and out["id"] == "req-1"
    st, _, body = post(server, "/v2/models/echo_gen/versions/1/generate", {"TEXT": ["a"], "N": 4})
    out = json.loads(body)
    assert st == 200 and out["TWICE"] == 8 and out["OUT"] == "a" and "id" not in out


def test_generate_stream_of_a_decoupled_model_sends_each_answer_as_an_event(server):
    st, ctype, body = post(server, "/v2/models/repeat_py/generate_stream", {"IN": [4, 5, 6]})
    assert st == 200 and ctype.startswith("text/event-stream"), body
    assert events(body) == [{"IDX": i, "OUT": v, "model_name": "repeat_py", "model_version": "1"}
                            for i, v in enumerate([4, 5, 6])]
    st, _, body = post(server, "/v2/models/repeat_py/generate_stream", {"IN": 9, "mode": "thread"})
    assert st == 200 and [e["OUT"] for e in events(body)] == [9]


def test_generate_stream_with_no_answers_is_an_empty_stream(server):
    st, ctype, body = post(server, "/v2/models/repeat_py/generate_stream", {"IN": []})
    assert st == 200 and ctype.startswith("text/event-stream") and body == b""


def test_an_error_answer_mid_stream_is_an_error_event_and_the_stream_goes_on(server):
    st, _, body = post(server, "/v2/models/repeat_py/generate_stream", {"IN": [1, 2, 3], "error_at": 1})
    assert st == 200
    got = events(body)
    assert got[0]["OUT"] == 1 and got[2]["OUT"] == 3
    assert got[1] == {"error": "no answer for element 1"}


def test_a_model_that_fails_the_whole_request_answers_an_error(server):
    """Triton's generate_stream_response_error: when the model's first answer is an error, the HTTP
    status says so and the error is the stream's one event (a request refused before it runs is
    JSON instead: test_bad_generate_requests_are_refused_before_any_event)."""
    st, ctype, body = post(server, "/v2/models/repeat_py/generate_stream", {"IN": [1], "mode": "raise"})
    assert st >= 400 and ctype == "text/event-stream; charset=utf-8", (st, ctype, body)
    (only,) = events(body)
    assert "asked to fail" in only["error"], body
    st, ctype, body = post(server, "/v2/models/repeat_py/generate", {"IN": [1], "mode": "raise"})
    assert st >= 400 and ctype == "application/json" and "asked to fail" in json.loads(body)["error"], body


def test_plain_models_serve_both_endpoints(server):
    body = {"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1]}
    st, _, out = post(server, "/v2/models/add_sub_py/generate", body)
    assert st == 200 and json.loads(out)["OUTPUT0"] == [2.0, 3.0, 4.0, 5.0], out
    st, ctype, out = post(server, "/v2/models/add_sub_py/generate_stream", body)
    assert st == 200 and ctype.startswith("text/event-stream")
    (only,) = events(out)
    assert only["OUTPUT1"] == [0.0, 1.0, 2.0, 3.0]


def test_generate_refuses_a_decoupled_model_that_answers_more_than_once(server):
    st, _, out = post(server, "/v2/models/repeat_py/generate", {"IN": [1, 2]})
    assert st == 400 and json.loads(out)["error"] == (
        "generate expects model to produce exactly 1 response, use generate stream for model that generates "
        "various number of responses")
    st, _, out = post(server, "/v2/models/repeat_py/generate", {"IN": [7]})
    assert st == 200 and json.loads(out)["OUT"] == 7


@pytest.mark.parametrize("endpoint", ["generate", "generate_stream"])
@pytest.mark.parametrize("body,status,message", [
    ({"IN": [1], "p": [1, 2]}, 400, "parameter 'p' has invalid type. It should be either 'int', 'bool', or 'string'."),
    ({"IN": [1], "p": {"a": 1}}, 400, "parameter 'p' has invalid type"),
    ({"X": 1}, 400, "expected 1 inputs but got 0 inputs for model 'repeat_py'. Got input(s) [], "
                    "but missing required input(s) ['IN']"),
    ({"IN": "abc"}, 400, "input 'IN': invalid INT32 data: string value in INT32 data"),
    ({"IN": [[1, 2]]}, 400, "input 'IN': a generate field must be a scalar or a flat list of values"),
    (b"[1]", 400, "the generate request must be a JSON object"),
    (b"{nope", 400, "failed to parse the request JSON buffer"),
    # Triton's words, from its generate endpoint test (fields are read in the order given).
    (b'{"IN": [1], "mode": "x", "IN": [2]}', 400, "input 'IN' already exists in request"),
    ({"IN": [1], "parameters": 1}, 400, "Expected JSON object for keyword: 'parameters'"),
    ({"IN": [1], "parameters": {"nested": {"twice": 1}}}, 400,
     "Converting keyword: 'parameters': parameter 'nested' has invalid type."),
])
def test_bad_generate_requests_are_refused_before_any_event(server, endpoint, body, status, message):
    st, ctype, out = post(server, f"/v2/models/repeat_py/{endpoint}", body)
    assert st == status and ctype == "application/json" and message in json.loads(out)["error"], out


def test_unknown_models_are_not_found(server):
    st, _, out = post(server, "/v2/models/nope/generate_stream", {"IN": 1})
    assert st == 404 and "nope" in json.loads(out)["error"]


@pytest.mark.parametrize("endpoint", ["generate", "generate_stream"])
def test_the_parameters_keyword_and_other_fields_reach_the_model_as_parameters(server, endpoint):
    body = {"TEXT": "hi", "N": [1], "top": 5, "parameters": {"temperature": 0.5, "greedy": True}}
    st, _, out = post(server, f"/v2/models/echo_gen/{endpoint}", body)
    assert st == 200, out
    answer = json.loads(out) if endpoint == "generate" else events(out)[0]
    assert json.loads(answer["PARAMS"]) == {"greedy": True, "temperature": 0.5, "top": 5}


def test_wrong_json_types_for_string_and_bool_inputs_are_tritons_words(server):
    st, ctype, out = post(server, "/v2/models/echo_gen/generate_stream", {"TEXT": 123, "N": [1]})
    assert st == 400 and ctype == "application/json"
    assert "attempt to access JSON non-string as string" in json.loads(out)["error"]
