"""gRPC (inference.GRPCInferenceService) against the main server, through
tritonclient.grpc and through the raw generated stubs for malformed requests."""

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

import gen_models

pytestmark = [pytest.mark.server, pytest.mark.grpc]

RNG = np.random.default_rng(12)


@pytest.fixture(scope="module")
def stub(main_server):
    channel = grpc.insecure_channel(main_server.grpc_url)
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def status_of(exc: InferenceServerException) -> str:
    return exc.status()


def model_ready(client, name, version=""):
    """Readiness, treating NOT_FOUND for an unknown version as not ready."""
    try:
        return client.is_model_ready(name, version)
    except InferenceServerException as e:
        assert e.status() == "StatusCode.NOT_FOUND", e
        return False


def add_sub(client, a, b, outputs=None, **kw):
    inputs = [grpcclient.InferInput("INPUT0", list(a.shape), "FP32"),
              grpcclient.InferInput("INPUT1", list(b.shape), "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    outs = None if outputs is None else [grpcclient.InferRequestedOutput(o) for o in outputs]
    return client.infer("add_sub", inputs, outputs=outs, **kw)


def test_live_and_ready(grpc_client):
    assert grpc_client.is_server_live()
    assert grpc_client.is_server_ready()


def test_server_metadata(grpc_client, main_server):
    md = grpc_client.get_server_metadata()
    assert md.name == "triton"  # Triton's default --id
    assert md.version
    assert "binary_tensor_data" in list(md.extensions)
    assert md.name == main_server.get_json("/v2")["name"]


def test_model_metadata(grpc_client):
    md = grpc_client.get_model_metadata("add_sub")
    assert md.name == "add_sub"
    assert list(md.versions) == ["1"]
    assert md.platform == "onnxruntime_onnx"
    assert [t.name for t in md.inputs] == ["INPUT0", "INPUT1"]
    assert [t.name for t in md.outputs] == ["OUTPUT0", "OUTPUT1"]
    for t in list(md.inputs) + list(md.outputs):
        assert t.datatype == "FP32"
        assert list(t.shape) == [-1, 16]


def test_model_metadata_json(grpc_client):
    md = grpc_client.get_model_metadata("mlp", as_json=True)
    assert md["name"] == "mlp"
    assert md["inputs"][0]["name"] == "x"


def test_model_config(grpc_client):
    cfg = grpc_client.get_model_config("add_sub").config
    assert cfg.name == "add_sub"
    assert cfg.max_batch_size == 8
    assert [i.name for i in cfg.input] == ["INPUT0", "INPUT1"]
    for t in list(cfg.input) + list(cfg.output):
        assert t.data_type == mc.TYPE_FP32
        assert list(t.dims) == [16]


def test_model_config_autocompleted(grpc_client):
    cfg = grpc_client.get_model_config("auto_batched").config
    assert cfg.max_batch_size == 4
    assert [(i.name, i.data_type, list(i.dims)) for i in cfg.input] == [("x", mc.TYPE_FP32, [3])]
    assert [(o.name, o.data_type, list(o.dims)) for o in cfg.output] == [("y", mc.TYPE_FP32, [3])]


def test_model_config_dtypes(grpc_client):
    cfg = grpc_client.get_model_config("identity_bf16").config
    assert cfg.input[0].data_type == mc.TYPE_BF16
    cfg = grpc_client.get_model_config("identity_bytes").config
    assert cfg.input[0].data_type == mc.TYPE_STRING


def test_model_ready(grpc_client):
    assert grpc_client.is_model_ready("add_sub")
    assert grpc_client.is_model_ready("add_sub", "1")
    assert not model_ready(grpc_client, "add_sub", "2")
    assert not model_ready(grpc_client, "no_such_model")


@pytest.mark.parametrize("batch", [1, 5, 8])
def test_infer_add_sub(grpc_client, batch):
    a = RNG.standard_normal((batch, 16)).astype(np.float32)
    b = RNG.standard_normal((batch, 16)).astype(np.float32)
    res = add_sub(grpc_client, a, b)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), a - b)
    resp = res.get_response()
    assert resp.model_name == "add_sub"
    assert resp.model_version == "1"


def test_infer_request_id_and_subset(grpc_client):
    a = RNG.standard_normal((2, 16)).astype(np.float32)
    b = RNG.standard_normal((2, 16)).astype(np.float32)
    res = add_sub(grpc_client, a, b, outputs=["OUTPUT1"], request_id="grpc-req-7")
    resp = res.get_response()
    assert resp.id == "grpc-req-7"
    assert [o.name for o in resp.outputs] == ["OUTPUT1"]
    assert res.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), a - b)


def test_infer_with_priority_and_timeout_parameters(grpc_client):
    """tritonclient sends priority/timeout as uint64/int64 parameters."""
    a = RNG.standard_normal((1, 16)).astype(np.float32)
    b = RNG.standard_normal((1, 16)).astype(np.float32)
    res = add_sub(grpc_client, a, b, priority=1, timeout=10_000_000)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)


def test_infer_mlp(grpc_client):
    x = RNG.standard_normal((4, gen_models.MLP_IN)).astype(np.float32)
    inp = grpcclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    y = grpc_client.infer("mlp", [inp]).as_numpy("y")
    np.testing.assert_allclose(y, gen_models.mlp_reference(x, gen_models.mlp_weights()), rtol=1e-4, atol=1e-5)


def test_infer_typed_contents_answered_raw(stub):
    """A KServe client may send typed `contents` instead of raw_input_contents;
    the answer comes back in raw_output_contents."""
    a = RNG.standard_normal((1, 16)).astype(np.float32)
    b = RNG.standard_normal((1, 16)).astype(np.float32)
    req = service_pb2.ModelInferRequest(model_name="add_sub")
    for name, arr in (("INPUT0", a), ("INPUT1", b)):
        t = req.inputs.add(name=name, datatype="FP32", shape=[1, 16])
        t.contents.fp32_contents.extend(arr.flatten().tolist())
    resp = stub.ModelInfer(req, timeout=30)
    names = [o.name for o in resp.outputs]
    assert len(resp.raw_output_contents) == len(names)
    got = {n: np.frombuffer(raw, np.float32).reshape(1, 16) for n, raw in zip(names, resp.raw_output_contents)}
    np.testing.assert_array_equal(got["OUTPUT0"], a + b)
    np.testing.assert_array_equal(got["OUTPUT1"], a - b)


def test_unknown_model(grpc_client):
    with pytest.raises(InferenceServerException) as ei:
        grpc_client.get_model_metadata("no_such_model")
    assert status_of(ei.value) == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as ei:
        grpc_client.get_model_config("no_such_model")
    assert status_of(ei.value) == "StatusCode.NOT_FOUND"
    inp = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 16), np.float32))
    with pytest.raises(InferenceServerException) as ei:
        grpc_client.infer("no_such_model", [inp])
    assert status_of(ei.value) == "StatusCode.NOT_FOUND"
    assert "no_such_model" in ei.value.message()


def test_unknown_method_is_unimplemented(main_server):
    with grpc.insecure_channel(main_server.grpc_url) as ch:
        call = ch.unary_unary("/inference.GRPCInferenceService/NoSuchMethod",
                              request_serializer=lambda x: x, response_deserializer=lambda x: x)
        with pytest.raises(grpc.RpcError) as ei:
            call(b"", timeout=10)
        assert ei.value.code() == grpc.StatusCode.UNIMPLEMENTED


# --------------------------------------------------------------------------
# malformed requests through the raw stub
# --------------------------------------------------------------------------

def _req(model="add_sub", inputs=(("INPUT0", "FP32", [1, 16]), ("INPUT1", "FP32", [1, 16])),
         raws=None, outputs=(), version=""):
    req = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    for name, dt, shape in inputs:
        req.inputs.add(name=name, datatype=dt, shape=shape)
    if raws is None:
        raws = [np.ones(shape, np.float32).tobytes() if all(d >= 0 for d in shape) and np.prod(shape) < 1e6
                else b"\0" * 64 for _, _, shape in inputs]
    req.raw_input_contents.extend(raws)
    for o in outputs:
        req.outputs.add(name=o)
    return req


BIG = 2 ** 40
GRPC_BAD = {
    "wrong_dtype": (_req(inputs=(("INPUT0", "INT32", [1, 16]), ("INPUT1", "FP32", [1, 16]))), "INVALID_ARGUMENT"),
    "unknown_dtype": (_req(inputs=(("INPUT0", "FLOAT99", [1, 16]), ("INPUT1", "FP32", [1, 16]))), "INVALID_ARGUMENT"),
    "wrong_shape": (_req(inputs=(("INPUT0", "FP32", [1, 15]), ("INPUT1", "FP32", [1, 15]))), "INVALID_ARGUMENT"),
    "wrong_rank": (_req(inputs=(("INPUT0", "FP32", [16]), ("INPUT1", "FP32", [16]))), "INVALID_ARGUMENT"),
    "raw_too_short": (_req(raws=[b"\0" * 60, b"\0" * 64]), "INVALID_ARGUMENT"),
    "raw_too_long": (_req(raws=[b"\0" * 68, b"\0" * 64]), "INVALID_ARGUMENT"),
    "raw_count_mismatch": (_req(raws=[b"\0" * 64]), "INVALID_ARGUMENT"),
    "negative_dim": (_req(inputs=(("INPUT0", "FP32", [-1, 16]), ("INPUT1", "FP32", [1, 16]))), "INVALID_ARGUMENT"),
    "absurd_dims": (_req(model="identity_fp32_nobatch", inputs=(("INPUT0", "FP32", [BIG, BIG]),),
                         raws=[b"\0" * 4]), "INVALID_ARGUMENT"),
    "absurd_dims_overflow": (_req(model="identity_fp32_nobatch", inputs=(("INPUT0", "FP32", [2 ** 62, 2 ** 62]),),
                                  raws=[b"\0" * 4]), "INVALID_ARGUMENT"),
    "missing_input": (_req(inputs=(("INPUT0", "FP32", [1, 16]),)), "INVALID_ARGUMENT"),
    "duplicate_input": (_req(inputs=(("INPUT0", "FP32", [1, 16]), ("INPUT0", "FP32", [1, 16]),
                                     ("INPUT1", "FP32", [1, 16]))), "INVALID_ARGUMENT"),
    "unknown_input": (_req(inputs=(("INPUT0", "FP32", [1, 16]), ("INPUT1", "FP32", [1, 16]),
                                   ("INPUT9", "FP32", [1, 16]))), "INVALID_ARGUMENT"),
    "unknown_output": (_req(outputs=("OUTPUT9",)), "INVALID_ARGUMENT"),
    "batch_too_large": (_req(inputs=(("INPUT0", "FP32", [9, 16]), ("INPUT1", "FP32", [9, 16]))), "INVALID_ARGUMENT"),
    "bytes_bad_length_prefix": (_req(model="identity_bytes", inputs=(("INPUT0", "BYTES", [1, 1]),),
                                     raws=[b"\x64\0\0\0abc"]), "INVALID_ARGUMENT"),
    "unknown_model": (_req(model="no_such_model"), "NOT_FOUND"),
    "unknown_version": (_req(version="9"), "NOT_FOUND"),
}


@pytest.mark.parametrize("case", sorted(GRPC_BAD))
def test_bad_request(stub, grpc_client, case):
    req, code = GRPC_BAD[case]
    with pytest.raises(grpc.RpcError) as ei:
        stub.ModelInfer(req, timeout=30)
    assert ei.value.code() == getattr(grpc.StatusCode, code), ei.value.details()
    assert ei.value.details()
    # the server still serves
    a = np.full((1, 16), 2.0, np.float32)
    b = np.full((1, 16), 0.5, np.float32)
    res = add_sub(grpc_client, a, b)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)


def test_model_stream_infer_answers_every_request_with_its_id(grpc_client):
    """tritonclient's stream API: requests overlap, each answer carries its request's id, and an
    error (an unknown model) arrives as that request's error while the stream keeps going."""
    import queue
    from test_scheduling import add_sub_inputs
    results = queue.Queue()
    grpc_client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for k in range(6):
            inputs = add_sub_inputs(float(k), client=grpcclient)
            grpc_client.async_stream_infer("add_sub", inputs, request_id=f"r{k}")
            if k == 2:
                grpc_client.async_stream_infer("no_such_model", inputs, request_id="bad")
    finally:
        grpc_client.stop_stream()
    got, errors = {}, []
    while not results.empty():
        result, error = results.get()
        if error is not None:
            errors.append(error)
        else:
            got[result.get_response().id] = result.as_numpy("OUTPUT0")
    assert sorted(got) == [f"r{k}" for k in range(6)]
    for k in range(6):
        np.testing.assert_array_equal(got[f"r{k}"], np.full((1, 16), k + 1.0, np.float32))
    assert len(errors) == 1 and "no_such_model" in str(errors[0])


def test_stream_answers_of_models_that_are_not_decoupled_go_out_in_request_order(fresh_server, tmp_path):
    """Triton writes a stream's answers of non-decoupled models in request order, whichever
    finishes first: a slow request holds back the fast ones behind it (they still run at once, on
    the model's two instances), and an error answer keeps its place too."""
    import queue
    import shutil
    import sys
    from pathlib import Path
    model = tmp_path / "repo" / "sleep_py"
    shutil.copytree(Path(__file__).parent / "python_models" / "sleep_py", model)
    with open(model / "config.pbtxt", "a") as f:
        f.write('instance_group [ { count: 2 kind: KIND_CPU } ]\n')
    srv = fresh_server([tmp_path / "repo"], ["--backend-config", f"python,interpreter={sys.executable}"])
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(
        error if error is not None else result.get_response().id))

    def send(k, ms, name="sleep_py"):
        ins = [grpcclient.InferInput("X", [1], "FP32"), grpcclient.InferInput("MS", [1], "INT32")]
        ins[0].set_data_from_numpy(np.array([k], np.float32))
        ins[1].set_data_from_numpy(np.array([ms], np.int32))
        client.async_stream_infer(name, ins, request_id=f"r{k}")

    try:
        send(0, 800)
        send(1, 0)
        send(2, 0, name="no_such_model")
        send(3, 0)
        got = [answers.get(timeout=30) for _ in range(4)]
    finally:
        client.stop_stream()
    assert [a if isinstance(a, str) else "error" for a in got] == ["r0", "r1", "error", "r3"], got
    assert "no_such_model" in str(got[2])


BATCH_POSITION = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.batch = 0

    def execute(self, requests):
        self.batch += 1
        answers = []
        for i, request in enumerate(requests):
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if x[0, 0] < 0:
                time.sleep(0.4)
            answers.append(pb_utils.InferenceResponse([pb_utils.Tensor("POS", np.array([[self.batch, i]], np.int32))]))
        return answers
"""


def test_a_streams_requests_join_batches_in_stream_order(fresh_server, tmp_path):
    """Triton hands a stream's requests to the batcher in stream order. While the only instance is
    busy, 32 requests sent on one stream queue up and join the next batches in the order sent: each
    answers its (batch, position), which must grow with the request's number."""
    import queue
    import sys
    import time
    model = tmp_path / "repo" / "batch_position"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(BATCH_POSITION)
    (model / "config.pbtxt").write_text(
        'name: "batch_position"\nbackend: "python"\nmax_batch_size: 64\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "POS" data_type: TYPE_INT32 dims: [ 2 ] } ]\n'
        'dynamic_batching { }\ninstance_group [ { count: 1 kind: KIND_CPU } ]\n')
    srv = fresh_server([tmp_path / "repo"], ["--backend-config", f"python,interpreter={sys.executable}"])
    client = grpcclient.InferenceServerClient(srv.grpc_url)

    def send(k, x):
        inp = grpcclient.InferInput("X", [1, 1], "FP32")
        inp.set_data_from_numpy(np.array([[x]], np.float32))
        client.async_stream_infer("batch_position", [inp], request_id=str(k))

    try:
        for _ in range(3):
            answers = queue.Queue()
            client.start_stream(callback=lambda result, error: answers.put(
                error if error is not None else (int(result.get_response().id), result.as_numpy("POS")[0].tolist())))
            send(0, -1.0)  # keeps the instance busy while the others queue
            time.sleep(0.1)
            for k in range(1, 33):
                send(k, 1.0)
            got = [answers.get(timeout=30) for _ in range(33)]
            client.stop_stream()
            assert all(isinstance(a, tuple) for a in got), got
            joined = [k for k, _ in sorted((a for a in got if a[0] > 0), key=lambda a: a[1])]
            assert joined == list(range(1, 33)), f"joined the batches as {joined}"
    finally:
        client.close()
