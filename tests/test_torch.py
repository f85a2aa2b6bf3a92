"""The TorchScript backend (cargo feature `torch`) through tritonclient: dict outputs that Triton's
PyTorch backend refuses, tuples, List[str] both ways, a dict input, scalar and optional arguments,
dynamic batching, the real silero_vad.jit against torch in-process, and clear errors for bad files,
bad configs and bad requests while the node keeps serving.

Needs PyTorch in this interpreter and a mesh-node built with `--features torch`
(scripts/setup-torch.sh). Without them the module is skipped, unless MESH_REQUIRE_TORCH=1."""
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.server]

REPO_ROOT = Path(__file__).resolve().parent.parent
REQUIRED = os.environ.get("MESH_REQUIRE_TORCH") == "1"


def _skip_or_fail(why: str):
    if REQUIRED:
        pytest.fail(why)
    pytest.skip(why)


try:
    import torch
except ImportError:  # the module-level skip below reports it
    torch = None


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    if torch is None:
        _skip_or_fail("torch is not installed in this interpreter (scripts/setup-torch.sh installs it)")
    out = tmp_path_factory.mktemp("torch") / "repo"
    res = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "torch_models.py"), "--out", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"torch_models.py failed:\n{res.stdout}\n{res.stderr}"
    return out


@pytest.fixture(scope="module")
def server(server_factory, repo):
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    import torch_models
    names = sorted(p.name for p in repo.iterdir())
    srv = server_factory([repo], ["--strict-readiness", "false", "--exit-on-error", "false"], name="torch",
                         wait_models=[])
    index = {e["name"]: e for e in srv.settle(names, timeout=120)}
    reason = index.get("dict_out", {}).get("reason", "")
    if "without TorchScript support" in reason:
        _skip_or_fail(f"this mesh-node has no torch feature: {reason}")
    broken = set(torch_models.LOAD_ERRORS)
    for name in names:
        if name not in broken:
            assert index[name]["state"] == "READY", f"{name}: {index[name]}"
    srv.index_at_start = index
    return srv


@pytest.fixture(scope="module")
def http(server):
    c = httpclient.InferenceServerClient(server.http_url)
    yield c
    c.close()


@pytest.fixture(scope="module")
def grpc(server):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    yield c
    c.close()


def reference(repo: Path, name: str):
    """The same model file, run by torch in this process."""
    import warnings
    warnings.filterwarnings("ignore", message=".*torch.jit.load.*deprecated", category=DeprecationWarning)
    return torch.jit.load(str(repo / name / "1" / "model.pt")).eval()


def infer(client, mod, model, inputs, outputs=None):
    ins = []
    for name, arr in inputs.items():
        dtype = "BYTES" if arr.dtype == object else {np.float32: "FP32", np.int64: "INT64"}[arr.dtype.type]
        t = mod.InferInput(name, list(arr.shape), dtype)
        t.set_data_from_numpy(arr)
        ins.append(t)
    outs = [mod.InferRequestedOutput(o) for o in outputs] if outputs else None
    return client.infer(model, ins, outputs=outs)


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_a_dict_output_serves_as_named_outputs(proto, http, grpc, repo):
    client, mod = (http, httpclient) if proto == "http" else (grpc, grpcclient)
    x = np.random.rand(3, 4).astype(np.float32)
    y = np.random.rand(3, 4).astype(np.float32)
    r = infer(client, mod, "dict_out", {"x": x, "y": y})
    want = reference(repo, "dict_out")(torch.from_numpy(x), torch.from_numpy(y))
    np.testing.assert_allclose(r.as_numpy("sum"), want["sum"].numpy(), rtol=1e-6)
    np.testing.assert_allclose(r.as_numpy("diff"), want["diff"].numpy(), rtol=1e-6)
    assert r.as_numpy("unlisted") is None, "a key config does not list is not an output"
    only = infer(client, mod, "dict_out", {"x": x, "y": y}, outputs=["sum"])
    assert only.as_numpy("diff") is None
    np.testing.assert_allclose(only.as_numpy("sum"), x + y, rtol=1e-6)


def test_dict_outputs_batch_across_concurrent_requests(grpc, server):
    before = server.get_json("/v2/models/dict_out/stats")["model_stats"][0]

    def one(i):
        x = np.full((1, 4), i, np.float32)
        y = np.ones((1, 4), np.float32)
        r = infer(grpcclient.InferenceServerClient(server.grpc_url), grpcclient, "dict_out", {"x": x, "y": y})
        return i, r.as_numpy("sum"), r.as_numpy("diff")

    with ThreadPoolExecutor(16) as pool:
        for i, s, d in pool.map(one, range(32)):
            np.testing.assert_array_equal(s, np.full((1, 4), i + 1, np.float32))
            np.testing.assert_array_equal(d, np.full((1, 4), i - 1, np.float32))
    after = server.get_json("/v2/models/dict_out/stats")["model_stats"][0]
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == 32
    assert executions < inferences, f"{executions} executions for {inferences} requests: no batching"
    config = server.get_json("/v2/models/dict_out/config")
    assert config["instance_group"][0]["count"] == 2


def test_tuple_outputs_and_inputs_follow_the_index_convention(http, repo):
    a = np.array([[1.5, -2.0, 3.0]], np.float32)
    b = np.array([[0.5, 4.0, -1.0]], np.float32)
    r = infer(http, httpclient, "tuple_out", {"INPUT__0": a, "INPUT__1": b})
    np.testing.assert_allclose(r.as_numpy("OUTPUT__0"), a * 2.0)
    assert r.as_numpy("OUTPUT__1").dtype == np.int64
    np.testing.assert_array_equal(r.as_numpy("OUTPUT__1"), (a + b).astype(np.int64))


def test_string_list_outputs_are_bytes_per_row_even_when_batched(server):
    rows = [np.array([[v, 1.0]], np.float32) for v in (-5.0, 3.0, -0.5, 2.0, -9.0, 7.0)]
    before = server.get_json("/v2/models/strings_out/stats")["model_stats"][0]

    def one(x):
        return infer(grpcclient.InferenceServerClient(server.grpc_url), grpcclient, "strings_out", {"x": x})

    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(one, rows))
    for x, r in zip(rows, results):
        label = r.as_numpy("label")
        assert label.shape == (1, 1)
        assert label[0, 0] == (b"positive" if x.sum() > 0 else b"negative")
    after = server.get_json("/v2/models/strings_out/stats")["model_stats"][0]
    executions = after["execution_count"] - before["execution_count"]
    assert executions < len(rows), f"{executions} executions for {len(rows)} requests: no batching"


def test_a_single_dict_input_takes_the_config_inputs_by_key(grpc):
    a = np.array([[2.0, 3.0], [1.0, -1.0]], np.float32)
    b = np.array([[4.0, 0.5], [0.0, 2.0]], np.float32)
    r = infer(grpc, grpcclient, "dict_in", {"a": a, "b": b})
    np.testing.assert_allclose(r.as_numpy("OUTPUT__0"), a * b + 1.0)


def test_bytes_inputs_reach_forward_as_a_string_list(http, repo):
    words = np.array(["a", "mesh", "héllo", ""], dtype=object)
    r = infer(http, httpclient, "strings_in", {"words": words})
    want = reference(repo, "strings_in")(list(words))
    np.testing.assert_array_equal(r.as_numpy("lengths"), want.numpy())


def test_nested_results_map_by_key_path_last_key_and_position(grpc, repo):
    x = np.random.rand(2, 3).astype(np.float32)
    r = infer(grpc, grpcclient, "nested_out", {"x": x})
    logits, nested = reference(repo, "nested_out")(torch.from_numpy(x))
    np.testing.assert_allclose(r.as_numpy("logits"), logits.numpy(), rtol=1e-6)
    np.testing.assert_allclose(r.as_numpy("boxes"), nested["det"]["boxes"].numpy(), rtol=1e-6)
    np.testing.assert_allclose(r.as_numpy("det.scores"), nested["det"]["scores"].numpy(), rtol=1e-6)


def test_scalar_and_optional_arguments(http):
    x = np.array([1.0, 2.0, 3.0], np.float32)
    scale = np.array([2.5], np.float32)
    r = infer(http, httpclient, "optional_in", {"x": x, "scale": scale})
    np.testing.assert_allclose(r.as_numpy("out"), x * 2.5)
    bias = np.array([10.0, 20.0, 30.0], np.float32)
    r = infer(http, httpclient, "optional_in", {"x": x, "scale": scale, "bias": bias})
    np.testing.assert_allclose(r.as_numpy("out"), x * 2.5 + bias)


def speech_like(seconds=2.0, sr=16000) -> np.ndarray:
    """Half a second of quiet noise, then a voiced, pitch-gliding harmonic signal, then noise again."""
    rng = np.random.default_rng(7)
    t = np.arange(int(seconds * sr)) / sr
    pitch = 140 + 40 * np.sin(2 * np.pi * 3 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / sr
    voiced = sum(np.sin(k * phase) / k for k in range(1, 12)) * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t))
    envelope = ((t > 0.5) & (t < seconds - 0.3)).astype(np.float64)
    return (0.3 * voiced * envelope + 0.005 * rng.standard_normal(t.size)).astype(np.float32)


def test_silero_vad_matches_torch_in_process(fresh_server, repo):
    """The real silero_vad.jit keeps its recurrent state across calls: a fresh server and a fresh
    in-process model fed the same 512-sample chunks in order must agree on every probability."""
    srv = fresh_server([repo], ["--model-control-mode", "explicit", "--load-model", "silero_vad"],
                       wait_models=["silero_vad"])
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    model = reference(repo, "silero_vad")
    audio = speech_like()
    sr = np.array([16000], np.int64)
    got, want = [], []
    for start in range(0, audio.size - 511, 512):
        chunk = audio[None, start:start + 512]
        got.append(infer(client, grpcclient, "silero_vad", {"x": chunk, "sr": sr}).as_numpy("prob")[0, 0])
        with torch.no_grad():
            want.append(float(model(torch.from_numpy(chunk), 16000)[0, 0]))
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert max(want) > 0.5 > min(want), f"the signal should hold speech and silence: {min(want)}..{max(want)}"
    with pytest.raises(InferenceServerException) as e:
        infer(client, grpcclient, "silero_vad", {"x": audio[None, :100], "sr": sr})
    assert "ValueError: Input audio chunk is too short" in str(e.value), "the model's own error comes back"


def test_an_output_with_the_wrong_dtype_or_missing_key_is_a_clear_error(http, grpc):
    x = np.ones((1, 4), np.float32)
    with pytest.raises(InferenceServerException) as e:
        infer(http, httpclient, "wrong_dtype", {"x": x})
    assert "output 'out' is FP64 from the model but FP32 in config.pbtxt" in str(e.value)
    with pytest.raises(InferenceServerException) as e:
        infer(grpc, grpcclient, "missing_key", {"x": x})
    assert "output 'absent' is not produced" in str(e.value) and "present" in str(e.value)
    r = infer(grpc, grpcclient, "dict_out", {"x": x, "y": x})
    np.testing.assert_array_equal(r.as_numpy("sum"), x * 2), "the node keeps serving"


@pytest.mark.parametrize("model, needle", [
    ("not_torchscript", "is not a TorchScript archive"),
    ("no_file", "no model file"),
    ("bad_binding", "input 'z' is neither a forward() argument"),
    ("gpu_model", "KIND_GPU"),
    ("no_outputs", "must list the outputs"),
])
def test_models_that_cannot_load_say_why(server, model, needle):
    entry = server.index_at_start[model]
    if model == "gpu_model" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU torch can use, so the KIND_GPU model loads")
    assert entry["state"] == "UNAVAILABLE"
    assert needle in entry["reason"], entry["reason"]


@pytest.mark.parametrize("inputs, needle", [
    ({"x": np.ones((1, 4), np.float32)}, "'y'"),
    ({"x": np.ones((1, 4), np.float32), "y": np.ones((1, 4), np.float32), "w": np.ones((1, 4), np.float32)},
     "'w'"),
    ({"x": np.ones((1, 4), np.int64), "y": np.ones((1, 4), np.float32)}, "INT64"),
    ({"x": np.ones((1, 5), np.float32), "y": np.ones((1, 5), np.float32)}, "shape"),
])
def test_bad_requests_get_400_and_the_node_keeps_serving(http, inputs, needle):
    with pytest.raises(InferenceServerException) as e:
        infer(http, httpclient, "dict_out", inputs)
    assert e.value.status() == "400", e.value
    assert needle in str(e.value)
    x = np.ones((1, 4), np.float32)
    np.testing.assert_array_equal(infer(http, httpclient, "dict_out", {"x": x, "y": x}).as_numpy("diff"), 0 * x)



def test_a_build_without_the_feature_says_how_to_enable_it(server_env, repo, models_dir, tmp_path, request):
    """MESH_FAULT_BIN is a debug build without `torch`: its TorchScript models fail to load with a
    reason that says how to get the feature, and the ONNX model next to them serves."""
    import conftest
    path = os.environ.get("MESH_FAULT_BIN")
    if not path:
        _skip_or_fail("MESH_FAULT_BIN (a build without the torch feature) is not set")
    binary = Path(path) if Path(path).is_absolute() else REPO_ROOT / path
    mixed = tmp_path / "mixed"
    shutil.copytree(repo / "dict_out", mixed / "dict_out")
    shutil.copytree(models_dir / "simple" / "mlp", mixed / "mlp")
    factory = conftest._Factory(binary, server_env, request.node.name)
    try:
        srv = factory([mixed], ["--strict-readiness", "false"], wait_models=["mlp"])
        entry = {e["name"]: e for e in srv.settle(["dict_out"])}["dict_out"]
        assert entry["state"] == "UNAVAILABLE"
        assert "without TorchScript support" in entry["reason"] and "setup-torch.sh" in entry["reason"]
        assert srv.get("/v2/models/mlp/ready").status == 200
    finally:
        factory.close()
