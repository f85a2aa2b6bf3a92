"""TensorFlow models (issue 15): `platform: "tensorflow_savedmodel"` (`model.savedmodel/`) and
`"tensorflow_graphdef"` (`model.graphdef`), run by the interpreter's own TensorFlow in a Python
stub the node supervises. The models are built by scripts/gen_tf_models.py with the TensorFlow of
.venv-tf (scripts/setup-tensorflow.sh); a SavedModel with no config.pbtxt is auto-completed from its
serving signature, as Triton's Quick Deploy does. Without TensorFlow in the interpreter the model
fails to load with a reason that says how to install it, and everything else serves."""
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import REPO_ROOT, side_venv_python

pytestmark = [pytest.mark.server]

TF_MODELS = ["tf_add_sub", "tf_add_sub_cfg", "tf_graphdef", "tf_text"]


@pytest.fixture(scope="module")
def tf_python() -> Path:
    return side_venv_python(".venv-tf", "MESH_TF_PYTHON", "MESH_REQUIRE_TF", "scripts/setup-tensorflow.sh")


@pytest.fixture(scope="module")
def tf_repo(tf_python, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tensorflow") / "repo"
    res = subprocess.run([str(tf_python), str(REPO_ROOT / "scripts" / "gen_tf_models.py"), "--out", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def node(server_factory, tf_repo, tf_python):
    return server_factory([tf_repo], ["--backend-config", f"python,interpreter={tf_python}"], name="tensorflow",
                          wait_models=TF_MODELS)


def add_sub(url, model, proto):
    mod = httpclient if proto == "http" else grpcclient
    c = mod.InferenceServerClient(url)
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    b = np.full((2, 16), 0.5, np.float32)
    ins = [mod.InferInput("INPUT0", [2, 16], "FP32"), mod.InferInput("INPUT1", [2, 16], "FP32")]
    ins[0].set_data_from_numpy(a)
    ins[1].set_data_from_numpy(b)
    r = c.infer(model, ins)
    c.close()
    return r, a, b


@pytest.mark.parametrize("model", ["tf_add_sub", "tf_add_sub_cfg", "tf_graphdef"])
@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_savedmodels_and_graphdefs_serve(node, model, proto):
    r, a, b = add_sub(node.http_url if proto == "http" else node.grpc_url, model, proto)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)


def test_a_savedmodel_without_config_is_completed_from_its_signature(node):
    cfg = node.get_json("/v2/models/tf_add_sub/config")
    assert cfg["platform"] == "tensorflow_savedmodel"
    assert cfg["max_batch_size"] == 4, "batched signature: Triton's default for auto-complete"
    assert [(i["name"], i["data_type"], i["dims"]) for i in cfg["input"]] == \
        [("INPUT0", "TYPE_FP32", [16]), ("INPUT1", "TYPE_FP32", [16])]
    assert [o["name"] for o in cfg["output"]] == ["OUTPUT0", "OUTPUT1"]
    # A rank-1 string input: dims [1] reshaped away for the model; BYTES in, INT32 out.
    text = node.get_json("/v2/models/tf_text/config")
    assert text["input"][0]["data_type"] == "TYPE_STRING" and text["input"][0]["dims"] == [1]
    c = httpclient.InferenceServerClient(node.http_url)
    t = httpclient.InferInput("TEXT", [3, 1], "BYTES")
    t.set_data_from_numpy(np.array([[b"a"], [b"hello"], [b""]], dtype=np.object_))
    r = c.infer("tf_text", [t])
    assert r.as_numpy("LENGTH").reshape(-1).tolist() == [1, 5, 0]
    c.close()


def test_bad_requests_get_clear_errors(node):
    c = httpclient.InferenceServerClient(node.http_url)
    x = httpclient.InferInput("WRONG", [1, 16], "FP32")
    x.set_data_from_numpy(np.zeros((1, 16), np.float32))
    with pytest.raises(InferenceServerException) as e:
        c.infer("tf_add_sub", [x])
    assert "WRONG" in str(e.value) and e.value.status() == "400"
    c.close()


def test_without_tensorflow_the_model_says_how_to_install_it_and_the_rest_serve(fresh_server, tf_repo,
                                                                                models_dir, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(tf_repo / "tf_add_sub", repo / "tf_add_sub")
    shutil.copytree(tf_repo / "tf_graphdef", repo / "tf_graphdef")
    shutil.copytree(models_dir / "simple" / "add_sub", repo / "add_sub",
                    ignore=shutil.ignore_patterns("notes", "not_a_version"))
    # The project venv's interpreter has numpy but no TensorFlow.
    srv = fresh_server([repo], ["--backend-config", "python,interpreter=" + str(REPO_ROOT / ".venv/bin/python")],
                       wait_models=["add_sub"])
    c = httpclient.InferenceServerClient(srv.http_url)
    index = {m["name"]: m for m in c.get_model_repository_index()}
    for name in ("tf_add_sub", "tf_graphdef"):
        assert index[name]["state"] == "UNAVAILABLE"
        assert "TensorFlow is not installed" in index[name]["reason"], index[name]
        assert "pip install tensorflow" in index[name]["reason"]
    assert c.is_model_ready("add_sub") and not c.is_model_ready("tf_add_sub")
    c.close()
    r, a, b = add_sub(srv.http_url, "add_sub", "http")
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
