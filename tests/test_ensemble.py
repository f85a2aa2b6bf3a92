"""Triton ensembles through tritonclient: the data-pipeline tutorial's five dtypes through two Python
steps, branches that really overlap, every validation error in the repository index, a step that
fails mid-request, statistics per model, timeouts, and explicit-mode loading with unload_dependents."""
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.server]

PY_ARGS = ["--backend-config", f"python,interpreter={sys.executable}"]

FIRST = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Step one of the data pipeline: one change per dtype."""

    def execute(self, requests):
        out = []
        for r in requests:
            get = lambda n: pb_utils.get_input_tensor_by_name(r, n).as_numpy()
            text = np.array([t.upper() for t in get("TEXT").reshape(-1)], dtype=np.object_)
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("TEXT_OUT", text),
                pb_utils.Tensor("U8_OUT", (get("U8") + 1).astype(np.uint8)),
                pb_utils.Tensor("I8_OUT", (-get("I8")).astype(np.int8)),
                pb_utils.Tensor("IMAGE_OUT", (get("IMAGE") / 255.0).astype(np.float32)),
                pb_utils.Tensor("FLAG_OUT", np.logical_not(get("FLAG"))),
            ]))
        return out
'''

SECOND = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Step two of the data pipeline."""

    def execute(self, requests):
        out = []
        for r in requests:
            get = lambda n: pb_utils.get_input_tensor_by_name(r, n).as_numpy()
            text = np.array([t + b"!" for t in get("TEXT").reshape(-1)], dtype=np.object_)
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("TEXT_OUT", text),
                pb_utils.Tensor("U8_OUT", (get("U8") * 2).astype(np.uint8)),
                pb_utils.Tensor("I8_OUT", (get("I8") + 1).astype(np.int8)),
                pb_utils.Tensor("IMAGE_OUT", get("IMAGE").mean(axis=2).astype(np.float32)),
                pb_utils.Tensor("FLAG_OUT", get("FLAG").copy()),
            ]))
        return out
'''

STAMP = '''
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

NAME, MARKERS = @NAME@, @MARKERS@


class TritonPythonModel:
    """Sleeps, then answers Y = X + 1 and when it started and ended (wall clock, s). With X >= 1000
    the branch steps (stamp_a, stamp_b) meet at a barrier instead of sleeping: each leaves a marker
    named X and its own name, then waits (up to 30 s) for the other branch's; a branch that waits in
    vain fails, so branches run one after the other fail the request whatever the timing."""

    def execute(self, requests):
        out = []
        for r in requests:
            start = time.time()
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            if x[0] >= 1000 and NAME in ("stamp_a", "stamp_b"):
                key = str(int(x[0]))
                open(os.path.join(MARKERS, f"{key}.{NAME}"), "w").close()
                other = os.path.join(MARKERS, f"{key}.{'stamp_b' if NAME == 'stamp_a' else 'stamp_a'}")
                deadline = time.monotonic() + 30
                while not os.path.exists(other):
                    if time.monotonic() > deadline:
                        raise pb_utils.TritonModelException(f"{NAME}: the other branch never started")
                    time.sleep(0.01)
            else:
                time.sleep(0.3)
            if x[0] < 0:
                raise pb_utils.TritonModelException("negative input")
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", x + 1), pb_utils.Tensor("T", np.array([start, time.time()]))]))
        return out
'''

TYPES = [("TEXT", "TYPE_STRING", "[ -1 ]"), ("U8", "TYPE_UINT8", "[ -1 ]"), ("I8", "TYPE_INT8", "[ -1 ]"),
         ("IMAGE", "TYPE_FP32", "[ -1, -1, 3 ]"), ("FLAG", "TYPE_BOOL", "[ 1 ]")]


def io(kind, specs):
    return f"{kind} [ " + ", ".join(f'{{ name: "{n}" data_type: {t} dims: {d} }}' for n, t, d in specs) + " ]"


def step(model, inputs, outputs):
    maps = [f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items()]
    maps += [f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items()]
    return f'{{ model_name: "{model}" model_version: -1 {" ".join(maps)} }}'


def add_model(repo: Path, name, config, code=None):
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(f'name: "{name}"\n{config}\n')
    if code:
        (repo / name / "1" / "model.py").write_text(textwrap.dedent(code))


def ensemble(repo, name, inputs, outputs, steps):
    add_model(repo, name, f'platform: "ensemble"\n{io("input", inputs)}\n{io("output", outputs)}\n'
                          f'ensemble_scheduling {{ step [ {", ".join(steps)} ] }}')


X = [("X", "TYPE_FP32", "[ 1 ]")]


def build_repo(repo: Path):
    stage_io = io("input", TYPES) + "\n" + io("output", [(n + "_OUT", t, d) for n, t, d in TYPES])
    add_model(repo, "pipeline_first", f'backend: "python"\n{stage_io}', FIRST)
    add_model(repo, "pipeline_second", f'backend: "python"\n{stage_io}', SECOND)
    ensemble(repo, "data_pipeline", TYPES, [(n + "_FINAL", t, d) for n, t, d in TYPES], [
        step("pipeline_first", {n: n for n, _, _ in TYPES}, {n + "_OUT": n + "_MID" for n, _, _ in TYPES}),
        step("pipeline_second", {n: n + "_MID" for n, _, _ in TYPES}, {n + "_OUT": n + "_FINAL" for n, _, _ in TYPES}),
    ])
    stamp_io = io("input", X) + "\n" + io("output", [("Y", "TYPE_FP32", "[ 1 ]"), ("T", "TYPE_FP64", "[ 2 ]")])
    markers = repo.parent / "stamp_markers"
    markers.mkdir(parents=True, exist_ok=True)
    for name in ("stamp_a", "stamp_b", "stamp_c"):
        add_model(repo, name, f'backend: "python"\n{stamp_io}',
                  STAMP.replace("@NAME@", repr(name)).replace("@MARKERS@", repr(str(markers))))
    # Two branches from X, then a join that fails on negative input: Y = (X + 1) + 1.
    ensemble(repo, "branches", X, [("TA", "TYPE_FP64", "[ 2 ]"), ("TB", "TYPE_FP64", "[ 2 ]"),
                                   ("Y", "TYPE_FP32", "[ 1 ]")], [
        step("stamp_a", {"X": "X"}, {"Y": "A", "T": "TA"}),
        step("stamp_b", {"X": "X"}, {"T": "TB"}),
        step("stamp_c", {"X": "A"}, {"Y": "Y"}),
    ])
    broken = {
        "bad_unknown_model": [step("no_such_model", {"X": "X"}, {"Y": "Y"})],
        "bad_never_produced": [step("stamp_a", {"X": "NOWHERE"}, {"Y": "Y"})],
        "bad_produced_twice": [step("stamp_a", {"X": "X"}, {"Y": "Y"}), step("stamp_b", {"X": "X"}, {"Y": "Y"})],
        "bad_dtype": [step("pipeline_first", {"U8": "X", "TEXT": "X", "I8": "X", "IMAGE": "X", "FLAG": "X"},
                           {"U8_OUT": "Y"})],
        "bad_cycle": [step("stamp_a", {"X": "B"}, {"Y": "A"}), step("stamp_b", {"X": "A"}, {"Y": "B"}),
                      step("stamp_c", {"X": "X"}, {"Y": "Y"})],
        "bad_no_output": [step("stamp_a", {"X": "X"}, {"Y": "Z"})],
    }
    for name, steps in broken.items():
        ensemble(repo, name, X, [("Y", "TYPE_FP32", "[ 1 ]")], steps)


SERVING = ["data_pipeline", "pipeline_first", "pipeline_second", "branches", "stamp_a", "stamp_b", "stamp_c"]


@pytest.fixture(scope="module")
def server(server_factory, tmp_path_factory):
    repo = tmp_path_factory.mktemp("ensembles") / "repo"
    build_repo(repo)
    srv = server_factory([repo], PY_ARGS + ["--strict-readiness", "false"], name="ensembles", wait_models=SERVING)
    srv.repo = repo
    return srv


@pytest.fixture
def http(server):
    c = httpclient.InferenceServerClient(server.http_url)
    yield c
    c.close()


def tensor(mod, name, array, dtype):
    t = mod.InferInput(name, list(array.shape), dtype)
    t.set_data_from_numpy(array)
    return t


def pipeline_inputs(mod):
    image = np.arange(2 * 2 * 3, dtype=np.float32).reshape(2, 2, 3) * 10
    return image, [
        tensor(mod, "TEXT", np.array([b"abc", "zé".encode()], dtype=np.object_), "BYTES"),
        tensor(mod, "U8", np.array([0, 127, 255], np.uint8), "UINT8"),
        tensor(mod, "I8", np.array([-128, -1, 5], np.int8), "INT8"),
        tensor(mod, "IMAGE", image, "FP32"),
        tensor(mod, "FLAG", np.array([True]), "BOOL"),
    ]


@pytest.mark.parametrize("mod", [httpclient, grpcclient], ids=["http", "grpc"])
def test_the_data_pipeline_carries_five_dtypes_through_two_steps(server, mod):
    c = mod.InferenceServerClient(server.http_url if mod is httpclient else server.grpc_url)
    try:
        image, inputs = pipeline_inputs(mod)
        r = c.infer("data_pipeline", inputs)
        assert list(r.as_numpy("TEXT_FINAL")) == [b"ABC!", "Zé".encode() + b"!"]
        np.testing.assert_array_equal(r.as_numpy("U8_FINAL"), np.array([2, 0, 0], np.uint8))  # (x+1)*2 wraps
        np.testing.assert_array_equal(r.as_numpy("I8_FINAL"), np.array([-127, 2, -4], np.int8))  # -x+1, -(-128) wraps
        np.testing.assert_allclose(r.as_numpy("IMAGE_FINAL"), (image / 255).mean(axis=2), rtol=1e-6)
        np.testing.assert_array_equal(r.as_numpy("FLAG_FINAL"), [False])
    finally:
        c.close()


def test_independent_branches_overlap(http):
    """X >= 1000: each branch waits at a barrier until the other has started, so the request answers
    only if both ran at once (each started before the other ended)."""
    r = http.infer("branches", [tensor(httpclient, "X", np.array([1000.0], np.float32), "FP32")])
    (a_start, a_end), (b_start, b_end) = r.as_numpy("TA"), r.as_numpy("TB")
    assert a_start < b_end and b_start < a_end, f"branch A ran {a_start}..{a_end}, B {b_start}..{b_end}"
    np.testing.assert_array_equal(r.as_numpy("Y"), [1002.0])


def test_each_model_keeps_its_statistics_and_the_ensemble_its_own(http):
    count = lambda m: int(http.get_inference_statistics(m)["model_stats"][0]["inference_count"])
    before = {m: count(m) for m in ("branches", "stamp_a", "stamp_b", "stamp_c")}
    http.infer("branches", [tensor(httpclient, "X", np.array([2.0], np.float32), "FP32")])
    after = {m: count(m) for m in before}
    assert {m: after[m] - before[m] for m in before} == {m: 1 for m in before}


def test_a_failing_step_fails_the_request_naming_step_and_model(http):
    with pytest.raises(InferenceServerException) as e:
        http.infer("branches", [tensor(httpclient, "X", np.array([-5.0], np.float32), "FP32")])
    message = str(e.value)
    assert "ensemble 'branches' step" in message and "stamp_" in message and "negative input" in message
    assert http.infer("branches", [tensor(httpclient, "X", np.array([0.0], np.float32), "FP32")]) \
        .as_numpy("Y")[0] == 2.0, "the ensemble keeps serving"


def join_count(c):
    return int(c.get_inference_statistics("stamp_c")["model_stats"][0]["inference_count"])


def branches_done(c, before_a):
    """Waits until the branch steps that were running have finished (they are not interrupted)."""
    end = time.time() + 10
    while time.time() < end:
        stats = c.get_inference_statistics("stamp_a")["model_stats"][0]
        if int(stats["inference_count"]) + int(stats["inference_stats"]["fail"]["count"]) > before_a:
            return
        time.sleep(0.05)


@pytest.mark.parametrize("how", ["timeout parameter", "client deadline"])
def test_a_timeout_or_a_cancel_stops_the_remaining_steps(server, how):
    g = grpcclient.InferenceServerClient(server.grpc_url)
    h = httpclient.InferenceServerClient(server.http_url)
    try:
        before = join_count(h)
        before_a = int(h.get_inference_statistics("stamp_a")["model_stats"][0]["inference_count"])
        x = [tensor(grpcclient, "X", np.array([1.0], np.float32), "FP32")]
        with pytest.raises(InferenceServerException) as e:
            if how == "timeout parameter":
                g.infer("branches", x, timeout=100_000)
            else:
                g.infer("branches", x, client_timeout=0.1)
        if how == "timeout parameter":
            assert "ensemble 'branches'" in str(e.value) and "timeout" in str(e.value)
        branches_done(h, before_a)
        time.sleep(0.5)  # time enough for the join (0.3 s) to have run, had it started
        assert join_count(h) == before, "the step after the branches never started"
    finally:
        g.close()
        h.close()


@pytest.mark.parametrize("name, reason", [
    ("bad_unknown_model", "step 0 (model 'no_such_model')"),
    ("bad_never_produced", "tensor 'NOWHERE' used by step 0 (model 'stamp_a') input 'X' is never produced"),
    ("bad_produced_twice", "tensor 'Y' is produced twice"),
    ("bad_dtype", "tensor 'X' is FP32 from the ensemble's input but step 0 (model 'pipeline_first') input"),
    ("bad_cycle", "the steps form a cycle: step 0 (model 'stamp_a'), step 1 (model 'stamp_b')"),
    ("bad_no_output", "ensemble output 'Y' is produced by no step"),
])
def test_broken_ensembles_say_why_and_block_nothing(http, name, reason):
    row = next(r for r in http.get_model_repository_index() if r["name"] == name)
    assert row["state"] == "UNAVAILABLE" and reason in row["reason"], row
    assert http.is_model_ready("data_pipeline") and http.is_model_ready("stamp_a")


def test_explicit_mode_loads_the_steps_and_unloads_them_as_dependents(fresh_server, tmp_path):
    repo = tmp_path / "repo"
    build_repo(repo)
    srv = fresh_server([repo], PY_ARGS + ["--model-control-mode", "explicit"], wait_models=[])
    c = httpclient.InferenceServerClient(srv.http_url)
    try:
        c.load_model("data_pipeline")
        assert c.is_model_ready("pipeline_first") and c.is_model_ready("pipeline_second")
        assert not c.is_model_ready("stamp_a"), "only what the ensemble needs is loaded"
        _, inputs = pipeline_inputs(httpclient)
        assert c.infer("data_pipeline", inputs).as_numpy("FLAG_FINAL")[0] == np.False_
        c.unload_model("data_pipeline", unload_dependents=True)
        assert not any(c.is_model_ready(m) for m in ("data_pipeline", "pipeline_first", "pipeline_second"))
        c.load_model("branches")
        c.unload_model("branches")
        assert c.is_model_ready("stamp_a"), "without unload_dependents the steps stay"
    finally:
        c.close()


def test_an_ensemble_follows_its_step_models_unload_and_reload(fresh_server, tmp_path):
    repo = tmp_path / "repo"
    build_repo(repo)
    srv = fresh_server([repo], PY_ARGS + ["--model-control-mode", "explicit", "--load-model", "branches"],
                       wait_models=["branches"])
    c = httpclient.InferenceServerClient(srv.http_url)
    x = [tensor(httpclient, "X", np.array([1.0], np.float32), "FP32")]
    try:
        c.unload_model("stamp_c")
        row = next(r for r in c.get_model_repository_index() if r["name"] == "branches")
        assert row["state"] == "UNAVAILABLE" and "step 2 (model 'stamp_c')" in row["reason"], row
        with pytest.raises(InferenceServerException):
            c.infer("branches", x)
        c.load_model("stamp_c")
        assert c.is_model_ready("branches"), "planned again once its step model is back"
        np.testing.assert_array_equal(c.infer("branches", x).as_numpy("Y"), [3.0])
    finally:
        c.close()


def test_an_ensemble_that_would_call_itself_is_refused_and_the_server_lives(fresh_server, tmp_path):
    repo = tmp_path / "repo"
    build_repo(repo)
    srv = fresh_server([repo], PY_ARGS + ["--model-control-mode", "explicit", "--load-model", "branches"],
                       wait_models=["branches"])
    c = httpclient.InferenceServerClient(srv.http_url)
    try:
        config = (repo / "branches" / "config.pbtxt").read_text()
        looped = config.replace('step [ ', 'step [ ' + step("branches", {"X": "X"}, {"Y": "LOOP"}) + ", ", 1)
        assert looped != config
        (repo / "branches" / "config.pbtxt").write_text(looped)
        with pytest.raises(InferenceServerException) as e:
            c.load_model("branches")
        assert "calls itself (branches -> branches)" in str(e.value), e.value
        assert c.is_server_live() and c.is_model_ready("branches"), "the plan that was serving stays"
        np.testing.assert_array_equal(
            c.infer("branches", [tensor(httpclient, "X", np.array([1.0], np.float32), "FP32")]).as_numpy("Y"), [3.0])
    finally:
        c.close()
