"""Bad input over HTTP: every malformed request gets a 4xx with a KServe
error body ({"error": "..."}) and leaves the server serving.

Absurd shapes must be rejected from the declared sizes, before any
allocation: a server that tries to allocate 2**80 elements dies here.
"""

import gzip
import json

import numpy as np
import pytest

from conftest import MAIN_MAX_INPUT_SIZE
from mesh_util import binary_body, binary_input, infer_path, raw_exchange, serialize_bytes

pytestmark = [pytest.mark.server, pytest.mark.http]

ONES16 = [1.0] * 16
BIG = 2 ** 40


def _in(name="INPUT0", shape=(1, 16), datatype="FP32", data=None, **extra):
    t = {"name": name, "shape": list(shape), "datatype": datatype}
    if data is not None:
        t["data"] = data
    t.update(extra)
    return t


def _good_inputs():
    return [_in("INPUT0", data=ONES16), _in("INPUT1", data=ONES16)]


def js(obj) -> bytes:
    return json.dumps(obj).encode()


def _binary(header, blobs, **hdr_overrides):
    body, headers = binary_body(header, blobs)
    headers.update(hdr_overrides)
    return body, headers


F16 = np.ones((1, 16), np.float32).tobytes()  # 64 bytes


# name -> (model or (model, version), body, extra headers, expected status; None: any 4xx)
CASES = {
    # JSON structure
    "broken_json": ("add_sub", b'{"inputs": [', {}, 400),
    "not_json_at_all": ("add_sub", b"\x00\x01garbage", {}, 400),
    "json_array_body": ("add_sub", b"[1, 2, 3]", {}, 400),
    "empty_body": ("add_sub", b"", {}, 400),
    "inputs_not_a_list": ("add_sub", js({"inputs": {"name": "INPUT0"}}), {}, 400),
    "no_inputs_key": ("add_sub", js({"id": "x"}), {}, 400),
    "shape_not_a_list": ("add_sub", js({"inputs": [_in(shape=(1, 16), data=ONES16) | {"shape": "16"},
                                                   _in("INPUT1", data=ONES16)]}), {}, 400),
    "missing_datatype": ("add_sub", js({"inputs": [{"name": "INPUT0", "shape": [1, 16], "data": ONES16},
                                                   _in("INPUT1", data=ONES16)]}), {}, 400),
    "missing_shape": ("add_sub", js({"inputs": [{"name": "INPUT0", "datatype": "FP32", "data": ONES16},
                                                _in("INPUT1", data=ONES16)]}), {}, 400),
    "missing_data": ("add_sub", js({"inputs": [_in("INPUT0"), _in("INPUT1", data=ONES16)]}), {}, 400),
    # types
    "wrong_dtype": ("add_sub", js({"inputs": [_in(datatype="INT32", data=[1] * 16),
                                              _in("INPUT1", data=ONES16)]}), {}, 400),
    "unknown_dtype": ("add_sub", js({"inputs": [_in(datatype="FLOAT99", data=ONES16),
                                                _in("INPUT1", data=ONES16)]}), {}, 400),
    "data_wrong_element_type": ("add_sub", js({"inputs": [_in(data=["a"] * 16),
                                                          _in("INPUT1", data=ONES16)]}), {}, 400),
    "bf16_as_json": ("identity_bf16", js({"inputs": [_in(shape=(1, 2), datatype="BF16", data=[1.0, 2.0])]}),
                     {}, 400),
    "uint8_out_of_range": ("identity_uint8", js({"inputs": [_in(shape=(1, 1), datatype="UINT8", data=[300])]}),
                           {}, 400),
    "int8_out_of_range": ("identity_int8", js({"inputs": [_in(shape=(1, 1), datatype="INT8", data=[-129])]}),
                          {}, 400),
    "uint32_negative": ("identity_uint32", js({"inputs": [_in(shape=(1, 1), datatype="UINT32", data=[-1])]}),
                        {}, 400),
    "int_given_float": ("identity_int32", js({"inputs": [_in(shape=(1, 1), datatype="INT32", data=[1.5])]}),
                        {}, 400),
    "bool_given_string": ("identity_bool", js({"inputs": [_in(shape=(1, 1), datatype="BOOL", data=["yes"])]}),
                          {}, 400),
    "bytes_given_number": ("identity_bytes", js({"inputs": [_in(shape=(1, 1), datatype="BYTES", data=[123])]}),
                           {}, 400),
    # shapes and element counts
    "wrong_shape": ("add_sub", js({"inputs": [_in(shape=(1, 15), data=[1.0] * 15),
                                              _in("INPUT1", shape=(1, 15), data=[1.0] * 15)]}), {}, 400),
    "wrong_rank": ("add_sub", js({"inputs": [_in(shape=(16,), data=ONES16),
                                             _in("INPUT1", shape=(16,), data=ONES16)]}), {}, 400),
    "data_too_short": ("add_sub", js({"inputs": [_in(data=[1.0] * 15), _in("INPUT1", data=ONES16)]}), {}, 400),
    "data_too_long": ("add_sub", js({"inputs": [_in(data=[1.0] * 17), _in("INPUT1", data=ONES16)]}), {}, 400),
    "negative_dim": ("add_sub", js({"inputs": [_in(shape=(-1, 16), data=ONES16),
                                               _in("INPUT1", data=ONES16)]}), {}, 400),
    "negative_dim_nobatch": ("identity_fp32_nobatch",
                             js({"inputs": [_in(shape=(-2, -8), data=ONES16)]}), {}, 400),
    "absurd_dims_batched": ("add_sub", js({"inputs": [_in(shape=(BIG, BIG), data=[1.0]),
                                                      _in("INPUT1", data=ONES16)]}), {}, 400),
    "absurd_dims_nobatch": ("identity_fp32_nobatch", js({"inputs": [_in(shape=(BIG, BIG), data=[1.0])]}),
                            {}, 400),
    "absurd_dims_overflow_i64": ("identity_fp32_nobatch",
                                 js({"inputs": [_in(shape=(2 ** 62, 2 ** 62, 16), data=[1.0])]}), {}, 400),
    "dim_beyond_i64": ("identity_fp32_nobatch", js({"inputs": [_in(shape=(2 ** 64, 1), data=[1.0])]}), {}, 400),
    "absurd_dims_binary": ("identity_fp32_nobatch",
                           *_binary({"inputs": [_in(shape=(BIG, BIG), parameters={"binary_data_size": 4})]},
                                    [b"\0" * 4]), 400),
    "absurd_dims_binary_bytes": ("identity_bytes",
                                 *_binary({"inputs": [_in(shape=(8, BIG), datatype="BYTES",
                                                          parameters={"binary_data_size": 4})]},
                                          [b"\0" * 4]), 400),
    "batch_too_large": ("add_sub", js({"inputs": [_in(shape=(9, 16), data=[1.0] * 144),
                                                  _in("INPUT1", shape=(9, 16), data=[1.0] * 144)]}), {}, 400),
    "batch_too_large_identity": ("identity_int32",
                                 js({"inputs": [_in(shape=(9, 1), datatype="INT32", data=list(range(9)))]}),
                                 {}, 400),
    # names
    "unknown_input": ("add_sub", js({"inputs": _good_inputs() + [_in("INPUT9", data=ONES16)]}), {}, 400),
    "unknown_output": ("add_sub", js({"inputs": _good_inputs(), "outputs": [{"name": "OUTPUT9"}]}), {}, 400),
    "missing_input": ("add_sub", js({"inputs": [_in("INPUT0", data=ONES16)]}), {}, 400),
    "duplicate_input": ("add_sub", js({"inputs": _good_inputs() + [_in("INPUT0", data=ONES16)]}), {}, 400),
    "unknown_model": ("no_such_model", js({"inputs": _good_inputs()}), {}, 404),
    "unknown_version": (("add_sub", 9), js({"inputs": _good_inputs()}), {}, 404),
    # binary tensor extension
    "binary_data_size_overruns_body": (
        "add_sub", *_binary({"inputs": [_in(parameters={"binary_data_size": 64}),
                                        _in("INPUT1", parameters={"binary_data_size": 64})]},
                            [b"\0" * 10]), 400),
    "binary_data_size_not_matching_shape": (
        "add_sub", *_binary({"inputs": [_in(parameters={"binary_data_size": 60}),
                                        _in("INPUT1", parameters={"binary_data_size": 64})]},
                            [b"\0" * 60, F16]), 400),
    "binary_trailing_bytes": (
        "add_sub", *_binary({"inputs": [_in(parameters={"binary_data_size": 64}),
                                        _in("INPUT1", parameters={"binary_data_size": 64})]},
                            [b"\0" * 64, b"\0" * 64, b"extra"]), 400),
    "binary_data_size_negative": (
        "add_sub", *_binary({"inputs": [_in(parameters={"binary_data_size": -64}),
                                        _in("INPUT1", parameters={"binary_data_size": 64})]},
                            [F16, F16]), 400),
    "binary_and_json_data_both": (
        "add_sub", *_binary({"inputs": [_in(data=ONES16, parameters={"binary_data_size": 64}),
                                        _in("INPUT1", parameters={"binary_data_size": 64})]},
                            [F16, F16]), 400),
    "header_length_beyond_body": (
        "add_sub", js({"inputs": _good_inputs()}), {"Inference-Header-Content-Length": "99999"}, 400),
    "header_length_not_a_number": (
        "add_sub", js({"inputs": _good_inputs()}), {"Inference-Header-Content-Length": "abc"}, 400),
    "header_length_cuts_json": (
        "add_sub", js({"inputs": _good_inputs()}), {"Inference-Header-Content-Length": "10"}, 400),
    "bytes_length_prefix_overruns": (
        "identity_bytes", *_binary({"inputs": [_in(shape=(1, 1), datatype="BYTES",
                                                   parameters={"binary_data_size": 7})]},
                                   [b"\x64\0\0\0abc"]), 400),
    "bytes_element_count_short": (
        "identity_bytes", *_binary({"inputs": [_in(shape=(1, 2), datatype="BYTES",
                                                   parameters={"binary_data_size": 7})]},
                                   [serialize_bytes([b"abc"])]), 400),
    # content encoding
    "gzip_header_plain_body": ("add_sub", js({"inputs": _good_inputs()}), {"Content-Encoding": "gzip"}, 400),
    "truncated_gzip": ("add_sub", gzip.compress(js({"inputs": _good_inputs()}))[:-12],
                       {"Content-Encoding": "gzip"}, 400),
    "deflate_header_plain_body": ("add_sub", js({"inputs": _good_inputs()}), {"Content-Encoding": "deflate"}, 400),
    # any 4xx will do here (400 or 415)
    "unsupported_content_encoding": ("add_sub", js({"inputs": _good_inputs()}), {"Content-Encoding": "zz-nope"},
                                     None),
}


def assert_still_serves(server):
    a = [float(i) for i in range(16)]
    body = js({"inputs": [_in("INPUT0", data=a), _in("INPUT1", data=ONES16)], "outputs": [{"name": "OUTPUT0"}]})
    r = server.post("/v2/models/add_sub/infer", body)
    assert r.status == 200, f"server no longer serves after a bad request: {r}"
    out = r.json()["outputs"][0]
    assert out["data"] == [x + 1.0 for x in a]


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_request_http(main_server, case):
    model, body, headers, status = CASES[case]
    path = infer_path(*model) if isinstance(model, tuple) else infer_path(model)
    r = main_server.post(path, body, headers=dict(headers), timeout=30)
    if status is None:
        assert 400 <= r.status < 500, r
    else:
        assert r.status == status, r
    msg = r.error_message()
    assert len(msg) < 10_000
    assert_still_serves(main_server)


def test_unknown_model_error_names_it(main_server):
    r = main_server.post(infer_path("no_such_model"), js({"inputs": _good_inputs()}))
    assert r.status == 404
    assert "no_such_model" in r.error_message()


def test_unknown_input_error_names_it(main_server):
    r = main_server.post(infer_path("add_sub"), js({"inputs": _good_inputs() + [_in("INPUT9", data=ONES16)]}))
    assert r.status == 400
    assert "INPUT9" in r.error_message()


def test_body_over_max_input_size(main_server):
    """--http-max-input-size: an otherwise valid 1.5 MiB request is refused
    with a 4xx and an error message."""
    n = MAIN_MAX_INPUT_SIZE + MAIN_MAX_INPUT_SIZE // 2
    x = np.zeros((1, n), np.uint8)
    h, raw = binary_input("INPUT0", x, "UINT8")
    body, headers = binary_body({"inputs": [h]}, [raw])
    head = (f"POST /v2/models/identity_uint8/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/octet-stream\r\n"
            f"Inference-Header-Content-Length: {headers['Inference-Header-Content-Length']}\r\n"
            f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n").encode()
    r = raw_exchange(main_server.http_port, head, body)
    assert 400 <= r.status < 500, r
    assert r.status in (400, 413), r
    r.error_message()
    assert_still_serves(main_server)


def test_body_over_max_input_size_without_expect(main_server):
    """The same, sent plainly in one go with a Content-Length."""
    n = MAIN_MAX_INPUT_SIZE * 2
    body = b'{"inputs": [' + b" " * n + b"]}"
    r = None
    try:
        r = main_server.post(infer_path("add_sub"), body, timeout=30)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server may close while we still send; it must survive
    if r is not None:
        assert r.status in (400, 413), r
    assert_still_serves(main_server)


def test_decompressed_body_over_max_input_size(main_server):
    """A small gzip body that inflates past --http-max-input-size is refused
    (no decompression bomb)."""
    body = b'{"inputs": []' + b" " * (8 * MAIN_MAX_INPUT_SIZE) + b"}"
    packed = gzip.compress(body)
    assert len(packed) < MAIN_MAX_INPUT_SIZE // 10
    r = main_server.post(infer_path("add_sub"), packed, headers={"Content-Encoding": "gzip"})
    assert r.status in (400, 413), r
    r.error_message()
    assert_still_serves(main_server)


def test_non_utf8_bytes_output_as_json(main_server):
    """BYTES output that is not UTF-8 cannot be a JSON string: asking for it
    as JSON is a clear 400, asking for it as binary works."""
    x = np.array([[b"\xff\xfe"]], dtype=object)
    h, raw = binary_input("INPUT0", x, "BYTES")
    body, headers = binary_body({"inputs": [h], "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": False}}]},
                                [raw])
    r = main_server.post(infer_path("identity_bytes"), body, headers=headers)
    assert r.status == 400, r
    assert "OUTPUT0" in r.error_message()
    body, headers = binary_body({"inputs": [h], "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]},
                                [raw])
    r = main_server.post(infer_path("identity_bytes"), body, headers=headers)
    assert r.status == 200, r
    assert_still_serves(main_server)


def test_many_bad_requests_then_good(main_server):
    for _ in range(20):
        r = main_server.post(infer_path("add_sub"), b'{"inputs": [{"name": ')
        assert r.status == 400
    assert_still_serves(main_server)


def test_wrong_method_is_405_with_json_error(main_server):
    from mesh_util import http_request
    r = http_request(main_server.http_port, "GET", infer_path("add_sub"))
    assert r.status == 405, r
    assert "not allowed" in r.error_message()
    assert_still_serves(main_server)


def test_unknown_path_is_404_with_json_error(main_server):
    r = main_server.get("/v2/no/such/path")
    assert r.status == 404, r
    assert "unknown request path" in r.error_message()
