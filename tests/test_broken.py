"""A repository with broken models: each fails to load with a reason that
names its problem, while `good` (and a second repository) serve."""

import json
import re

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

import gen_models
from mesh_util import infer_path, json_input, output_array, parse_infer_response

pytestmark = [pytest.mark.server]

BROKEN = gen_models.BROKEN_MODELS


def reason_of(index, name):
    entries = [e for e in index if e.get("name") == name]
    assert entries, f"{name} missing from the repository index: {index}"
    for e in entries:
        assert e.get("state") == "UNAVAILABLE", e
    reasons = [e.get("reason") or "" for e in entries]
    assert any(reasons), f"{name}: no reason given: {entries}"
    return " | ".join(reasons)


@pytest.fixture(scope="module")
def index(broken_server):
    return broken_server.index()


def test_each_broken_model_unavailable_with_reason(index):
    for name in BROKEN:
        reason_of(index, name)


def test_reason_bad_field_names_field_and_line(index, models_dir):
    reason = reason_of(index, "bad_field")
    assert gen_models.BAD_FIELD_NAME in reason
    text = (models_dir / "broken" / "bad_field" / "config.pbtxt").read_text().splitlines()
    line = next(i + 1 for i, t in enumerate(text) if gen_models.BAD_FIELD_NAME in t)
    assert line == gen_models.BAD_FIELD_LINE
    assert re.search(rf"(line\s*:?\s*{line}\b|:{line}:|\b{line}:\d+\b)", reason, re.I), \
        f"reason should carry line {line}: {reason!r}"


def test_reason_bad_dtype(index):
    assert gen_models.BAD_DTYPE_NAME in reason_of(index, "bad_dtype")


def test_reason_wrong_name(index):
    reason = reason_of(index, "wrong_name")
    assert "wrong_name" in reason and gen_models.WRONG_NAME_CONFIG_NAME in reason
    # the config's name is not a model either
    assert not any(e.get("name") == gen_models.WRONG_NAME_CONFIG_NAME and e.get("state") == "READY" for e in index)


def test_reason_corrupt_onnx(index):
    reason = reason_of(index, "corrupt_onnx").lower()
    assert re.search(r"onnx|protobuf|pars|load|model", reason), reason


def test_reason_mbs_mismatch(index):
    reason = reason_of(index, "mbs_mismatch").lower()
    assert re.search(r"batch|dim|shape", reason), reason


def test_reason_dup_input(index):
    reason = reason_of(index, "dup_input")
    assert "INPUT0" in reason
    assert re.search(r"duplicat|more than once|twice|multiple|already", reason, re.I), reason


@pytest.mark.parametrize("name", BROKEN)
def test_broken_model_not_ready_and_refuses_inference(broken_server, name):
    assert broken_server.get(f"/v2/models/{name}/ready").status != 200
    body = {"inputs": [json_input("INPUT0", np.zeros((1, 16), np.float32), "FP32"),
                       json_input("INPUT1", np.zeros((1, 16), np.float32), "FP32")]}
    r = broken_server.post(infer_path(name), json.dumps(body))
    assert r.status in (400, 404, 503), r
    assert r.error_message()


def test_good_model_serves(broken_server, index):
    assert any(e["name"] == "good" and e["state"] == "READY" for e in index)
    assert broken_server.get("/v2/models/good/ready").status == 200
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.full((1, 16), 0.25, np.float32)
    r = broken_server.post(infer_path("good"), json.dumps(
        {"inputs": [json_input("INPUT0", a, "FP32"), json_input("INPUT1", b, "FP32")]}))
    assert r.status == 200, r
    header, blobs = parse_infer_response(r)
    np.testing.assert_array_equal(output_array(header, blobs, "OUTPUT0"), a + b)
    np.testing.assert_array_equal(output_array(header, blobs, "OUTPUT1"), a - b)


def test_second_repository_serves(broken_server, index):
    """Two --model-repository flags: the dtypes repository loads too."""
    for dtype in gen_models.DTYPE_NAMES:
        name = gen_models.identity_model_name(dtype)
        assert any(e["name"] == name and e["state"] == "READY" for e in index), name
    x = np.array([[1, 2, 3]], np.int64)
    r = broken_server.post(infer_path("identity_int64"), json.dumps({"inputs": [json_input("INPUT0", x, "INT64")]}))
    assert r.status == 200
    assert r.json()["outputs"][0]["data"] == [1, 2, 3]


def test_not_strict_server_is_ready(broken_server):
    """--strict-readiness false: ready although some models failed."""
    assert broken_server.get("/v2/health/live").status == 200
    assert broken_server.get("/v2/health/ready").status == 200


@pytest.mark.grpc
def test_grpc_model_readiness(broken_server):
    from tritonclient.utils import InferenceServerException
    c = grpcclient.InferenceServerClient(broken_server.grpc_url)
    try:
        assert c.is_server_ready()
        assert c.is_model_ready("good")
        for name in BROKEN:
            try:
                assert not c.is_model_ready(name)
            except InferenceServerException as e:
                assert e.status() in ("StatusCode.NOT_FOUND", "StatusCode.UNAVAILABLE"), e
    finally:
        c.close()
