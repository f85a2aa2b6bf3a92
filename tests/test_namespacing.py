"""`--model-namespacing` (issue 27): each model repository is a namespace, so one model name can be
served from several repositories. The four repository layouts of Triton 2.51's model namespacing
test (qa/L0_model_namespacing), in poll and explicit modes, driven with tritonclient: an ensemble
calls the step model of its own repository, a name served twice gets Triton's "ambiguity" error,
and a step model that leaves or returns to a repository is picked up again."""
import shutil
import sys
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.server]

PYTHON = ["--backend-config", f"python,interpreter={sys.executable}"]
POLL = ["--model-control-mode", "poll", "--repository-poll-secs", "1"]
EXPLICIT = ["--model-control-mode", "explicit"]

MODEL_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy()
            first, second = (a + b, a - b) if {add_first} else (a - b, a + b)
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", first.astype(np.int32)),
                pb_utils.Tensor("OUTPUT1", second.astype(np.int32))]))
        return out
'''

IO = '''
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }},
        {{ name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }},
         {{ name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }} ]
{rest}
'''

STEP = '''
ensemble_scheduling {{ step [ {{
  model_name: "{step}" model_version: -1
  input_map {{ key: "INPUT0" value: "INPUT0" }} input_map {{ key: "INPUT1" value: "INPUT1" }}
  output_map {{ key: "OUTPUT0" value: "OUTPUT0" }} output_map {{ key: "OUTPUT1" value: "OUTPUT1" }}
}} ] }}
'''


def python_model(repo, name, add_first):
    d = repo / name
    (d / "1").mkdir(parents=True)
    (d / "1" / "model.py").write_text(MODEL_PY.format(add_first=add_first))
    (d / "config.pbtxt").write_text('backend: "python"\nmax_batch_size: 0\n' + IO.format(rest=""))


def ensemble(repo, name, step):
    d = repo / name
    (d / "1").mkdir(parents=True)
    (d / "config.pbtxt").write_text('platform: "ensemble"\nmax_batch_size: 0\n'
                                    + IO.format(rest=STEP.format(step=step)))


def layout(tmp_path, case):
    """Triton's test repositories: `addsub_repo` computes (a+b, a-b), `subadd_repo` (a-b, a+b)."""
    addsub, subadd = tmp_path / "addsub_repo", tmp_path / "subadd_repo"
    if case == "no_duplication":
        python_model(addsub, "composing_addsub", True)
        ensemble(addsub, "simple_addsub", "composing_addsub")
        python_model(subadd, "composing_subadd", False)
        ensemble(subadd, "simple_subadd", "composing_subadd")
    elif case in ("duplication", "dynamic_resolution"):
        python_model(addsub, "composing_model", True)
        ensemble(addsub, "simple_addsub", "composing_model")
        python_model(subadd, "composing_model", False)
        ensemble(subadd, "simple_subadd", "composing_model")
    else:  # ensemble_duplication
        python_model(addsub, "composing_addsub", True)
        ensemble(addsub, "simple_ensemble", "composing_addsub")
        python_model(subadd, "composing_subadd", False)
        ensemble(subadd, "simple_ensemble", "composing_subadd")
    return [addsub, subadd]


DATA = np.arange(16, dtype=np.int32)


def check(client, model, add_first, lib=httpclient):
    inputs = [lib.InferInput(n, [16], "INT32") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(DATA)
    r = client.infer(model, inputs)
    add, sub = DATA + DATA, DATA - DATA
    want = (add, sub) if add_first else (sub, add)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), want[0], err_msg=model)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), want[1], err_msg=model)


def ambiguous(client, model, lib=httpclient):
    with pytest.raises(InferenceServerException) as e:
        check(client, model, True, lib)
    assert "ambiguity" in e.value.message(), e.value.message()
    assert f"model '{model}'" in e.value.message()


def until(step, timeout=20.0):
    """Runs `step` until it stops raising (poll mode picks changes up within seconds)."""
    end = time.time() + timeout
    while True:
        try:
            return step()
        except (AssertionError, InferenceServerException):
            if time.time() > end:
                raise
            time.sleep(0.3)


def start(fresh_server, repos, mode, wait):
    srv = fresh_server(repos, ["--model-namespacing=true"] + mode + PYTHON, wait_models=wait)
    return srv, httpclient.InferenceServerClient(srv.http_url)


def serve(fresh_server, repos, mode, models, load_now=True):
    """Poll mode loads everything and waits for `models`; explicit mode starts empty and, with
    `load_now`, loads `models` (ensembles bring the step models they call)."""
    srv, c = start(fresh_server, repos, POLL if mode == "poll" else EXPLICIT, models if mode == "poll" else [])
    if mode == "explicit" and load_now:
        for m in models:
            c.load_model(m)
    return srv, c


@pytest.mark.parametrize("mode", ["poll", "explicit"])
def test_no_duplication(fresh_server, tmp_path, mode):
    srv, c = serve(fresh_server, layout(tmp_path, "no_duplication"), mode, ["simple_addsub", "simple_subadd"])
    for m in ("simple_addsub", "composing_addsub"):
        check(c, m, True)
    for m in ("simple_subadd", "composing_subadd"):
        check(c, m, False)
    assert c.is_server_ready()


@pytest.mark.parametrize("mode", ["poll", "explicit"])
def test_duplication_each_ensemble_calls_its_own_repository(fresh_server, tmp_path, mode):
    srv, c = serve(fresh_server, layout(tmp_path, "duplication"), mode, ["simple_addsub", "simple_subadd"])
    check(c, "simple_addsub", True)
    check(c, "simple_subadd", False)
    # The step model itself is served twice: asking for it by name is ambiguous, on both protocols.
    ambiguous(c, "composing_model")
    g = grpcclient.InferenceServerClient(srv.grpc_url)
    ambiguous(g, "composing_model", grpcclient)
    check(g, "simple_subadd", False, grpcclient)
    # The index lists both copies by their name, and the server stays ready.
    listed = [e for e in c.get_model_repository_index() if e["name"] == "composing_model"]
    assert [e.get("state") for e in listed] == ["READY", "READY"], listed
    assert c.is_server_ready()
    assert not c.is_model_ready("composing_model")
    with pytest.raises(InferenceServerException) as e:
        c.get_model_metadata("composing_model")
    assert "ambiguity" in e.value.message()


@pytest.mark.parametrize("mode", ["poll", "explicit"])
def test_ensemble_duplication(fresh_server, tmp_path, mode):
    # Explicitly, one name in two repositories: both ensembles load, each with its own step model.
    srv, c = serve(fresh_server, layout(tmp_path, "ensemble_duplication"), mode,
                   ["composing_addsub", "composing_subadd"] if mode == "poll" else ["simple_ensemble"])
    check(c, "composing_addsub", True)
    check(c, "composing_subadd", False)
    ambiguous(c, "simple_ensemble")


@pytest.mark.parametrize("mode", ["poll", "explicit"])
def test_dynamic_resolution(fresh_server, tmp_path, mode):
    repos = layout(tmp_path, "dynamic_resolution")
    srv, c = serve(fresh_server, repos, mode, ["simple_addsub", "simple_subadd"], load_now=False)
    before, after = repos[0] / "composing_model", tmp_path / "composing_model"
    # 1. The addsub repository loses its step model: both ensembles call the one that is left.
    shutil.move(before, after)
    if mode == "explicit":
        for m in ("simple_addsub", "simple_subadd"):
            c.load_model(m)
    for m in ("simple_subadd", "simple_addsub", "composing_model"):
        until(lambda: check(c, m, False))
    # 2. It comes back: each ensemble calls its own repository's again.
    shutil.move(after, before)
    if mode == "explicit":
        c.load_model("simple_addsub")
    until(lambda: check(c, "simple_addsub", True))
    check(c, "simple_subadd", False)
    until(lambda: ambiguous(c, "composing_model"))


def test_unloading_a_name_served_twice_unloads_both(fresh_server, tmp_path):
    repos = layout(tmp_path, "duplication")
    srv, c = start(fresh_server, repos, EXPLICIT, [])
    c.load_model("composing_model")
    ambiguous(c, "composing_model")
    c.unload_model("composing_model")
    with pytest.raises(InferenceServerException) as e:
        check(c, "composing_model", True)
    assert "unloaded" in e.value.message(), e.value.message()
    # An override applies to one model, so it is refused for a name found twice.
    with pytest.raises(InferenceServerException) as e:
        c.load_model("composing_model", config='{"backend": "python", "max_batch_size": 0}')
    assert "2 model repositories" in e.value.message(), e.value.message()


def test_without_namespacing_a_name_in_two_repositories_fails(fresh_server, tmp_path):
    repos = layout(tmp_path, "duplication")
    srv = fresh_server(repos, PYTHON + ["--exit-on-error", "false", "--strict-readiness", "false"],
                       wait_models=[])
    c = httpclient.InferenceServerClient(srv.http_url)

    def refused():
        entry = [e for e in c.get_model_repository_index() if e["name"] == "composing_model"]
        assert entry and "more than one repository" in entry[0]["reason"], entry
    until(refused)
