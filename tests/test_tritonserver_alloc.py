"""Outputs straight into the application's memory: the `tritonserver` package's MemoryAllocator,
CPUAllocator, default_memory_allocators and the output_memory_allocator / output_memory_type
request options, as Triton r24.10 defines them. The application's allocator gets every output and
the model's answer lands in the very buffers it gave (same addresses, no copy after the library's
one); it runs on the thread that reads the answer, never on the server's; a GPU request without a
GPU allocator falls back to CPU or is refused as Triton's are; an allocator that raises fails that
request with INTERNAL and nothing else."""
import asyncio
import ctypes
import gc
import json
import shutil
import threading

import numpy
import pytest

import book
from conftest import REPO_ROOT

try:
    import tritonserver
except ImportError as e:
    import os
    if os.environ.get("MESH_REQUIRE_SERVER") == "1":
        raise
    pytest.skip(f"no tritonserver package ({e}): scripts/setup.sh puts it in .venv", allow_module_level=True)
from tritonserver import MemoryType

PY_MODELS = REPO_ROOT / "tests" / "python_models"


@pytest.fixture(scope="module")
def server(capi_lib, models_dir, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MESH_TRITONSERVER_LIBRARY", str(capi_lib))
        repo = tmp_path_factory.mktemp("alloc")
        shutil.copytree(models_dir / "simple" / "add_sub", repo / "add_sub")
        for name in ("echo_all_py", "repeat_py"):
            shutil.copytree(PY_MODELS / name, repo / name)
        s = tritonserver.Server(model_repository=str(repo), model_control_mode=tritonserver.ModelControlMode.EXPLICIT,
                                startup_models=["add_sub", "echo_all_py", "repeat_py"]).start(wait_until_ready=True)
        yield s
        s.stop()


class Preallocated(tritonserver.MemoryAllocator):
    """The application's allocator: a numpy array of its own per output, each recorded with the
    call that asked for it and the thread that asked."""

    def __init__(self):
        self.calls, self.arrays, self.buffers, self.threads = [], [], [], []

    def allocate(self, size, memory_type, memory_type_id):
        array = numpy.full(size, 0x5A, dtype=numpy.uint8)  # not the answer: overwritten in place
        buffer = tritonserver.MemoryBuffer.from_dlpack(array)
        self.calls.append((size, memory_type, memory_type_id))
        self.arrays.append(array)
        self.buffers.append(buffer)
        self.threads.append(threading.get_ident())
        return buffer


class Raising(tritonserver.MemoryAllocator):
    def allocate(self, size, memory_type, memory_type_id):
        raise Exception("foo")


X = numpy.arange(16, dtype=numpy.float32).reshape(1, 16)
Y = numpy.full((1, 16), 3, dtype=numpy.float32)


def add_sub(server, **options):
    return list(server.model("add_sub").infer(inputs={"INPUT0": X, "INPUT1": Y}, **options))


def test_the_applications_allocator_gets_every_output_and_the_answer_lands_in_its_arrays(server):
    mine = Preallocated()
    (response,) = add_sub(server, output_memory_allocator=mine)
    assert mine.calls == [(64, MemoryType.CPU, 0)] * 2  # one call per output, the server's preference
    assert mine.threads == [threading.get_ident()] * 2  # the thread that read the answer, not a server thread
    expected = {"OUTPUT0": X + Y, "OUTPUT1": X - Y}
    for name, array, buffer in zip(("OUTPUT0", "OUTPUT1"), mine.arrays, mine.buffers):
        out = response.outputs[name]
        assert out.memory_buffer is buffer and out.memory_buffer.owner is array  # the application's buffer
        assert out.data_ptr == array.ctypes.data and out.memory_type == MemoryType.CPU
        numpy.testing.assert_array_equal(array.view(numpy.float32).reshape(1, 16), expected[name])
        view = numpy.from_dlpack(out)
        assert view.ctypes.data == array.ctypes.data  # numpy reads the application's array itself
        array.view(numpy.float32)[0] = -1.0  # one memory: what the application writes, the tensor shows
        assert view[0, 0] == -1.0
    # The memory is the application's: it outlives the response and the library's copy of it.
    kept = mine.arrays[0]
    del response, out, view
    gc.collect()
    assert kept.view(numpy.float32)[1] == (X + Y)[0, 1]


def test_decoupled_answers_and_bytes_outputs_go_to_the_allocator_too(server):
    mine = Preallocated()
    responses = list(server.model("repeat_py").infer(inputs={"IN": numpy.array([4, 5, 6], numpy.int32)},
                                                     output_memory_allocator=mine))
    answers = [r for r in responses if r.outputs]
    assert len(answers) == 3 and responses[-1].final
    assert len(mine.calls) == 6  # OUT and IDX of each answer
    seen = {r.outputs[n].data_ptr for r in answers for n in ("OUT", "IDX")}
    assert seen == {a.ctypes.data for a in mine.arrays}
    assert [int(numpy.from_dlpack(r.outputs["OUT"])[0]) for r in answers] == [4, 5, 6]

    mine = Preallocated()
    (response,) = server.model("echo_all_py").infer(
        inputs={"string_input": tritonserver.Tensor.from_string_array([["hello", "wörld"]]),
                "fp64_input": numpy.array([[0.5, 2.0]])},
        parameters={"k": 1}, output_memory_allocator=mine)
    assert sorted(response.outputs) == ["fp64_output", "output_parameters", "string_output"]
    assert {t.data_ptr for t in response.outputs.values()} == {a.ctypes.data for a in mine.arrays}
    assert response.outputs["string_output"].to_string_array().tolist() == [["hello", "wörld"]]
    numpy.testing.assert_array_equal(numpy.from_dlpack(response.outputs["fp64_output"]), [[0.5, 2.0]])
    assert json.loads(response.outputs["output_parameters"].to_string_array()[0]) == {"k": 1}


def test_asyncio_answers_place_outputs_on_the_event_loops_thread(server):
    mine = Preallocated()

    async def run():
        loop_thread = threading.get_ident()
        async for r in server.model("add_sub").async_infer(inputs={"INPUT0": X, "INPUT1": Y},
                                                           output_memory_allocator=mine):
            return loop_thread, numpy.from_dlpack(r.outputs["OUTPUT0"]).ctypes.data

    loop_thread, address = asyncio.run(run())
    assert mine.threads == [loop_thread] * 2 and address == mine.arrays[0].ctypes.data


def test_an_allocator_that_raises_fails_that_request_with_an_internal_error_and_nothing_else(server):
    # Triton's test: the allocator raises, asked for GPU memory; iterating raises InternalError.
    with pytest.raises(tritonserver.InternalError, match="output 'string_output': the allocator failed: .*foo"):
        for _ in server.model("echo_all_py").infer(
                inputs={"string_input": tritonserver.Tensor.from_string_array([["hello"]])},
                output_memory_type="gpu", output_memory_allocator=Raising()):
            pass
    responses = add_sub(server, output_memory_allocator=Raising(), raise_on_error=False)
    assert len(responses) == 1 and responses[0].final
    assert isinstance(responses[0].error, tritonserver.InternalError) and responses[0].outputs == {}
    # An allocator that gives too little, or no MemoryBuffer, is the same failure, naming the output.
    for bad, reason in [(lambda size, t, i: tritonserver.MemoryBuffer.from_dlpack(numpy.zeros(size - 1, numpy.uint8)),
                         "'OUTPUT0' needs 64 bytes; the allocator gave 63"),
                        (lambda size, t, i: object(), "'OUTPUT0': the allocator failed: AttributeError")]:
        allocator = type("Bad", (tritonserver.MemoryAllocator,), {"allocate": lambda self, *a: bad(*a)})()
        with pytest.raises(tritonserver.InternalError, match=reason):
            add_sub(server, output_memory_allocator=allocator)
    # Nothing else: the next requests are served, with the same model and an allocator.
    mine = Preallocated()
    (ok,) = add_sub(server, output_memory_allocator=mine)
    assert ok.error is None and len(mine.calls) == 2
    (ok,) = add_sub(server)
    numpy.testing.assert_array_equal(numpy.from_dlpack(ok.outputs["OUTPUT1"]), X - Y)


def test_an_unsupported_memory_type_is_refused_as_triton_refuses_it(server):
    assert MemoryType.GPU not in tritonserver.default_memory_allocators  # the mesh writes CPU memory
    for device in ("gpu", "gpu:1", (MemoryType.GPU, 0), "cpu_pinned"):  # no default allocator of that type
        with pytest.raises(tritonserver.InvalidArgumentError, match="not supported by default_memory_allocators"):
            add_sub(server, output_memory_type=device)
    for device in ("unsupported", "cpu:x", "gpu:0:1", (1, 2)):
        with pytest.raises(tritonserver.InvalidArgumentError):
            add_sub(server, output_memory_type=device)

    # Memory the library cannot write (an allocator's GPU buffer) fails the request, writing nothing.
    untouched = numpy.full(64, 7, numpy.uint8)

    class Gpu(tritonserver.MemoryAllocator):
        def allocate(self, size, memory_type, memory_type_id):
            return tritonserver.MemoryBuffer(untouched.ctypes.data, MemoryType.GPU, 0, 64, untouched)

    with pytest.raises(tritonserver.UnsupportedError, match="output 'OUTPUT0': the buffer is GPU memory"):
        add_sub(server, output_memory_type="gpu", output_memory_allocator=Gpu())
    assert (untouched == 7).all()
    (ok,) = add_sub(server, output_memory_type="cpu")
    numpy.testing.assert_array_equal(numpy.from_dlpack(ok.outputs["OUTPUT0"]), X + Y)


def test_a_gpu_request_without_a_gpu_falls_back_to_cpu(server, monkeypatch):
    # Triton's test: no GPU allocator; the answer comes back in CPU memory, with its values.
    monkeypatch.delitem(tritonserver.default_memory_allocators, MemoryType.GPU, raising=False)
    (r,) = add_sub(server)
    assert r.outputs["OUTPUT0"].memory_type == MemoryType.CPU
    numpy.testing.assert_array_equal(numpy.from_dlpack(r.outputs["OUTPUT0"]), X + Y)
    # GPU asked of an allocator that gives CPU memory (allowed): it is asked for GPU, answers CPU.
    mine = Preallocated()
    (r,) = add_sub(server, output_memory_type=(MemoryType.GPU, 0), output_memory_allocator=mine)
    assert mine.calls == [(64, MemoryType.GPU, 0)] * 2
    assert r.outputs["OUTPUT1"].memory_type == MemoryType.CPU
    numpy.testing.assert_array_equal(numpy.from_dlpack(r.outputs["OUTPUT1"]), X - Y)
    # The default allocators serve every request that names none (r24.10): the application's
    # CPU allocator, put in their place, gets the outputs; and where the server prefers a memory
    # type with no default allocator (GPU: never the mesh's preference), the CPU one is asked.
    mine = Preallocated()
    monkeypatch.setitem(tritonserver.default_memory_allocators, MemoryType.CPU, mine)
    (r,) = add_sub(server)
    assert len(mine.calls) == 2 and r.outputs["OUTPUT0"].data_ptr == mine.arrays[0].ctypes.data
    from tritonserver._allocators import _Placement
    buffer = _Placement(None, None).buffer("OUTPUT0", 8, MemoryType.GPU, 0)
    assert mine.calls[-1] == (8, MemoryType.CPU, 0) and buffer is mine.buffers[-1]


def test_memory_buffers_and_the_cpu_allocator_hold_the_applications_memory_as_r24_10_does():
    allocator = tritonserver.default_memory_allocators[MemoryType.CPU]
    assert isinstance(allocator, tritonserver.CPUAllocator)
    buffer = allocator.allocate(memory_type=MemoryType.CPU, memory_type_id=0, size=200)
    assert buffer.size == 200 and buffer.owner.nbytes == 200
    tensor = tritonserver.Tensor(tritonserver.DataType.FP32, shape=[50], memory_buffer=buffer)
    floats = numpy.from_dlpack(tensor)
    assert floats.ctypes.data == buffer.owner.ctypes.data and floats.dtype == numpy.float32 and floats.nbytes == 200
    owner = numpy.zeros((4, 4), numpy.float64)
    assert tritonserver.MemoryBuffer.from_dlpack(owner).owner is owner  # held as given, not copied
    with pytest.raises(tritonserver.InvalidArgumentError, match="contiguous"):
        tritonserver.MemoryBuffer.from_dlpack(owner[:, 1])
    with pytest.raises(tritonserver.InvalidArgumentError, match="DLpack"):
        tritonserver.MemoryBuffer.from_dlpack(bytearray(8))
    with pytest.raises(tritonserver.InvalidArgumentError, match="read-only"):  # outputs may be written there
        tritonserver.MemoryBuffer.from_dlpack(numpy.frombuffer(b"immutable", numpy.uint8))
    with pytest.raises(TypeError):
        tritonserver.MemoryAllocator()  # abstract: allocate must be defined
    # r24.10's field order: a request made positionally has the allocator before the queue.
    names = list(tritonserver.InferenceRequest.__dataclass_fields__)
    assert names[names.index("output_memory_type"):][:3] == ["output_memory_type", "output_memory_allocator",
                                                             "response_queue"]


def test_the_library_refuses_placements_that_do_not_fit(server):
    """MESH_InferenceResponsePlaceOutputs, driven directly: a placement is checked whole (count,
    sizes, memory) before anything is written, and a response is placed once."""
    import struct
    from tritonserver import _library as L

    lib = L.lib()
    request = ctypes.c_void_p()
    L.check(lib.TRITONSERVER_InferenceRequestNew(ctypes.byref(request), server._ptr(), b"add_sub", -1))
    queue = ctypes.c_void_p()
    L.check(lib.MESH_ResponseQueueNew(ctypes.byref(queue)))
    record = b"".join(struct.pack("<IIIIqQQ2q", len(n), 11, 2, 0, 0, a.ctypes.data, a.nbytes, 1, 16) + n
                      for n, a in ((b"INPUT0", X), (b"INPUT1", Y)))
    L.check(lib.MESH_ServerInferPackedHeld(server._ptr(), request, record, len(record), queue))
    slots = (ctypes.c_uint64 * 32)()
    count, response = ctypes.c_uint32(), None
    while response is None:
        L.check(lib.MESH_ResponseQueuePopMany(queue, 1_000_000, slots, 8, ctypes.byref(count)))
        for i in range(count.value):
            if slots[4 * i] & 0xFFFFFFFF == 1:
                response = slots[4 * i + 1]
    one = struct.Struct("<QQI4xq")
    a, b, small = numpy.zeros(16, numpy.float32), numpy.zeros(16, numpy.float32), numpy.zeros(15, numpy.float32)
    try:
        for buffers, reason in [([a], "2 outputs, 1 buffers"), ([a, small], "has 64 bytes, its buffer 60")]:
            packed = b"".join(one.pack(x.ctypes.data, x.nbytes, 0, 0) for x in buffers)
            with pytest.raises(tritonserver.InvalidArgumentError, match=reason):
                L.check(lib.MESH_InferenceResponsePlaceOutputs(response, packed, len(buffers)))
        assert not a.any() and not small.any()
        packed = b"".join(one.pack(x.ctypes.data, x.nbytes, 0, 0) for x in (a, b))
        L.check(lib.MESH_InferenceResponsePlaceOutputs(response, packed, 2))
        numpy.testing.assert_array_equal(a, (X + Y)[0])
        numpy.testing.assert_array_equal(b, (X - Y)[0])
        with pytest.raises(tritonserver.InvalidArgumentError, match="not held"):
            L.check(lib.MESH_InferenceResponsePlaceOutputs(response, packed, 2))
    finally:
        L.check(lib.TRITONSERVER_InferenceResponseDelete(response))
        L.check(lib.MESH_ResponseQueueDelete(queue))


def test_the_books_allocator_example_runs_as_written(capi_lib, models_dir, server_env, tmp_path):
    env = dict(server_env, MESH_TRITONSERVER_LIBRARY=str(capi_lib))
    res = book.run_python("embed-python-allocator", tmp_path, env, models_dir / "simple")
    assert res.stdout.splitlines()[-1] == "True [ 0.  2.  4.  6.  8. 10. 12. 14. 16. 18. 20. 22. 24. 26. 28. 30.]", \
        res.stdout
