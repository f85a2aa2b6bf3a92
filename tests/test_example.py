"""The example repository (configs/example-repo layout): the benchmark MLP
and the real PP-OCRv4 text detector, served and compared with local
references (the OCR pipeline around the detector: tests/test_ocr.py)."""

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

import gen_models

pytestmark = [pytest.mark.server]


def test_ocr_det_metadata_and_config(example_server):
    md = example_server.get_json("/v2/models/ocr_det")
    assert md["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 3, -1, -1]}]
    assert md["outputs"] == [{"name": gen_models.OCR_DET_OUTPUT, "datatype": "FP32", "shape": [-1, 1, -1, -1]}]
    cfg = example_server.get_json("/v2/models/ocr_det/config")
    assert cfg["max_batch_size"] == 4


def test_ocr_det_matches_local_onnxruntime(example_server, example_dir):
    import onnxruntime as ort
    rng = np.random.default_rng(9)
    img = rng.random((2, 3, 64, 96), dtype=np.float32)
    # a dark "text" bar on a light background, normalised like PP-OCR does
    img[:, :, 24:40, 16:80] = 0.05
    img = ((img - 0.5) / 0.5).astype(np.float32)
    sess = ort.InferenceSession(str(example_dir / "ocr_det" / "1" / "model.onnx"),
                                providers=["CPUExecutionProvider"])
    want = sess.run(None, {"x": img})[0]

    c = httpclient.InferenceServerClient(example_server.http_url, network_timeout=120)
    try:
        inp = httpclient.InferInput("x", list(img.shape), "FP32")
        inp.set_data_from_numpy(img)
        got = c.infer("ocr_det", [inp]).as_numpy(gen_models.OCR_DET_OUTPUT)
    finally:
        c.close()
    assert got.shape == (2, 1, 64, 96)
    assert np.all((got >= 0) & (got <= 1))
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)


def test_example_mlp_grpc(example_server):
    x = np.random.default_rng(10).standard_normal((32, gen_models.MLP_IN)).astype(np.float32)
    c = grpcclient.InferenceServerClient(example_server.grpc_url)
    try:
        inp = grpcclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        y = c.infer("mlp", [inp]).as_numpy("y")
    finally:
        c.close()
    np.testing.assert_allclose(y, gen_models.mlp_reference(x, gen_models.mlp_weights()), rtol=1e-4, atol=1e-5)
