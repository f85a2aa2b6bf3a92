"""HTTP/REST (KServe v2) against the main server: health, metadata, config,
inference in JSON and binary form, output subsets, request ids, compression,
the repository index."""

import gzip
import json
import zlib

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import gen_models
from mesh_util import (binary_body, binary_input, infer_path, json_input, output_array,
                       parse_infer_response)

pytestmark = [pytest.mark.server, pytest.mark.http]

RNG = np.random.default_rng(11)


def add_sub_inputs(batch=1):
    a = RNG.standard_normal((batch, 16)).astype(np.float32)
    b = RNG.standard_normal((batch, 16)).astype(np.float32)
    return a, b


# --------------------------------------------------------------------------
# health and metadata
# --------------------------------------------------------------------------

def test_health_live_and_ready(main_server):
    assert main_server.get("/v2/health/live").status == 200
    assert main_server.get("/v2/health/ready").status == 200


def test_health_via_tritonclient(http_client):
    assert http_client.is_server_live()
    assert http_client.is_server_ready()


def test_server_metadata(main_server, http_client):
    md = main_server.get_json("/v2")
    assert md["name"] == "triton", md  # Triton's default --id (README: --id)
    assert isinstance(md["version"], str) and md["version"]
    assert isinstance(md["extensions"], list)
    assert all(isinstance(e, str) for e in md["extensions"])
    assert "binary_tensor_data" in md["extensions"]
    assert http_client.get_server_metadata()["name"] == md["name"]


@pytest.mark.parametrize("path", ["/v2/models/add_sub", "/v2/models/add_sub/versions/1"])
def test_model_metadata_add_sub(main_server, path):
    md = main_server.get_json(path)
    assert md["name"] == "add_sub"
    assert md["versions"] == ["1"]
    assert md["platform"] == "onnxruntime_onnx"
    for key, names in (("inputs", ["INPUT0", "INPUT1"]), ("outputs", ["OUTPUT0", "OUTPUT1"])):
        tensors = {t["name"]: t for t in md[key]}
        assert sorted(tensors) == names
        for t in tensors.values():
            assert t["datatype"] == "FP32"
            assert t["shape"] == [-1, 16]  # batched: -1 first


def test_model_metadata_via_tritonclient(http_client):
    md = http_client.get_model_metadata("mlp")
    assert md["name"] == "mlp"
    assert md["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, gen_models.MLP_IN]}]
    assert md["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, gen_models.MLP_OUT]}]


def test_model_metadata_unbatched_shape(main_server):
    md = main_server.get_json("/v2/models/identity_fp32_nobatch")
    assert md["inputs"][0]["shape"] == [-1, -1]
    assert md["outputs"][0]["shape"] == [-1, -1]


def test_model_ready(main_server, http_client):
    assert main_server.get("/v2/models/add_sub/ready").status == 200
    assert main_server.get("/v2/models/add_sub/versions/1/ready").status == 200
    assert main_server.get("/v2/models/add_sub/versions/2/ready").status != 200
    assert main_server.get("/v2/models/no_such_model/ready").status != 200
    assert http_client.is_model_ready("add_sub")
    assert not http_client.is_model_ready("add_sub", "2")


@pytest.mark.parametrize("path", ["/v2/models/no_such_model", "/v2/models/no_such_model/config",
                                  "/v2/models/add_sub/versions/9", "/v2/models/add_sub/versions/9/config"])
def test_unknown_model_is_404(main_server, path):
    r = main_server.get(path)
    assert r.status == 404, r
    assert r.error_message()


def test_model_config_add_sub(main_server, http_client):
    cfg = main_server.get_json("/v2/models/add_sub/config")
    assert cfg["name"] == "add_sub"
    assert cfg["platform"] == "onnxruntime_onnx"
    assert cfg["max_batch_size"] == 8
    for key, names in (("input", ["INPUT0", "INPUT1"]), ("output", ["OUTPUT0", "OUTPUT1"])):
        assert [t["name"] for t in cfg[key]] == names
        for t in cfg[key]:
            assert t["data_type"] == "TYPE_FP32"
            assert t["dims"] == [16]
            assert all(type(d) is int for d in t["dims"]), "dims must be JSON numbers"
    assert http_client.get_model_config("add_sub")["max_batch_size"] == 8


def test_model_config_keeps_strings_with_hash_and_brackets(main_server):
    cfg = main_server.get_json("/v2/models/custom_filename/config")
    assert cfg["default_model_filename"] == "weights.onnx"
    params = {k: v["string_value"] for k, v in cfg["parameters"].items()}
    assert params == gen_models.CUSTOM_FILENAME_PARAMETERS


def test_model_config_version_policy(main_server):
    cfg = main_server.get_json("/v2/models/versioned_specific/config")
    assert [int(v) for v in cfg["version_policy"]["specific"]["versions"]] == [1, 3]
    cfg = main_server.get_json("/v2/models/versioned_latest2/config")
    assert cfg["version_policy"]["latest"]["num_versions"] == 2


# --------------------------------------------------------------------------
# inference through tritonclient.http
# --------------------------------------------------------------------------

def _tc_add_sub(client, a, b, *, binary_in=True, binary_out=True, outputs=None, **kw):
    inputs = [httpclient.InferInput("INPUT0", list(a.shape), "FP32"),
              httpclient.InferInput("INPUT1", list(b.shape), "FP32")]
    inputs[0].set_data_from_numpy(a, binary_data=binary_in)
    inputs[1].set_data_from_numpy(b, binary_data=binary_in)
    req_outs = None
    if outputs is not None:
        req_outs = [httpclient.InferRequestedOutput(o, binary_data=binary_out) for o in outputs]
    elif not binary_out:
        req_outs = [httpclient.InferRequestedOutput(o, binary_data=False) for o in ("OUTPUT0", "OUTPUT1")]
    return client.infer("add_sub", inputs, outputs=req_outs, **kw)


@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("binary_in,binary_out", [(True, True), (False, False), (True, False), (False, True)])
def test_add_sub_tritonclient(http_client, batch, binary_in, binary_out):
    a, b = add_sub_inputs(batch)
    res = _tc_add_sub(http_client, a, b, binary_in=binary_in, binary_out=binary_out)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), a - b)
    resp = res.get_response()
    assert resp["model_name"] == "add_sub"
    assert resp["model_version"] == "1"


def test_request_id_echoed(http_client):
    a, b = add_sub_inputs()
    res = _tc_add_sub(http_client, a, b, request_id="req-\u00e9-42")
    assert res.get_response()["id"] == "req-\u00e9-42"


@pytest.mark.parametrize("wanted", [["OUTPUT0"], ["OUTPUT1"], ["OUTPUT1", "OUTPUT0"]])
def test_requested_output_subset(http_client, wanted):
    a, b = add_sub_inputs(2)
    res = _tc_add_sub(http_client, a, b, outputs=wanted)
    names = [o["name"] for o in res.get_response()["outputs"]]
    assert sorted(names) == sorted(wanted)
    expect = {"OUTPUT0": a + b, "OUTPUT1": a - b}
    for n in wanted:
        np.testing.assert_array_equal(res.as_numpy(n), expect[n])


@pytest.mark.parametrize("req_alg", [None, "gzip", "deflate"])
@pytest.mark.parametrize("resp_alg", [None, "gzip", "deflate"])
def test_compression_tritonclient(http_client, req_alg, resp_alg):
    a, b = add_sub_inputs(4)
    res = _tc_add_sub(http_client, a, b, request_compression_algorithm=req_alg,
                      response_compression_algorithm=resp_alg)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), a - b)


def test_mlp_matches_numpy(http_client):
    w = gen_models.mlp_weights()
    x = RNG.standard_normal((7, gen_models.MLP_IN)).astype(np.float32)
    inp = httpclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    y = http_client.infer("mlp", [inp]).as_numpy("y")
    assert y.shape == (7, gen_models.MLP_OUT)
    np.testing.assert_allclose(y, gen_models.mlp_reference(x, w), rtol=1e-4, atol=1e-5)


def test_custom_default_model_filename(http_client):
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    inp = httpclient.InferInput("x", [3, 4], "FP32")
    inp.set_data_from_numpy(x)
    y = http_client.infer("custom_filename", [inp]).as_numpy("y")
    # weights.onnx computes 10 x; the decoy model.onnx would give -x
    np.testing.assert_allclose(y, x * 10, rtol=1e-6)


# --------------------------------------------------------------------------
# inference over raw HTTP: exact wire format
# --------------------------------------------------------------------------

def test_raw_json_infer(main_server):
    a, b = add_sub_inputs(2)
    req = {"id": "raw-json-1",
           "inputs": [json_input("INPUT0", a, "FP32"), json_input("INPUT1", b, "FP32")]}
    r = main_server.post("/v2/models/add_sub/infer", json.dumps(req))
    assert r.status == 200, r
    assert r.header("content-type", "").startswith("application/json")
    assert r.header("inference-header-content-length") is None
    body = r.json()
    assert body["id"] == "raw-json-1"
    assert body["model_name"] == "add_sub"
    assert body["model_version"] == "1"
    outs = {o["name"]: o for o in body["outputs"]}
    assert sorted(outs) == ["OUTPUT0", "OUTPUT1"]
    for name, want in (("OUTPUT0", a + b), ("OUTPUT1", a - b)):
        assert outs[name]["datatype"] == "FP32"
        assert outs[name]["shape"] == [2, 16]
        assert isinstance(outs[name]["data"], list) and len(outs[name]["data"]) == 32
        np.testing.assert_array_equal(np.array(outs[name]["data"], dtype=np.float32).reshape(2, 16), want)


def test_raw_json_infer_versioned_path(main_server):
    a, b = add_sub_inputs()
    req = {"inputs": [json_input("INPUT0", a, "FP32"), json_input("INPUT1", b, "FP32")]}
    r = main_server.post(infer_path("add_sub", 1), json.dumps(req))
    assert r.status == 200, r
    header, blobs = parse_infer_response(r)
    assert "id" not in header or header["id"] == ""
    np.testing.assert_array_equal(output_array(header, blobs, "OUTPUT0"), a + b)


def test_raw_binary_infer_all_outputs_binary(main_server):
    a, b = add_sub_inputs(3)
    h0, r0 = binary_input("INPUT0", a, "FP32")
    h1, r1 = binary_input("INPUT1", b, "FP32")
    body, headers = binary_body({"inputs": [h0, h1], "parameters": {"binary_data_output": True}}, [r0, r1])
    r = main_server.post("/v2/models/add_sub/infer", body, headers=headers)
    assert r.status == 200, r
    assert r.header("inference-header-content-length") is not None
    header, blobs = parse_infer_response(r)
    assert sorted(blobs) == ["OUTPUT0", "OUTPUT1"]
    for o in header["outputs"]:
        assert o["parameters"]["binary_data_size"] == 3 * 16 * 4
        assert "data" not in o
    np.testing.assert_array_equal(output_array(header, blobs, "OUTPUT0"), a + b)
    np.testing.assert_array_equal(output_array(header, blobs, "OUTPUT1"), a - b)


def test_raw_mixed_binary_and_json(main_server):
    """INPUT0 binary, INPUT1 JSON; OUTPUT0 binary, OUTPUT1 JSON."""
    a, b = add_sub_inputs(2)
    h0, r0 = binary_input("INPUT0", a, "FP32")
    req = {"inputs": [h0, json_input("INPUT1", b, "FP32")],
           "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}},
                       {"name": "OUTPUT1", "parameters": {"binary_data": False}}]}
    body, headers = binary_body(req, [r0])
    r = main_server.post("/v2/models/add_sub/infer", body, headers=headers)
    assert r.status == 200, r
    header, blobs = parse_infer_response(r)
    assert list(blobs) == ["OUTPUT0"]
    out1 = [o for o in header["outputs"] if o["name"] == "OUTPUT1"][0]
    assert "data" in out1
    np.testing.assert_array_equal(output_array(header, blobs, "OUTPUT0"), a + b)
    np.testing.assert_array_equal(output_array(header, blobs, "OUTPUT1"), a - b)


def test_raw_binary_input_json_output(main_server):
    a, b = add_sub_inputs(1)
    h0, r0 = binary_input("INPUT0", a, "FP32")
    h1, r1 = binary_input("INPUT1", b, "FP32")
    body, headers = binary_body({"inputs": [h0, h1], "outputs": [{"name": "OUTPUT1"}]}, [r0, r1])
    r = main_server.post("/v2/models/add_sub/infer", body, headers=headers)
    assert r.status == 200, r
    header, blobs = parse_infer_response(r)
    assert blobs == {}
    assert [o["name"] for o in header["outputs"]] == ["OUTPUT1"]
    np.testing.assert_array_equal(output_array(header, blobs, "OUTPUT1"), a - b)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_raw_compressed_request_body(main_server, encoding):
    a, b = add_sub_inputs(2)
    h0, r0 = binary_input("INPUT0", a, "FP32")
    h1, r1 = binary_input("INPUT1", b, "FP32")
    body, headers = binary_body({"inputs": [h0, h1]}, [r0, r1])
    # Inference-Header-Content-Length counts the uncompressed JSON
    body = gzip.compress(body) if encoding == "gzip" else zlib.compress(body)
    headers["Content-Encoding"] = encoding
    r = main_server.post("/v2/models/add_sub/infer", body, headers=headers)
    assert r.status == 200, r
    header, blobs = parse_infer_response(r)
    np.testing.assert_array_equal(output_array(header, blobs, "OUTPUT0"), a + b)


@pytest.mark.parametrize("accept,expected", [("gzip", "gzip"), ("deflate", "deflate"),
                                             ("gzip, deflate", None)])
def test_raw_compressed_response(main_server, accept, expected):
    a, b = add_sub_inputs(4)
    req = {"inputs": [json_input("INPUT0", a, "FP32"), json_input("INPUT1", b, "FP32")]}
    r = main_server.post("/v2/models/add_sub/infer", json.dumps(req), headers={"Accept-Encoding": accept})
    assert r.status == 200, r
    enc = (r.header("content-encoding") or "").lower()
    if expected:
        assert enc == expected
    else:
        assert enc in ("gzip", "deflate")
    header, blobs = parse_infer_response(r)  # decodes per Content-Encoding
    np.testing.assert_array_equal(output_array(header, blobs, "OUTPUT1"), a - b)


def test_raw_uncompressed_response_by_default(main_server):
    a, b = add_sub_inputs()
    req = {"inputs": [json_input("INPUT0", a, "FP32"), json_input("INPUT1", b, "FP32")]}
    r = main_server.post("/v2/models/add_sub/infer", json.dumps(req))
    assert r.status == 200
    assert (r.header("content-encoding") or "identity").lower() == "identity"
    json.loads(r.body)


def test_largest_accepted_body(main_server):
    """A body just under --http-max-input-size is served."""
    from conftest import MAIN_MAX_INPUT_SIZE
    n = MAIN_MAX_INPUT_SIZE - 4096
    x = RNG.integers(0, 256, (1, n), dtype=np.uint8)
    h, raw = binary_input("INPUT0", x, "UINT8")
    body, headers = binary_body({"inputs": [h], "parameters": {"binary_data_output": True}}, [raw])
    assert len(body) < MAIN_MAX_INPUT_SIZE
    r = main_server.post("/v2/models/identity_uint8/infer", body, headers=headers)
    assert r.status == 200, r
    header, blobs = parse_infer_response(r)
    np.testing.assert_array_equal(output_array(header, blobs, "OUTPUT0"), x)


# --------------------------------------------------------------------------
# repository index
# --------------------------------------------------------------------------

def test_repository_index_lists_ready_models(main_server, models_dir):
    index = main_server.index()
    for e in index:
        assert isinstance(e["name"], str)
        assert "state" in e
    by_name = {}
    for e in index:
        by_name.setdefault(e["name"], []).append(e)
    expected = sorted(p.name for p in (models_dir / "dtypes").iterdir()) + \
        sorted(p.name for p in (models_dir / "simple").iterdir() if p.is_dir())
    for name in expected:
        assert name in by_name, f"{name} missing from the index"
        assert any(e["state"] == "READY" for e in by_name[name]), by_name[name]
    ready_versions = {e.get("version") for e in by_name["add_sub"] if e["state"] == "READY"}
    assert ready_versions == {"1"}
    # neither stray folders nor stray files are models
    for junk in ("notes", "not_a_version", "README.md"):
        assert junk not in by_name


def test_repository_index_empty_body_via_tritonclient(http_client):
    index = http_client.get_model_repository_index()
    assert any(e["name"] == "add_sub" and e["state"] == "READY" for e in index)


def test_tritonclient_reports_http_errors(http_client):
    inp = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 16), np.float32))
    with pytest.raises(InferenceServerException) as ei:
        http_client.infer("no_such_model", [inp])
    assert ei.value.status() == "404"
    assert "no_such_model" in ei.value.message()
