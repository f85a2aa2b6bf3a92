"""Ensembles with a decoupled step (issue 16, item 0): each answer of the decoupled step goes on
through the steps after it and is one answer of the ensemble, on the gRPC stream; single-answer
paths refuse such an ensemble as they refuse decoupled models. A step that leaves an optional
output out does not fail the ensemble."""
import json
import queue
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from cluster_util import wait_until

pytestmark = [pytest.mark.server]

PY_MODELS = Path(__file__).parent / "python_models"

STEP = ('{{ model_name: "{model}" model_version: -1 {maps} }}')


def maps(kind, pairs):
    return " ".join(f'{kind} {{ key: "{k}" value: "{v}" }}' for k, v in pairs.items())


def ensemble(name, inputs, outputs, steps):
    text = [f'name: "{name}"', 'platform: "ensemble"', f"input [ {inputs} ]", f"output [ {outputs} ]",
            "ensemble_scheduling { step [ " + ", ".join(
                STEP.format(model=m, maps=maps("input_map", i) + " " + maps("output_map", o)) for m, i, o in steps)
            + " ] }"]
    return "\n".join(text) + "\n"


@pytest.fixture(scope="module")
def server(server_factory, tmp_path_factory):
    repo = tmp_path_factory.mktemp("ensemble_stream") / "repo"
    for name in ("repeat_py", "twice_py", "add_sub_py"):
        shutil.copytree(PY_MODELS / name, repo / name)
    out = '{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }'
    idx = '{ name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }'
    (repo / "repeat_twice" / "1").mkdir(parents=True)
    (repo / "repeat_twice" / "config.pbtxt").write_text(ensemble(
        "repeat_twice", '{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }', f"{out}, {idx}",
        [("repeat_py", {"IN": "IN"}, {"OUT": "each", "IDX": "IDX"}),
         ("twice_py", {"X": "each"}, {"Y": "OUT", "EXTRA": "extra"})]))
    (repo / "twice_only" / "1").mkdir(parents=True)
    (repo / "twice_only" / "config.pbtxt").write_text(ensemble(
        "twice_only", '{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }', out,
        [("twice_py", {"X": "IN"}, {"Y": "OUT", "EXTRA": "extra"})]))
    args = ["--backend-config", f"python,interpreter={sys.executable}"]
    return server_factory([repo], args, name="ensemble-stream",
                          wait_models=["repeat_py", "twice_py", "repeat_twice", "twice_only"])


def ints(name, values, client=grpcclient):
    t = client.InferInput(name, [len(values)], "INT32")
    t.set_data_from_numpy(np.array(values, np.int32))
    return t


def stream_answers(server, model, inputs, **kw):
    answers = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    got = []
    try:
        client.async_stream_infer(model, inputs, enable_empty_final_response=True, **kw)
        while True:
            result, error = answers.get(timeout=30)
            if error is not None:
                got.append(error)
                break
            final = result.get_response().parameters["triton_final_response"].bool_param
            if result.as_numpy("OUT") is not None:
                got.append(result)
            if final:
                break
    finally:
        client.stop_stream()
    return got


def test_each_answer_of_the_decoupled_step_is_an_answer_of_the_ensemble(server):
    got = stream_answers(server, "repeat_twice", [ints("IN", [3, 5, 7])])
    pairs = sorted((int(r.as_numpy("IDX")[0]), int(r.as_numpy("OUT")[0])) for r in got)
    assert pairs == [(0, 6), (1, 10), (2, 14)]
    # The ensemble records its success as its stream ends, which may be just after the client saw the end.
    successes = lambda: server.get_json("/v2/models/repeat_twice/stats")["model_stats"][0][  # noqa: E731
        "inference_stats"]["success"]["count"]
    wait_until(lambda: successes() >= 1, 30, lambda: f"the ensemble's success in its statistics: {successes()}")


def test_an_error_of_the_decoupled_step_ends_the_ensembles_stream_with_it(server):
    got = stream_answers(server, "repeat_twice", [ints("IN", [1, 2])], parameters={"mode": "raise"})
    assert len(got) == 1 and "asked to fail" in got[0].message(), got
    assert "step 0 (model 'repeat_py')" in got[0].message()


def test_single_answer_paths_refuse_an_ensemble_with_a_decoupled_step(server):
    body = json.dumps({"inputs": [{"name": "IN", "datatype": "INT32", "shape": [2], "data": [1, 2]}]}).encode()
    r = server.post("/v2/models/repeat_twice/infer", body)
    assert r.status == 501, (r.status, r.body)
    assert "decoupled" in json.loads(r.body)["error"]


def test_a_step_that_leaves_an_optional_output_out_does_not_fail_the_ensemble(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    result = client.infer("twice_only", [ints("IN", [21])])
    assert int(result.as_numpy("OUT")[0]) == 42


def test_generate_stream_streams_an_ensemble_with_a_decoupled_step(server):
    r = server.post("/v2/models/repeat_twice/generate_stream", json.dumps({"IN": [4, 9]}).encode())
    assert r.status == 200, (r.status, r.body)
    events = [json.loads(line[len("data: "):]) for line in r.body.decode().splitlines() if line.startswith("data: ")]
    assert sorted((e["IDX"], e["OUT"]) for e in events) == [(0, 8), (1, 18)], events


def test_an_ensemble_with_a_decoupled_step_refuses_the_response_cache(fresh_server, tmp_path):
    """As Triton (L0_response_cache's ensemble_cache_composing_decoupled): a decoupled step makes
    the ensemble decoupled, so `response_cache { enable: true }` on it fails its load with Triton's
    words; the models it calls keep serving."""
    repo = tmp_path / "repo"
    for name in ("repeat_py", "twice_py"):
        shutil.copytree(PY_MODELS / name, repo / name)
    (repo / "cached" / "1").mkdir(parents=True)
    (repo / "cached" / "config.pbtxt").write_text(ensemble(
        "cached", '{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }',
        '{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }',
        [("repeat_py", {"IN": "IN"}, {"OUT": "each", "IDX": "IDX"}),
         ("twice_py", {"X": "each"}, {"Y": "OUT", "EXTRA": "extra"})]) + "response_cache { enable: true }\n")
    srv = fresh_server([repo], ["--backend-config", f"python,interpreter={sys.executable}",
                                "--cache-config", "local,size=1048576"], wait_models=["repeat_py", "twice_py"])
    want = ("Response Cache does not currently support model cached with 'decoupled' transaction policy. "
            "Please disable the response cache.")
    wait_until(lambda: any(r["name"] == "cached" and want in r.get("reason", "") for r in srv.index()), 60,
               "the ensemble's load to fail with Triton's words")
    assert {r["name"]: r.get("state") for r in srv.index()}["repeat_py"] == "READY"
