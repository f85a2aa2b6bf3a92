"""Triton's shared-memory extensions (issue 15) with tritonclient's own shared-memory utilities:
inputs read from and outputs written to system shared memory over HTTP and gRPC, one registry for
both protocols, on a node and through the router; bad regions, sizes and offsets are clear 400s and
the server keeps serving; CUDA shared memory answers a clear error on a machine without CUDA."""
import base64
import json
import os
import re
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor, serialized_byte_size

from cluster_util import add_sub_inputs

pytestmark = [pytest.mark.server]

PROTOCOLS = {"http": httpclient, "grpc": grpcclient}
NBYTES = 16 * 4  # one [1, 16] FP32 tensor


@pytest.fixture(scope="module")
def node(server_factory, models_dir):
    return server_factory([models_dir / "simple", models_dir / "dtypes"], name="shm")


@pytest.fixture
def regions(request):
    """Client-side regions (created with tritonclient's utilities), destroyed after the test."""
    made = []

    def make(tag, size):
        key = f"/mesh_shm_{os.getpid()}_{request.node.name[:40]}_{tag}".replace("[", "_").replace("]", "_")
        h = shm.create_shared_memory_region(tag, key, size)
        made.append(h)
        return h, key

    yield make
    for h in made:
        shm.destroy_shared_memory_region(h)


def has_libcuda() -> bool:
    import ctypes.util
    return ctypes.util.find_library("cuda") is not None


def client(proto, url):
    return PROTOCOLS[proto].InferenceServerClient(url)


def url_of(target, proto):
    return target.http_url if proto == "http" else target.grpc_url


def add_sub_in_shm(target, proto, regions, tag):
    """add_sub with both inputs in one region (the second at an offset) and OUTPUT0 in another;
    OUTPUT1 comes back in the response. Returns what the out region holds, the response and the inputs."""
    mod = PROTOCOLS[proto]
    a, b = add_sub_inputs(11)
    h_in, k_in = regions(f"in_{tag}", 2 * NBYTES)
    h_out, k_out = regions(f"out_{tag}", NBYTES + 64)
    shm.set_shared_memory_region(h_in, [a, b])
    c = client(proto, url_of(target, proto))
    c.register_system_shared_memory(f"in_{tag}", k_in, 2 * NBYTES)
    c.register_system_shared_memory(f"out_{tag}", k_out, NBYTES + 64)
    ins = [mod.InferInput("INPUT0", [1, 16], "FP32"), mod.InferInput("INPUT1", [1, 16], "FP32")]
    ins[0].set_shared_memory(f"in_{tag}", NBYTES)
    ins[1].set_shared_memory(f"in_{tag}", NBYTES, offset=NBYTES)
    outs = [mod.InferRequestedOutput("OUTPUT0"), mod.InferRequestedOutput("OUTPUT1")]
    outs[0].set_shared_memory(f"out_{tag}", NBYTES + 64, offset=0)
    r = c.infer("add_sub", ins, outputs=outs)
    out0 = shm.get_contents_as_numpy(h_out, np.float32, [1, 16])
    c.unregister_system_shared_memory(f"in_{tag}")
    c.unregister_system_shared_memory(f"out_{tag}")
    c.close()
    return out0, r, (a, b)


@pytest.mark.parametrize("proto", PROTOCOLS)
def test_inputs_and_an_output_in_system_shared_memory(node, regions, proto):
    out0, r, (a, b) = add_sub_in_shm(node, proto, regions, proto)
    np.testing.assert_array_equal(out0, a + b)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)
    # The shared-memory output is described by name, type and shape only, as Triton answers it.
    o = r.get_output("OUTPUT0")
    if proto == "http":
        assert o == {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 16]}
    else:
        assert o.name == "OUTPUT0" and list(o.shape) == [1, 16] and not o.parameters
        assert r.get_response().raw_output_contents[0] == b""


def test_one_registry_for_both_protocols_and_status(node, regions):
    h, key = regions("both", 128)
    hc, gc = client("http", node.http_url), client("grpc", node.grpc_url)
    hc.register_system_shared_memory("both", key, 64, offset=32)
    assert hc.get_system_shared_memory_status() == [{"name": "both", "key": key, "offset": 32, "byte_size": 64}]
    status = gc.get_system_shared_memory_status(as_json=True)["regions"]
    assert status["both"]["key"] == key and int(status["both"]["byte_size"]) == 64
    # Registered over HTTP, used over gRPC (the region starts at byte 32 of the object).
    x = np.arange(6, dtype=np.float32).reshape(1, 6)
    shm.set_shared_memory_region(h, [np.zeros(8, np.float32), x])
    i = grpcclient.InferInput("INPUT0", [1, 6], "FP32")
    i.set_shared_memory("both", 24)
    r = gc.infer("identity_fp32", [i])
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), x)
    gc.unregister_system_shared_memory("both")
    assert hc.get_system_shared_memory_status() == []
    with pytest.raises(InferenceServerException) as e:
        hc.get_system_shared_memory_status("both")
    assert "Unable to find system shared memory region: 'both'" in str(e.value)
    hc.close(), gc.close()


def test_bytes_tensors_through_shared_memory(node, regions):
    words = np.array([[b"", b"shared", b"memory\x00ok"]], dtype=np.object_)
    data = serialize_byte_tensor(words)
    size = serialized_byte_size(data)
    h_in, k_in = regions("bin", size)
    h_out, k_out = regions("bout", size)
    shm.set_shared_memory_region(h_in, [data])
    c = client("http", node.http_url)
    c.register_system_shared_memory("bin", k_in, size)
    c.register_system_shared_memory("bout", k_out, size)
    i = httpclient.InferInput("INPUT0", [1, 3], "BYTES")
    i.set_shared_memory("bin", size)
    o = httpclient.InferRequestedOutput("OUTPUT0")
    o.set_shared_memory("bout", size)
    c.infer("identity_bytes", [i], outputs=[o])
    got = shm.get_contents_as_numpy(h_out, np.object_, [1, 3])
    assert got.tolist() == words.tolist()
    c.unregister_system_shared_memory()
    c.close()


def post(target, path, body) -> tuple[int, str]:
    req = urllib.request.Request(f"http://{target.http_url}{path}", data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def infer_body(region, size, offset=0, out=None):
    ins = [{"name": n, "shape": [1, 16], "datatype": "FP32",
            "parameters": {"shared_memory_region": region, "shared_memory_byte_size": size,
                           "shared_memory_offset": offset}} for n in ("INPUT0", "INPUT1")]
    body = {"inputs": ins}
    if out:
        body["outputs"] = [{"name": "OUTPUT0", "parameters": out}]
    return body


def test_bad_regions_sizes_and_offsets_are_clear_errors(node, regions):
    h, key = regions("bad", 2 * NBYTES)
    shm.set_shared_memory_region(h, list(add_sub_inputs(1)))
    c = client("http", node.http_url)
    c.register_system_shared_memory("bad", key, 2 * NBYTES)
    infer = "/v2/models/add_sub/infer"
    cases = [
        # Triton's words (its shared-memory tests match on them), then the mesh's detail.
        (infer_body("bad", NBYTES, offset=NBYTES + 4),
         f"Invalid offset + byte size for shared memory region: 'bad' (input 'INPUT0': offset {NBYTES + 4} + byte size "
         f"{NBYTES} is beyond"),
        (infer_body("bad", NBYTES, offset=2 * NBYTES), "Invalid offset for shared memory region: 'bad'"),
        (infer_body("bad", NBYTES - 4),
         f"input byte size mismatch for input 'INPUT0' for model 'add_sub'. Expected {NBYTES}, got {NBYTES - 4}"),
        (infer_body("bad", NBYTES, out={"shared_memory_region": "bad", "shared_memory_byte_size": 8}),
         "shared memory size specified with the request for output 'OUTPUT0' (8 bytes) should be at least 64 bytes "
         "to hold the results"),
        (infer_body("bad", NBYTES, out={"shared_memory_byte_size": 8}), "without 'shared_memory_region'"),
        (infer_body("bad", NBYTES, out={"shared_memory_region": "bad", "shared_memory_byte_size": 64,
                                        "binary_data": True}),
         "Output can't set both 'shared_memory_region' and 'binary_data'"),
    ]
    for body, want in cases:
        status, text = post(node, infer, body)
        assert status == 400 and want in text, (want, status, text)
    # An unregistered region is 404 with Triton's message.
    status, text = post(node, infer, infer_body("nope", NBYTES))
    assert status == 404 and "Unable to find shared memory region: 'nope'" in text, (status, text)
    for path, body, want in [
        ("/v2/systemsharedmemory/region/bad/register", {"key": key, "byte_size": 8}, "shared memory region 'bad' already in manager"),
        ("/v2/systemsharedmemory/region/k/register", {"key": key, "offset": 100, "byte_size": 100},
         "failed to register shared memory region 'k': invalid args"),
        ("/v2/systemsharedmemory/region/k/register", {"key": key, "byte_size": "8"}, "failed to parse"),
    ]:
        status, text = post(node, path, body)
        assert status == 400 and want in text, (path, want, status, text)
    # A key that cannot be opened is Triton's 500 "Unable to open shared memory region: 'KEY'".
    status, text = post(node, "/v2/systemsharedmemory/region/k/register", {"key": "/mesh_no_such_key", "byte_size": 8})
    assert status == 500 and "Unable to open shared memory region: '/mesh_no_such_key'" in text, (status, text)
    # Nothing above was registered, and the server serves the good request.
    assert [r["name"] for r in c.get_system_shared_memory_status()] == ["bad"]
    status, text = post(node, infer, infer_body("bad", NBYTES))
    assert status == 200, text
    c.unregister_system_shared_memory("bad")
    status, text = post(node, infer, infer_body("bad", NBYTES))
    assert status == 404 and "Unable to find shared memory region: 'bad'" in text
    c.close()


def test_grpc_errors_carry_the_code_and_message(node):
    c = client("grpc", node.grpc_url)
    i = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    i.set_shared_memory("missing", 16)
    with pytest.raises(InferenceServerException) as e:
        c.infer("identity_fp32", [i])
    assert e.value.status() == "StatusCode.NOT_FOUND"
    assert "Unable to find shared memory region: 'missing'" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        c.register_system_shared_memory("x", "/mesh_no_such_key", 8)
    assert e.value.status() == "StatusCode.INTERNAL"
    assert e.value.message().startswith("Unable to open shared memory region: '/mesh_no_such_key'")
    c.close()


def test_registering_without_a_region_name_gets_tritons_error(node, regions):
    """Triton's HTTP route without a region (`/v2/systemsharedmemory/register`) is INVALID_ARG
    "'region name' is necessary ..." before the body is read. Its gRPC opens the key first: with
    neither name nor key (its aio client test) that is INTERNAL "Unable to open shared memory
    region: ''", and a malformed CUDA handle is "failed to register ... invalid args". Where the key
    opens, the mesh still wants a name (Triton's gRPC would register a region no request can name)."""
    for kind in ("system", "cuda"):
        status, body = post(node, f"/v2/{kind}sharedmemory/register", {"key": "/x", "byte_size": 8})
        assert status == 400, (status, body)
        assert f"'region name' is necessary to register {kind} shared memory region" in body, body
    c = client("grpc", node.grpc_url)
    with pytest.raises(InferenceServerException) as e:
        c.register_system_shared_memory("", "", 0)
    assert e.value.status() == "StatusCode.INTERNAL"
    assert e.value.message().startswith("Unable to open shared memory region: ''"), e.value.message()
    with pytest.raises(InferenceServerException) as e:
        c.register_cuda_shared_memory("", b"", 0, 0)
    assert re.search("failed to register shared memory region.*invalid args", e.value.message()), e.value.message()
    with pytest.raises(InferenceServerException) as e:
        c.register_system_shared_memory("", regions("noname", 8)[1], 8)
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "'region name' is necessary to register system shared memory region" in e.value.message()
    assert "" not in c.get_system_shared_memory_status(as_json=True).get("regions", {})
    c.close()


def test_cuda_shared_memory_without_cuda_is_a_clear_error(node):
    for proto in PROTOCOLS:
        c = client(proto, url_of(node, proto))
        extensions = c.get_server_metadata()
        extensions = extensions["extensions"] if proto == "http" else extensions.extensions
        assert {"system_shared_memory", "cuda_shared_memory"} <= set(extensions)
        with pytest.raises(InferenceServerException) as e:
            # A handle as tritonclient's cuda_shared_memory.get_raw_handle gives it: base64.
            c.register_cuda_shared_memory("c", base64.b64encode(b"\x00" * 64), 0, 16)
        # Without a CUDA driver (CI) the error says so; with one, a zero handle fails to open.
        want = "no CUDA driver" if not has_libcuda() else "CUDA shared memory region 'c'"
        assert want in str(e.value), e.value
        status = c.get_cuda_shared_memory_status()
        assert (status if proto == "http" else list(status.regions)) == []
        c.close()


@pytest.mark.cluster
@pytest.mark.parametrize("proto", PROTOCOLS)
def test_through_the_router(cluster_factory, models_dir, regions, proto):
    """The router reads the client's regions and writes the outputs; the node sees plain tensors."""
    cl = cluster_factory()
    cl.start_router()
    cl.start_node("n1", [models_dir / "simple"])
    out0, r, (a, b) = add_sub_in_shm(cl.router, proto, regions, f"r{proto}")
    np.testing.assert_array_equal(out0, a + b)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)


GATED_PY = """
import os
import time

import triton_python_backend_utils as pb_utils

STARTED, GATE = @STARTED@, @GATE@


class TritonPythonModel:
    \"\"\"Answers Y = X once the test opens the gate (at the latest after 60 s), saying first that it started.\"\"\"

    def execute(self, requests):
        open(STARTED, "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists(GATE) and time.monotonic() < deadline:
            time.sleep(0.01)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X")
                                                           .as_numpy().copy())]) for r in requests]
"""


def test_a_region_in_use_cannot_be_unregistered_until_its_request_is_done(fresh_server, tmp_path, regions):
    """As Triton: unregistering a region an inference reads its input from or writes its output to
    is refused with Triton's words, one by name and all at once (naming every region in use, as
    Triton's L0_shared_memory expects), and works once the answer is out. The model holds the
    request in execute() until the test has tried both."""
    import sys
    import threading
    import time

    started, gate = tmp_path / "started", tmp_path / "gate"
    model = tmp_path / "repo" / "gated_py"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(
        GATED_PY.replace("@STARTED@", repr(str(started))).replace("@GATE@", repr(str(gate))))
    (model / "config.pbtxt").write_text(
        'name: "gated_py"\nbackend: "python"\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n')
    srv = fresh_server([tmp_path / "repo"], ["--backend-config", f"python,interpreter={sys.executable}"])
    h, key = regions("y", 4)
    hx, key_x = regions("x", 4)
    shm.set_shared_memory_region(hx, [np.array([2.5], np.float32)])
    c = httpclient.InferenceServerClient(srv.http_url)
    c.register_system_shared_memory("y", key, 4)
    c.register_system_shared_memory("x", key_x, 4)
    x = httpclient.InferInput("X", [1], "FP32")
    x.set_shared_memory("x", 4)
    out = httpclient.InferRequestedOutput("Y")
    out.set_shared_memory("y", 4)
    done = []
    t = threading.Thread(target=lambda: done.append(
        httpclient.InferenceServerClient(srv.http_url, network_timeout=120).infer("gated_py", [x], outputs=[out])))
    t.start()
    try:
        deadline = time.monotonic() + 60
        while not started.exists():
            assert time.monotonic() < deadline, "the request never reached execute()"
            time.sleep(0.02)
        assert not done
        for name in ("x", "y"):
            with pytest.raises(InferenceServerException,
                               match=f"Cannot unregister shared memory region '{name}', it is currently in use."):
                c.unregister_system_shared_memory(name)
        with pytest.raises(InferenceServerException, match="Failed to unregister the following system shared "
                                                           "memory regions: x ,y$"):
            c.unregister_system_shared_memory()
        assert not done, "the request was still held in execute()"
    finally:
        gate.touch()
    t.join(60)
    assert done, "the inference answered"
    assert shm.get_contents_as_numpy(h, np.float32, [1])[0] == 2.5
    c.unregister_system_shared_memory("y")
    c.unregister_system_shared_memory("x")
    assert c.get_system_shared_memory_status() == []
