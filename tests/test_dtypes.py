"""Every Triton datatype round-trips unchanged through identity_<dtype>, over
HTTP (binary and JSON; BF16 is binary-only) and gRPC, through tritonclient
and through a hand-written wire encoder."""

import json
import math

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

import gen_models
from mesh_util import (CONFIG_TYPES, NP_DTYPES, binary_body, binary_input, infer_path, json_input,
                       output_array, parse_infer_response)

pytestmark = [pytest.mark.server]

DTYPES = gen_models.DTYPE_NAMES
JSON_DTYPES = [d for d in DTYPES if d != "BF16"]


def model(dtype):
    return gen_models.identity_model_name(dtype)


def sample(dtype: str, json_safe: bool = False) -> np.ndarray:
    """A [2,3] tensor of edge values for `dtype`; no NaN/Inf when json_safe."""
    nan, inf = float("nan"), float("inf")
    if dtype == "BOOL":
        return np.array([[True, False, True], [False, False, True]])
    if dtype == "BYTES":
        if json_safe:
            vals = ["", "a\x00b", "\u00e9t\u00e9", "x" * 100, "\u65e5\u672c", "end"]
            return np.array([v.encode("utf-8") for v in vals], dtype=object).reshape(2, 3)
        vals = [b"", b"a\x00b", b"\xff\xfe\x80", b"x" * 1000, "\u00e9".encode(), b"\x00"]
        return np.array(vals, dtype=object).reshape(2, 3)
    ints = {
        "UINT8": [0, 1, 127, 128, 254, 255],
        "UINT16": [0, 1, 255, 256, 65534, 65535],
        "UINT32": [0, 1, 65536, 2 ** 31, 2 ** 32 - 2, 2 ** 32 - 1],
        "UINT64": [0, 1, 2 ** 32, 2 ** 53 + 1, 2 ** 63, 2 ** 64 - 1],
        "INT8": [-128, -1, 0, 1, 126, 127],
        "INT16": [-32768, -1, 0, 1, 255, 32767],
        "INT32": [-2 ** 31, -1, 0, 1, 2 ** 24 + 1, 2 ** 31 - 1],
        "INT64": [-2 ** 63, -1, 0, 2 ** 53 + 1, 2 ** 62, 2 ** 63 - 1],
    }
    if dtype in ints:
        return np.array(ints[dtype], dtype=NP_DTYPES[dtype]).reshape(2, 3)
    floats = {
        "FP16": ([1.5, -2.25, 65504.0, 6.103515625e-05, 5.960464477539063e-08, -0.0],
                 [nan, inf, -inf, 1.5, 5.960464477539063e-08, -0.0]),
        "FP32": ([0.1, -1e30, 3.4028234663852886e38, 1.1754943508222875e-38, 1.401298464324817e-45, -0.0],
                 [nan, inf, -inf, 0.1, 1.401298464324817e-45, -0.0]),
        "FP64": ([0.1, 1e308, 5e-324, -0.0, math.pi, -2.5],
                 [nan, inf, -inf, 0.1, 5e-324, -0.0]),
        "BF16": ([1.5, -2.0, 0.0, 3.0, 256.0, 0.0078125],
                 [nan, inf, -inf, 1.5, -0.0, 3.0e38]),
    }
    vals = floats[dtype][0 if json_safe else 1]
    return np.array(vals, dtype=NP_DTYPES[dtype]).reshape(2, 3)


def assert_same(got: np.ndarray, want: np.ndarray, dtype: str):
    assert got is not None, "output missing"
    assert tuple(got.shape) == tuple(want.shape), (got.shape, want.shape)
    if dtype == "BYTES":
        g = [bytes(v) if not isinstance(v, str) else v.encode() for v in got.flatten()]
        assert g == list(want.flatten())
    elif dtype in ("FP16", "FP32", "FP64", "BF16"):
        bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[want.dtype.itemsize]
        np.testing.assert_array_equal(np.asarray(got, dtype=want.dtype).view(bits), want.view(bits))
    else:
        assert got.dtype == want.dtype, (got.dtype, want.dtype)
        np.testing.assert_array_equal(got, want)


# --------------------------------------------------------------------------
# metadata and config per type
# --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_identity_metadata_and_config(main_server, dtype):
    md = main_server.get_json(f"/v2/models/{model(dtype)}")
    assert md["inputs"] == [{"name": "INPUT0", "datatype": dtype, "shape": [-1, -1]}]
    assert md["outputs"] == [{"name": "OUTPUT0", "datatype": dtype, "shape": [-1, -1]}]
    cfg = main_server.get_json(f"/v2/models/{model(dtype)}/config")
    assert cfg["max_batch_size"] == 8
    assert [(t["name"], t["data_type"], t["dims"]) for t in cfg["input"]] == [("INPUT0", CONFIG_TYPES[dtype], [-1])]
    assert [(t["name"], t["data_type"], t["dims"]) for t in cfg["output"]] == [("OUTPUT0", CONFIG_TYPES[dtype], [-1])]


# --------------------------------------------------------------------------
# round trips
# --------------------------------------------------------------------------

@pytest.mark.http
@pytest.mark.parametrize("dtype", DTYPES)
def test_roundtrip_http_binary(http_client, dtype):
    x = sample(dtype)
    inp = httpclient.InferInput("INPUT0", list(x.shape), dtype)
    inp.set_data_from_numpy(x, binary_data=True)
    res = http_client.infer(model(dtype), [inp], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)])
    out = [o for o in res.get_response()["outputs"] if o["name"] == "OUTPUT0"][0]
    assert out["datatype"] == dtype
    assert out["shape"] == [2, 3]
    assert_same(res.as_numpy("OUTPUT0"), x, dtype)


@pytest.mark.http
@pytest.mark.parametrize("dtype", JSON_DTYPES)
def test_roundtrip_http_json(http_client, dtype):
    x = sample(dtype, json_safe=True)
    inp = httpclient.InferInput("INPUT0", list(x.shape), dtype)
    inp.set_data_from_numpy(x, binary_data=False)
    res = http_client.infer(model(dtype), [inp], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)])
    out = res.get_output("OUTPUT0")
    assert "data" in out and out["datatype"] == dtype
    assert_same(res.as_numpy("OUTPUT0"), x, dtype)


@pytest.mark.http
@pytest.mark.parametrize("dtype", JSON_DTYPES)
def test_roundtrip_raw_json(main_server, dtype):
    """Hand-built JSON: numbers, booleans and strings as KServe defines them."""
    x = sample(dtype, json_safe=True)
    r = main_server.post(infer_path(model(dtype)), json.dumps({"inputs": [json_input("INPUT0", x, dtype)]}))
    assert r.status == 200, r
    data = r.json()["outputs"][0]["data"]
    if dtype == "BOOL":
        assert all(isinstance(v, bool) for v in data)
    elif dtype == "BYTES":
        assert all(isinstance(v, str) for v in data)
    elif dtype.startswith(("INT", "UINT")):
        assert all(isinstance(v, int) and not isinstance(v, bool) for v in data)
    header, blobs = parse_infer_response(r)
    assert_same(output_array(header, blobs, "OUTPUT0"), x, dtype)


@pytest.mark.http
@pytest.mark.parametrize("dtype", DTYPES)
def test_roundtrip_raw_binary(main_server, dtype):
    """Hand-built binary extension: BOOL is 1 byte, BF16 2 bytes, BYTES
    length-prefixed, all little-endian."""
    x = sample(dtype)
    h, raw = binary_input("INPUT0", x, dtype)
    body, headers = binary_body({"inputs": [h], "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]},
                                [raw])
    r = main_server.post(infer_path(model(dtype)), body, headers=headers)
    assert r.status == 200, r
    header, blobs = parse_infer_response(r)
    assert blobs["OUTPUT0"] == raw
    assert_same(output_array(header, blobs, "OUTPUT0"), x, dtype)


@pytest.mark.grpc
@pytest.mark.parametrize("dtype", DTYPES)
def test_roundtrip_grpc(grpc_client, dtype):
    x = sample(dtype)
    inp = grpcclient.InferInput("INPUT0", list(x.shape), dtype)
    inp.set_data_from_numpy(x)
    res = grpc_client.infer(model(dtype), [inp])
    out = res.get_output("OUTPUT0")
    assert out.datatype == dtype
    assert list(out.shape) == [2, 3]
    assert_same(res.as_numpy("OUTPUT0"), x, dtype)


# --------------------------------------------------------------------------
# BYTES edge cases
# --------------------------------------------------------------------------

BYTES_CASES = {
    "all_empty": np.array([[b"", b""], [b"", b""]], dtype=object),
    "nul_bytes": np.array([[b"\x00", b"\x00\x00abc\x00", b"abc\x00"]], dtype=object),
    "non_utf8": np.array([[b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x80abc"]], dtype=object),
    "mixed_lengths_batch": np.array([[b"", b"a", b"bb"], [b"c" * 255, b"d" * 256, b""],
                                     [b"e" * 70000, b"\x00" * 3, b"f"], [b"g" * 17, b"", b"\xfe\xff"]],
                                    dtype=object),
    "single_element": np.array([[b"only"]], dtype=object),
}


@pytest.mark.http
@pytest.mark.parametrize("case", sorted(BYTES_CASES))
def test_bytes_edge_cases_http(http_client, case):
    x = BYTES_CASES[case]
    inp = httpclient.InferInput("INPUT0", list(x.shape), "BYTES")
    inp.set_data_from_numpy(x, binary_data=True)
    res = http_client.infer("identity_bytes", [inp],
                            outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)])
    assert_same(res.as_numpy("OUTPUT0"), x, "BYTES")


@pytest.mark.grpc
@pytest.mark.parametrize("case", sorted(BYTES_CASES))
def test_bytes_edge_cases_grpc(grpc_client, case):
    x = BYTES_CASES[case]
    inp = grpcclient.InferInput("INPUT0", list(x.shape), "BYTES")
    inp.set_data_from_numpy(x)
    res = grpc_client.infer("identity_bytes", [inp])
    assert_same(res.as_numpy("OUTPUT0"), x, "BYTES")


@pytest.mark.http
def test_bytes_json_nul_and_unicode(main_server):
    vals = ["nul\x00inside", "\u00e9\u00e8", "\U0001F600", "", "quote\"back\\slash", "tab\tnew\nline"]
    body = {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [2, 3], "data": vals}]}
    r = main_server.post(infer_path("identity_bytes"), json.dumps(body))
    assert r.status == 200, r
    assert r.json()["outputs"][0]["data"] == vals


# --------------------------------------------------------------------------
# shapes
# --------------------------------------------------------------------------

@pytest.mark.parametrize("batch,width", [(1, 1), (8, 5), (3, 300)])
def test_identity_batch_shapes(http_client, batch, width):
    x = np.arange(batch * width, dtype=np.int32).reshape(batch, width)
    inp = httpclient.InferInput("INPUT0", [batch, width], "INT32")
    inp.set_data_from_numpy(x)
    np.testing.assert_array_equal(http_client.infer("identity_int32", [inp]).as_numpy("OUTPUT0"), x)


@pytest.mark.parametrize("shape", [(3, 5), (1, 1), (20, 2)])
def test_unbatched_identity(http_client, grpc_client, shape):
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    inp = httpclient.InferInput("INPUT0", list(shape), "FP32")
    inp.set_data_from_numpy(x)
    np.testing.assert_array_equal(http_client.infer("identity_fp32_nobatch", [inp]).as_numpy("OUTPUT0"), x)
    ginp = grpcclient.InferInput("INPUT0", list(shape), "FP32")
    ginp.set_data_from_numpy(x)
    np.testing.assert_array_equal(grpc_client.infer("identity_fp32_nobatch", [ginp]).as_numpy("OUTPUT0"), x)


def test_zero_sized_dim(http_client, grpc_client):
    """A variable dim of 0 is a valid (empty) tensor."""
    x = np.zeros((2, 0), np.float32)
    inp = httpclient.InferInput("INPUT0", [2, 0], "FP32")
    inp.set_data_from_numpy(x)
    out = http_client.infer("identity_fp32", [inp]).as_numpy("OUTPUT0")
    assert out.shape == (2, 0)
    ginp = grpcclient.InferInput("INPUT0", [2, 0], "FP32")
    ginp.set_data_from_numpy(x)
    assert grpc_client.infer("identity_fp32", [ginp]).as_numpy("OUTPUT0").shape == (2, 0)
