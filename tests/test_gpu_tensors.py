"""GPU tensors in Python models, the parts that run without a GPU (issue 42): CUDA DLPack capsules
taken zero-copy with Triton's checks and errors, exported again as CUDA capsules, the producer's
deleter run exactly once; objects on a GPU asked for stream 1; a GPU tensor that cannot be copied
out failing only its request; BLS with a GPU preferred memory answered in CPU memory where there
is no driver. Then the stub's driver calls end to end, against a stand-in CUDA driver
(tests/fixtures/stand_in_libcuda.c) whose device memory is host memory: a GPU output copied once
into the answer, BLS outputs put on the GPU and read back, a copy the driver refuses. tests/gpu/
runs the same model on a real GPU."""
import ctypes
import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

PY_MODELS = Path(__file__).parent / "python_models"
KDL_CUDA = 2


def has_cuda_driver():
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


@pytest.fixture
def pb(pb_utils_here):
    """triton_python_backend_utils imported here; `logged` holds its log lines."""
    module, lines = pb_utils_here
    module.logged = lines
    return module


class Producer:
    """A framework's CUDA tensor, as DLPack hands it over: a capsule over device memory (here an
    address nothing is behind) whose deleter counts its calls. Built from dlpack.h's layout alone."""

    def __init__(self, shape, strides=None, device_type=KDL_CUDA, code=2, bits=32, pointer=0x7F0000001000):
        cuda = importlib.import_module("mesh_stub_cuda")
        self.deleted = 0
        self.shape = (ctypes.c_int64 * len(shape))(*shape)
        self.strides = (ctypes.c_int64 * len(shape))(*strides) if strides else None
        self.managed = cuda.DLManagedTensor()
        t = self.managed.dl_tensor
        t.data, t.ndim, t.shape, t.byte_offset = pointer, len(shape), self.shape, 16
        t.strides = self.strides
        t.device = cuda.DLDevice(device_type, 3)
        t.dtype = cuda.DLDataType(code, bits, 1)

        def deleter(_):
            self.deleted += 1
        self.deleter = cuda.DELETER(deleter)
        self.managed.deleter = self.deleter
        new = ctypes.pythonapi.PyCapsule_New
        new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        self.capsule = new(ctypes.addressof(self.managed), b"dltensor", None)


def read_capsule(capsule):
    cuda = importlib.import_module("mesh_stub_cuda")
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return cuda.DLManagedTensor.from_address(get(capsule, b"dltensor")).dl_tensor


def test_a_cuda_capsule_is_taken_zero_copy_with_tritons_answers(pb):
    producer = Producer([2, 3])
    t = pb.Tensor.from_dlpack("OUT", producer.capsule)
    assert not t.is_cpu() and t.shape() == [2, 3] and t.triton_dtype() == "FP32"
    assert t.__dlpack_device__() == (KDL_CUDA, 3)
    assert t._gpu.pointer == 0x7F0000001000 + 16 and t._gpu.nbytes == 24, "the byte offset is applied, no copy"
    with pytest.raises(pb.TritonModelException, match=r"^Tensor is stored in GPU and cannot be converted to NumPy\.$"):
        t.as_numpy()
    with pytest.raises(pb.TritonModelException, match="already consumed"):
        pb.Tensor.from_dlpack("AGAIN", producer.capsule)
    # Exported again: a CUDA capsule over the same memory, consumable once.
    exported = t.to_dlpack()
    out = read_capsule(exported)
    assert (out.device.device_type, out.device.device_id) == (KDL_CUDA, 3)
    assert out.data == 0x7F0000001000 + 16 and [out.shape[i] for i in range(out.ndim)] == [2, 3]
    again = pb.Tensor.from_dlpack("AGAIN", t.__dlpack__())
    assert again._gpu.pointer == t._gpu.pointer and again.shape() == [2, 3]
    assert producer.deleted == 0, "the producer's memory lives while any tensor or capsule holds it"
    del t, out, exported, again  # `exported` was never consumed: its own end releases it
    import gc
    gc.collect()
    assert producer.deleted == 1, "the producer's deleter runs exactly once, when the last holder goes"


def test_cuda_capsules_are_checked_as_triton_checks_them(pb):
    with pytest.raises(pb.TritonModelException, match=r"^DLPack tensor is not contiguous\. Only contiguous"):
        pb.Tensor.from_dlpack("T", Producer([2, 3], strides=[1, 2]).capsule)
    # Dimensions of 1 may have any stride (Triton skips them).
    assert pb.Tensor.from_dlpack("T", Producer([2, 1, 3], strides=[3, 99, 1]).capsule).shape() == [2, 1, 3]
    with pytest.raises(pb.TritonModelException, match=r"^DLDevice type 4 is not support by Python backend\.$"):
        pb.Tensor.from_dlpack("T", Producer([2], device_type=4).capsule)
    with pytest.raises(pb.TritonModelException, match="DLPack type code 5 of 64 bits"):
        pb.Tensor.from_dlpack("T", Producer([2], code=5, bits=64).capsule)  # complex64: no Triton type
    assert pb.Tensor.from_dlpack("T", Producer([4], code=4, bits=16).capsule).triton_dtype() == "BF16"
    with pytest.raises(pb.TritonModelException, match=r"^Tensor name cannot be an empty string\.$"):
        pb.Tensor.from_dlpack("", Producer([2]).capsule)


def test_cpu_tensors_speak_the_dlpack_protocol_too(pb):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = pb.Tensor("X", x)
    assert t.__dlpack_device__() == (1, 0) and t.is_cpu()
    y = np.from_dlpack(t)
    assert np.shares_memory(x, y) and y.tolist() == x.tolist()
    with pytest.raises(pb.TritonModelException, match="DLPack does not have support for string tensors"):
        pb.Tensor("S", np.array([b"a"], dtype=np.object_)).to_dlpack()


@pytest.mark.skipif(has_cuda_driver(), reason="checks the answer of a machine without a CUDA driver")
def test_an_object_on_a_gpu_is_asked_for_stream_one_then_synchronised(pb):
    producer = Producer([4])
    asked = []

    class OnGpu:
        def __dlpack_device__(self):
            return (KDL_CUDA, 0)

        def __dlpack__(self, stream=None):
            asked.append(stream)
            return producer.capsule

    with pytest.raises(pb.TritonModelException,
                       match=r"^Failed to synchronize CUDA device with id 0: this machine has no CUDA driver"):
        pb.Tensor.from_dlpack("T", OnGpu())
    assert asked == [1], "DLPack's stream 1, the legacy default stream, as the array API asks"


@pytest.mark.skipif(has_cuda_driver(), reason="checks the answer of a machine without a CUDA driver")
def test_bls_outputs_preferred_on_a_gpu_stay_on_the_cpu_without_a_driver(pb):
    response = pb.InferenceResponse([pb.Tensor("OUT", np.ones(3, np.float32))])
    preferred = pb.PreferredMemory(pb.TRITONSERVER_MEMORY_GPU, 0)
    placed = pb._placed(response, preferred)
    placed = pb._placed(placed, preferred)
    assert placed.output_tensors()[0].is_cpu()
    assert [level for level, m in pb.logged if "BLS outputs stay in CPU memory" in m] == ["warn"], \
        "said once, not per call"


@pytest.fixture(scope="module")
def gpu_server(server_factory, models_dir, tmp_path_factory):
    repo = tmp_path_factory.mktemp("gpu-tensors")
    shutil.copytree(PY_MODELS / "gpu_tensors_py", repo / "gpu_tensors_py")
    shutil.copytree(models_dir / "simple" / "add_sub", repo / "add_sub")
    return server_factory([repo], ["--backend-config", f"python,interpreter={sys.executable}"],
                          name="gpu-tensors", wait_models=["gpu_tensors_py", "add_sub"])


def call(server, mode, x):
    with httpclient.InferenceServerClient(server.http_url) as client:
        t = httpclient.InferInput("X", list(x.shape), "FP32")
        t.set_data_from_numpy(x)
        return client.infer("gpu_tensors_py", [t], parameters={"mode": mode})


@pytest.mark.server
@pytest.mark.skipif(has_cuda_driver(), reason="checks the answer of a machine without a CUDA driver")
def test_a_gpu_output_that_cannot_be_copied_fails_only_its_request(gpu_server):
    x = np.array([1.0, 2.0, 3.0], np.float32)
    with pytest.raises(InferenceServerException, match="cannot send the outputs: this machine has no CUDA driver"):
        call(gpu_server, "fake", x)
    r = call(gpu_server, "bls", x)  # the same instance keeps serving
    np.testing.assert_array_equal(r.as_numpy("Y"), np.full((1, 16), 2.0, np.float32))  # add_sub: 1 + 1
    assert r.as_numpy("ON_GPU").tolist() == [False], "no driver: the BLS outputs stayed in CPU memory"


@pytest.fixture(scope="module")
def stand_in_server(mesh_bin, server_env, tmp_path_factory, models_dir):
    """A node whose Python stubs find tests/fixtures/stand_in_libcuda.c, built here as libcuda.so.1,
    in place of the CUDA driver (its "device" memory is host memory; it reports no devices, so the
    node itself stays CPU-only). Its calls are logged to the file `server.calls`."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler to build the stand-in CUDA driver")
    from conftest import LOG_DIR
    from mesh_util import MeshServer
    work = tmp_path_factory.mktemp("stand-in-cuda")
    lib = work / "lib"
    lib.mkdir()
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(lib / "libcuda.so.1"),
                    str(Path(__file__).parent / "fixtures" / "stand_in_libcuda.c")], check=True, timeout=60)
    repo = work / "repo"
    shutil.copytree(PY_MODELS / "gpu_tensors_py", repo / "gpu_tensors_py")
    shutil.copytree(models_dir / "simple" / "add_sub", repo / "add_sub")
    env = dict(server_env, LD_LIBRARY_PATH=f"{lib}:{server_env.get('LD_LIBRARY_PATH', '')}",
               STAND_IN_CUDA_LOG=str(work / "calls.log"))
    server = MeshServer(mesh_bin, [repo], ["--backend-config", f"python,interpreter={sys.executable}"],
                        LOG_DIR / "gpu-stand-in.log", env)
    server.start(["gpu_tensors_py", "add_sub"])
    server.calls = work / "calls.log"
    yield server
    server.stop()


def calls_since(server, before):
    """The driver calls made since `before` lines, less the one-time set-up of a process."""
    lines = server.calls.read_text().splitlines() if server.calls.exists() else []
    return [c for c in lines[before:] if c not in ("cuInit", "cuDeviceGet")]


def count_calls(server):
    return len(server.calls.read_text().splitlines()) if server.calls.exists() else 0


@pytest.mark.server
@pytest.mark.parametrize("mode", ["as_gpu", "object"])
def test_a_gpu_output_is_copied_once_into_the_answer_through_the_driver(stand_in_server, mode):
    x = np.array([1.0, -2.0, 0.5, 4.0, 8.0], np.float32)
    before = count_calls(stand_in_server)
    r = call(stand_in_server, mode, x)
    np.testing.assert_array_equal(r.as_numpy("Y"), 3 * x)
    calls = calls_since(stand_in_server, before)
    assert calls.count("cuMemcpyDtoH") == 1, calls
    if mode == "object":  # an object on a GPU: stream 1 asked for, then waited for
        assert "cuStreamSynchronize(legacy)" in calls, calls


@pytest.mark.server
def test_bls_outputs_go_to_the_preferred_gpu_and_come_back(stand_in_server):
    before = count_calls(stand_in_server)
    r = call(stand_in_server, "bls", np.array([4.0], np.float32))
    assert r.as_numpy("ON_GPU").tolist() == [True], "PreferredMemory(GPU, 0): the output was put on the GPU"
    np.testing.assert_array_equal(r.as_numpy("Y"), np.full((1, 16), 5.0, np.float32))  # add_sub: 4 + 1
    calls = calls_since(stand_in_server, before)
    # To the GPU and waited for (HtoD from pageable memory may return early), then out once.
    assert calls[:3] == ["cuMemAlloc", "cuMemcpyHtoD", "cuStreamSynchronize(legacy)"], calls
    assert calls.count("cuMemcpyDtoH") == 1, calls


@pytest.mark.server
def test_a_copy_the_driver_refuses_fails_only_its_request(stand_in_server):
    with pytest.raises(InferenceServerException,
                       match=r"cannot send the outputs: copying 16 bytes from GPU 0 failed: CUDA_ERROR_INVALID_VALUE"):
        call(stand_in_server, "fake", np.array([1.0], np.float32))
    x = np.array([2.0], np.float32)
    np.testing.assert_array_equal(call(stand_in_server, "as_gpu", x).as_numpy("Y"), 3 * x)
