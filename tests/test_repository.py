"""Model repository semantics on the main server: configuration
auto-complete from the ONNX file, version policies, version-specific
inference."""

import json

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

import gen_models
from mesh_util import infer_path, json_input, output_array, parse_infer_response

pytestmark = [pytest.mark.server]


def io_summary(cfg, key):
    return [(t["name"], t["data_type"], t["dims"]) for t in cfg.get(key, [])]


def infer_x(server, model, x, version=None):
    """JSON infer of a one-input model `x` -> `y`; returns (status, y or error)."""
    r = server.post(infer_path(model, version), json.dumps({"inputs": [json_input("x", x, "FP32")]}))
    if r.status != 200:
        return r.status, r.error_message()
    header, blobs = parse_infer_response(r)
    return 200, header, output_array(header, blobs, "y")


# --------------------------------------------------------------------------
# auto-complete
# --------------------------------------------------------------------------

def test_autocomplete_batched(main_server):
    cfg = main_server.get_json("/v2/models/auto_batched/config")
    assert cfg["name"] == "auto_batched"
    assert cfg.get("platform") == "onnxruntime_onnx" or cfg.get("backend") == "onnxruntime"
    assert cfg["max_batch_size"] == 4
    assert io_summary(cfg, "input") == [("x", "TYPE_FP32", [3])]
    assert io_summary(cfg, "output") == [("y", "TYPE_FP32", [3])]
    md = main_server.get_json("/v2/models/auto_batched")
    assert md["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}]
    assert md["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, 3]}]


def test_autocomplete_batched_infer(main_server):
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    status, header, y = infer_x(main_server, "auto_batched", x)
    assert status == 200
    np.testing.assert_array_equal(y, x * 2)
    # batch 5 exceeds the auto-completed max_batch_size of 4
    status, msg = infer_x(main_server, "auto_batched", np.zeros((5, 3), np.float32))
    assert status == 400 and msg


def test_autocomplete_fixed(main_server):
    cfg = main_server.get_json("/v2/models/auto_fixed/config")
    assert cfg.get("max_batch_size", 0) == 0
    assert io_summary(cfg, "input") == [("x", "TYPE_FP32", [2, 3])]
    assert io_summary(cfg, "output") == [("y", "TYPE_FP32", [2, 3])]
    md = main_server.get_json("/v2/models/auto_fixed")
    assert md["inputs"][0]["shape"] == [2, 3]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    status, header, y = infer_x(main_server, "auto_fixed", x)
    assert status == 200
    np.testing.assert_array_equal(y, x + 1)
    # no batch dimension: [1,2,3] is the wrong rank
    status, msg = infer_x(main_server, "auto_fixed", np.zeros((1, 2, 3), np.float32))
    assert status == 400


def test_autocomplete_partial_config(main_server):
    """Only name and platform given: max_batch_size, input and output are
    filled in from the model (first dim dynamic -> max_batch_size 4)."""
    cfg = main_server.get_json("/v2/models/partial_cfg/config")
    assert cfg["name"] == "partial_cfg"
    assert cfg["max_batch_size"] == 4
    assert io_summary(cfg, "input") == [("x", "TYPE_FP32", [5])]
    assert io_summary(cfg, "output") == [("y", "TYPE_FP32", [5])]
    x = np.arange(15, dtype=np.float32).reshape(3, 5)
    status, header, y = infer_x(main_server, "partial_cfg", x)
    assert status == 200
    np.testing.assert_array_equal(y, x * 3)


@pytest.mark.grpc
def test_autocomplete_visible_over_grpc(grpc_client):
    cfg = grpc_client.get_model_config("auto_fixed").config
    assert cfg.max_batch_size == 0
    assert list(cfg.input[0].dims) == [2, 3]
    md = grpc_client.get_model_metadata("partial_cfg")
    assert [(t.name, t.datatype, list(t.shape)) for t in md.inputs] == [("x", "FP32", [-1, 5])]


# --------------------------------------------------------------------------
# version policies
# --------------------------------------------------------------------------

VERSIONED = {name: served for name, (_, served) in gen_models.VERSIONED.items()}


@pytest.mark.parametrize("name", sorted(VERSIONED))
def test_version_readiness(main_server, name):
    served = VERSIONED[name]
    for v in (1, 2, 3):
        status = main_server.get(f"/v2/models/{name}/versions/{v}/ready").status
        assert (status == 200) == (v in served), f"{name} v{v}: ready status {status}, served {served}"
    assert main_server.get(f"/v2/models/{name}/ready").status == 200
    md = main_server.get_json(f"/v2/models/{name}")
    assert sorted(int(v) for v in md["versions"]) == served
    assert all(isinstance(v, str) for v in md["versions"])


@pytest.mark.parametrize("name", sorted(VERSIONED))
def test_version_inference(main_server, name):
    served = VERSIONED[name]
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    for v in served:
        status, header, y = infer_x(main_server, name, x, version=v)
        assert status == 200
        assert header["model_version"] == str(v)
        np.testing.assert_array_equal(y, x + v)
    # no version: the highest served version answers
    status, header, y = infer_x(main_server, name, x)
    assert status == 200
    assert header["model_version"] == str(max(served))
    np.testing.assert_array_equal(y, x + max(served))
    for v in {1, 2, 3} - set(served):
        status, msg = infer_x(main_server, name, x, version=v)
        assert status == 404, f"{name} v{v} is on disk but not served: expected 404, got {status}"
        assert name in msg


@pytest.mark.parametrize("name", sorted(VERSIONED))
def test_version_index(main_server, name):
    entries = [e for e in main_server.index() if e["name"] == name]
    ready = sorted(int(e["version"]) for e in entries if e["state"] == "READY")
    assert ready == VERSIONED[name]


@pytest.mark.grpc
def test_version_grpc(grpc_client):
    from tritonclient.utils import InferenceServerException
    assert grpc_client.is_model_ready("versioned_specific", "1")
    assert grpc_client.is_model_ready("versioned_specific", "3")
    try:
        assert not grpc_client.is_model_ready("versioned_specific", "2")
    except InferenceServerException as e:
        assert e.status() == "StatusCode.NOT_FOUND"
    md = grpc_client.get_model_metadata("versioned_all")
    assert sorted(int(v) for v in md.versions) == [1, 2, 3]
    x = np.ones((1, 4), np.float32)
    for v in ("1", "3"):
        inp = grpcclient.InferInput("x", [1, 4], "FP32")
        inp.set_data_from_numpy(x)
        res = grpc_client.infer("versioned_specific", [inp], model_version=v)
        np.testing.assert_array_equal(res.as_numpy("y"), x + int(v))
        assert res.get_response().model_version == v
    inp = grpcclient.InferInput("x", [1, 4], "FP32")
    inp.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException) as ei:
        grpc_client.infer("versioned_specific", [inp], model_version="2")
    assert ei.value.status() == "StatusCode.NOT_FOUND"


@pytest.mark.http
def test_version_tritonclient_http(http_client):
    x = np.ones((3, 4), np.float32)
    inp = httpclient.InferInput("x", [3, 4], "FP32")
    inp.set_data_from_numpy(x)
    res = http_client.infer("versioned_latest2", [inp], model_version="2")
    np.testing.assert_array_equal(res.as_numpy("y"), x + 2)
    res = http_client.infer("versioned_latest2", [inp])
    np.testing.assert_array_equal(res.as_numpy("y"), x + 3)


def test_non_version_directories_ignored(main_server):
    md = main_server.get_json("/v2/models/add_sub")
    assert md["versions"] == ["1"]
    assert main_server.get("/v2/models/notes").status == 404
    assert main_server.get("/v2/models/add_sub/versions/notes").status in (400, 404)
