"""The mesh's `tritonserver` Python package (Triton's in-process Python API over libtritonserver.so):
a server started in this test process, its models called with numpy arrays, lists and Tensors,
decoupled answers, asyncio, response queues, load/unload, statistics and metrics, Triton's
exception classes for bad input, and tensors shared with numpy without copies."""
import asyncio
import gc
import json
import os
import queue
import shutil
import sys

import numpy
import pytest

from conftest import REPO_ROOT

try:
    import tritonserver
except ImportError as e:
    if os.environ.get("MESH_REQUIRE_SERVER") == "1":
        raise  # set-up puts the package on .venv's path: its absence is a failure, not a skip
    pytest.skip(f"no tritonserver package ({e}): scripts/setup.sh puts it in .venv", allow_module_level=True)
PY_MODELS = REPO_ROOT / "tests" / "python_models"


@pytest.fixture(scope="module")
def repo(capi_lib, models_dir, tmp_path_factory, monkeypatch_module):
    monkeypatch_module.setenv("MESH_TRITONSERVER_LIBRARY", str(capi_lib))
    out = tmp_path_factory.mktemp("inprocess")
    shutil.copytree(models_dir / "simple" / "add_sub", out / "add_sub")
    for name in ("echo_all_py", "repeat_py", "add_sub_py"):
        shutil.copytree(PY_MODELS / name, out / name)
    return out


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


@pytest.fixture(scope="module")
def server(repo):
    s = tritonserver.Server(model_repository=str(repo), model_control_mode=tritonserver.ModelControlMode.EXPLICIT,
                            startup_models=["add_sub"], server_id="in-process").start(wait_until_ready=True)
    s.load("echo_all_py")
    yield s
    s.stop()


def test_a_server_refuses_what_tritons_package_refuses(repo):
    with pytest.raises(tritonserver.InvalidArgumentError, match="not started"):
        tritonserver.Server(model_repository=str(repo)).ready()
    with pytest.raises(TypeError):
        tritonserver.Server(server_id=1, model_repository=str(repo)).start()
    with pytest.raises(TypeError):
        tritonserver.Server(model_repository=1).start()
    with pytest.raises(tritonserver.InvalidArgumentError):
        tritonserver.Server(model_repository=None).start()
    with pytest.raises(tritonserver.InternalError):
        tritonserver.Server(model_repository=str(repo / "no-such-dir")).start()


def test_the_server_answers_metadata_index_and_readiness(server):
    assert server.live() and server.ready()
    assert server.metadata()["name"] == "in-process"
    models = server.models()
    assert models[("add_sub", 1)].state == "READY"
    assert server.model("add_sub").ready()
    assert server.model("add_sub").batch_properties() == tritonserver.ModelBatchFlag.FIRST_DIM
    assert server.model("echo_all_py").transaction_properties() == tritonserver.ModelTxnPropertyFlag.ONE_TO_ONE
    assert server.model("add_sub").config()["max_batch_size"] == 8
    assert [i["name"] for i in server.model("add_sub").metadata()["inputs"]] == ["INPUT0", "INPUT1"]
    with pytest.raises(tritonserver.NotFoundError):
        server.model("no_such_model").metadata()


def test_an_onnx_model_answers_numpy_inputs_with_tensors_numpy_reads_in_place(server):
    x = numpy.arange(16, dtype=numpy.float32).reshape(1, 16)
    y = numpy.ones((1, 16), dtype=numpy.float32)
    responses = list(server.model("add_sub").infer(inputs={"INPUT0": x, "INPUT1": y}, request_id="r1",
                                                   raise_on_error=True))
    assert len(responses) == 1 and responses[0].final and responses[0].request_id == "r1"
    out = responses[0].outputs["OUTPUT0"]
    assert out.data_type == tritonserver.DataType.FP32 and list(out.shape) == [1, 16]
    array = numpy.from_dlpack(out)
    assert array.ctypes.data == out.data_ptr  # numpy reads the server's buffer, no copy
    numpy.testing.assert_array_equal(array, x + y)
    numpy.testing.assert_array_equal(numpy.from_dlpack(responses[0].outputs["OUTPUT1"]), x - y)


def test_every_data_type_and_the_parameters_make_the_round_trip(server):
    inputs = {f"{n}_input": numpy.array([[1, 0, 3]], dtype=t) for n, t in [
        ("bool", numpy.bool_), ("uint8", numpy.uint8), ("uint16", numpy.uint16), ("uint32", numpy.uint32),
        ("uint64", numpy.uint64), ("int8", numpy.int8), ("int16", numpy.int16), ("int32", numpy.int32),
        ("int64", numpy.int64), ("fp16", numpy.float16), ("fp32", numpy.float32), ("fp64", numpy.float64)]}
    inputs["string_input"] = [["hello", "wörld"]]
    parameters = {"int_parameter": 7, "float_parameter": 0.5, "bool_parameter": False, "string_parameter": "test"}
    (response,) = server.model("echo_all_py").infer(inputs=inputs, parameters=parameters, raise_on_error=True)
    for name, value in inputs.items():
        out = response.outputs[name.replace("input", "output")]
        if name == "string_input":
            assert out.to_string_array().tolist() == [["hello", "wörld"]]
        else:
            numpy.testing.assert_array_equal(numpy.from_dlpack(out), value)
    assert json.loads(response.outputs["output_parameters"].to_string_array()[0]) == parameters


def test_bad_requests_raise_tritons_exceptions_at_once(server):
    model = server.model("add_sub")
    good = numpy.ones((1, 16), dtype=numpy.float32)
    with pytest.raises(tritonserver.InvalidArgumentError, match="expects FP32"):
        model.infer(inputs={"INPUT0": good.astype(numpy.int32), "INPUT1": good})
    with pytest.raises(tritonserver.InvalidArgumentError, match="shape"):
        model.infer(inputs={"INPUT0": good[:, :15], "INPUT1": good})
    with pytest.raises(tritonserver.NotFoundError):
        server.model("no_such_model").infer(inputs={"INPUT0": good})
    for bad in ({"invalid": {"test": 1}}, {"invalid": None}):
        with pytest.raises(tritonserver.InvalidArgumentError):
            model.infer(inputs={"INPUT0": good, "INPUT1": good}, parameters=bad)
    with pytest.raises(tritonserver.InvalidArgumentError):
        model.infer(inputs={"INPUT0": good, "INPUT1": good}, output_memory_type="unsupported")
    with pytest.raises(tritonserver.InvalidArgumentError, match="not supported by default_memory_allocators"):
        model.infer(inputs={"INPUT0": good, "INPUT1": good}, output_memory_type="gpu")  # no GPU allocator
    # the server keeps serving
    (ok,) = model.infer(inputs={"INPUT0": good, "INPUT1": good}, raise_on_error=True)
    assert ok.error is None


def test_a_decoupled_model_streams_its_answers_and_the_final_flag(server):
    server.load("echo_all_py", {"config": json.dumps(
        {"backend": "python", "parameters": {"decoupled": {"string_value": "True"}}})})
    try:
        model = server.model("echo_all_py")
        assert model.transaction_properties() == tritonserver.ModelTxnPropertyFlag.DECOUPLED
        responses = list(model.infer(inputs={"int32_input": numpy.array([[1, 2]], numpy.int32)}, raise_on_error=True))
        assert [r.final for r in responses] == [False, False, True]
        assert [sorted(r.outputs) for r in responses] == [["int32_output", "output_parameters"]] * 2 + [[]]
    finally:
        server.load("echo_all_py")


def test_responses_also_go_to_a_response_queue_and_asyncio_gets_them_too(server):
    x = numpy.ones((1, 16), dtype=numpy.float32)
    q = queue.SimpleQueue()
    iterators = [server.model("add_sub").infer(inputs={"INPUT0": x, "INPUT1": x}, response_queue=q) for _ in range(2)]
    for _ in range(2):
        numpy.testing.assert_array_equal(numpy.from_dlpack(q.get(timeout=10).outputs["OUTPUT0"]), x * 2)
    assert [len(list(it)) for it in iterators] == [1, 1]
    assert q.empty()

    async def run():
        aq = asyncio.Queue()
        answers = []
        async for r in server.model("add_sub").async_infer(inputs={"INPUT0": x, "INPUT1": x}, response_queue=aq,
                                                          raise_on_error=True):
            answers.append(numpy.from_dlpack(r.outputs["OUTPUT1"]))
        return answers, aq.qsize()

    answers, queued = asyncio.run(run())
    assert len(answers) == 1 and queued == 1
    numpy.testing.assert_array_equal(answers[0], x * 0)


def test_load_unload_statistics_and_metrics(server):
    model = server.load("repeat_py")
    assert model.ready()
    responses = list(model.infer(inputs={"IN": numpy.array([4, 5, 6], dtype=numpy.int32)}, raise_on_error=True))
    assert [int(numpy.from_dlpack(r.outputs["OUT"])[0]) for r in responses if r.outputs] == [4, 5, 6]
    # BLS from a model served in process: each answer goes through add_sub_py ((v + 1) - 1).
    server.load("add_sub_py")
    responses = list(model.infer(inputs={"IN": numpy.array([7, 8], dtype=numpy.int32)}, parameters={"bls": True},
                                 raise_on_error=True))
    assert [int(numpy.from_dlpack(r.outputs["OUT"])[0]) for r in responses if r.outputs] == [7, 8]
    stats = server.model("add_sub").statistics()["model_stats"][0]
    assert stats["name"] == "add_sub" and stats["inference_count"] >= 1
    assert 'nv_inference_request_success{model="add_sub",version="1"}' in server.metrics()
    server.unload("repeat_py", wait_until_unloaded=True)
    assert server.models()[("repeat_py", -1)].state == "UNAVAILABLE"
    with pytest.raises(tritonserver.UnavailableError):
        list(server.model("repeat_py").infer(inputs={"IN": numpy.array([1], dtype=numpy.int32)}))


def test_an_ensemble_answers_in_process_with_its_steps_chained(server, repo):
    """An ensemble of two add_sub steps, loaded through the package: (x + y) and (x - y) go through
    add_sub again, so the answers are 2x and 2y."""
    chain = repo / "add_sub_chain"
    (chain / "1").mkdir(parents=True, exist_ok=True)

    def io(prefix):
        return ", ".join(f'{{ name: "{prefix}{i}" data_type: TYPE_FP32 dims: [ 16 ] }}' for i in (0, 1))

    (chain / "config.pbtxt").write_text(
        'name: "add_sub_chain"\nplatform: "ensemble"\nmax_batch_size: 8\n'
        f'input [ {io("IN")} ]\noutput [ {io("OUT")} ]\n'
        'ensemble_scheduling { step [\n'
        '  { model_name: "add_sub" model_version: -1 input_map { key: "INPUT0" value: "IN0" }\n'
        '    input_map { key: "INPUT1" value: "IN1" } output_map { key: "OUTPUT0" value: "SUM" }\n'
        '    output_map { key: "OUTPUT1" value: "DIFF" } },\n'
        '  { model_name: "add_sub" model_version: -1 input_map { key: "INPUT0" value: "SUM" }\n'
        '    input_map { key: "INPUT1" value: "DIFF" } output_map { key: "OUTPUT0" value: "OUT0" }\n'
        '    output_map { key: "OUTPUT1" value: "OUT1" } } ] }\n')
    model = server.load("add_sub_chain")
    x = numpy.arange(16, dtype=numpy.float32).reshape(1, 16)
    y = numpy.full((1, 16), 3, dtype=numpy.float32)
    responses = list(model.infer(inputs={"IN0": x, "IN1": y}, raise_on_error=True))
    assert responses[-1].final
    (answer,) = [r for r in responses if r.outputs]
    numpy.testing.assert_array_equal(numpy.from_dlpack(answer.outputs["OUT0"]), 2 * x)
    numpy.testing.assert_array_equal(numpy.from_dlpack(answer.outputs["OUT1"]), 2 * y)
    with pytest.raises(tritonserver.InvalidArgumentError):
        list(model.infer(inputs={"IN0": x}, raise_on_error=True))  # IN1 missing
    server.unload("add_sub_chain", wait_until_unloaded=True)


def test_tensors_share_memory_with_numpy_and_hold_exactly_one_reference():
    gc.collect()
    owner = numpy.ones(1 << 20)
    tensor = tritonserver.Tensor.from_dlpack(owner)
    assert sys.getrefcount(owner) - 1 == 2  # the tensor's one reference
    array = numpy.from_dlpack(tensor)
    assert array.ctypes.data == owner.ctypes.data
    assert sys.getrefcount(tensor) - 1 == 2  # the array's one reference
    tensor.shape = [2, 1 << 19]
    assert numpy.from_dlpack(tensor).shape == (2, 1 << 19) and array.shape == (1 << 20,)
    del owner, tensor, array
    gc.collect()
    assert not [o for o in gc.get_objects() if type(o) is tritonserver.Tensor], "a Tensor leaked"
    strings = tritonserver.Tensor.from_string_array([["a", "bc"], ["", "déf"]])
    assert strings.data_type == tritonserver.DataType.BYTES
    assert strings.to_bytes_array().tolist() == [[b"a", b"bc"], [b"", "déf".encode()]]
    with pytest.raises(tritonserver.InvalidArgumentError):
        numpy.from_dlpack(strings)


def test_arrays_of_any_layout_and_byte_order_arrive_as_their_values(server):
    model = server.model("add_sub")
    base = numpy.arange(32, dtype=numpy.float32).reshape(2, 16)
    strided = base[:1, :]  # contiguous
    transposed = numpy.arange(16, dtype=numpy.float32).reshape(16, 1).T  # not C-contiguous
    big_endian = numpy.arange(16, dtype=">f4").reshape(1, 16)
    for x in (strided, transposed, big_endian):
        (r,) = model.infer(inputs={"INPUT0": x, "INPUT1": numpy.ones((1, 16), numpy.float32)}, raise_on_error=True)
        numpy.testing.assert_array_equal(numpy.from_dlpack(r.outputs["OUTPUT0"]),
                                         numpy.asarray(x, dtype=numpy.float32) + 1)


def test_the_one_call_extensions_refuse_broken_records_and_reuse_their_queues(server):
    """The library's packed-record calls (what the package sends every request with), driven directly:
    a record cut short, one with too many dims or a name that is not UTF-8 is INVALID_ARG with its
    reason and adds no input; a good one answers; queues are reused, not made per request."""
    import ctypes
    import struct
    from tritonserver import _library as L
    from tritonserver import _request as R

    lib = L.lib()
    x = numpy.ones((1, 16), dtype=numpy.float32)

    def record(name: bytes, dims: list, data_type: int = 11, size: int = x.nbytes) -> bytes:
        return (struct.pack("<IIIIqQQ", len(name), data_type, len(dims), 0, 0, x.ctypes.data, size)
                + struct.pack(f"<{len(dims)}q", *dims) + name)

    request = ctypes.c_void_p()
    L.check(lib.TRITONSERVER_InferenceRequestNew(ctypes.byref(request), server._ptr(), b"add_sub", -1))
    try:
        good = record(b"INPUT0", [1, 16]) + record(b"INPUT1", [1, 16])
        for bad, reason in [(good[:-1], "runs past their end"), (good[:39], "runs past their end"),
                            (record(b"INPUT0", [1] * 65), "65 dims"), (record(b"\xff", [1, 16]), "not UTF-8"),
                            (record(b"INPUT0", [1, 16], data_type=99), "invalid datatype 99")]:
            with pytest.raises(tritonserver.InvalidArgumentError, match=reason):
                L.check(lib.MESH_InferenceRequestAddInputsPacked(request, bad, len(bad)))
        # Nothing of a refused call was added: the good records go in whole.
        L.check(lib.MESH_InferenceRequestAddInputsPacked(request, good, len(good)))
        with pytest.raises(tritonserver.InvalidArgumentError, match="already exists"):
            L.check(lib.MESH_InferenceRequestAddInputsPacked(request, good, len(good)))
    finally:
        L.check(lib.TRITONSERVER_InferenceRequestDelete(request))
    with pytest.raises(tritonserver.InvalidArgumentError, match="inference request is null"):
        L.check(lib.MESH_ServerInferPacked(server._ptr(), None, None, 0, None))

    while R._QUEUES:
        L.check(lib.MESH_ResponseQueueDelete(R._QUEUES.pop()[0]))
    for _ in range(50):
        (r,) = server.model("add_sub").infer(inputs={"INPUT0": x, "INPUT1": x}, raise_on_error=True)
        numpy.testing.assert_array_equal(numpy.from_dlpack(r.outputs["OUTPUT1"]), x * 0)
    assert len(R._QUEUES) == 1, "one request at a time needs one queue"


def test_threads_and_tasks_at_once_each_get_their_own_answers(server):
    """Eight threads and fifty asyncio tasks sending at once: every answer is its own request's
    (no queue shared by two requests at a time), and the idle queues kept stay bounded."""
    import threading
    from tritonserver import _request as R

    model = server.model("add_sub")
    failures = []

    def worker(k):
        for i in range(100):
            x = numpy.full((1, 16), k * 1000 + i, dtype=numpy.float32)
            (r,) = model.infer(inputs={"INPUT0": x, "INPUT1": x}, raise_on_error=True)
            if not (numpy.from_dlpack(r.outputs["OUTPUT0"]) == 2 * x).all():
                failures.append((k, i))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
    assert 1 <= len(R._QUEUES) <= R._QUEUES_KEPT

    async def one(k):
        x = numpy.full((1, 16), k, dtype=numpy.float32)
        async for r in model.async_infer(inputs={"INPUT0": x, "INPUT1": x}, raise_on_error=True):
            return float(numpy.from_dlpack(r.outputs["OUTPUT0"])[0, 0])

    async def many():
        return await asyncio.gather(*(one(k) for k in range(50)))

    assert asyncio.run(many()) == [2.0 * k for k in range(50)]


def test_a_stopped_server_refuses_calls(repo):
    s = tritonserver.Server(model_repository=str(repo), model_control_mode=tritonserver.ModelControlMode.EXPLICIT,
                            startup_models=["add_sub"]).start()
    model = s.model("add_sub")
    s.stop()
    with pytest.raises(tritonserver.InvalidArgumentError, match="not started"):
        model.infer(inputs={"INPUT0": numpy.ones((1, 16), numpy.float32)})
    with pytest.raises(tritonserver.InvalidArgumentError, match="not started"):
        s.ready()


def test_the_books_python_example_runs_as_written(capi_lib, models_dir, server_env, tmp_path):
    import book
    env = dict(server_env, MESH_TRITONSERVER_LIBRARY=str(capi_lib))
    res = book.run_python("embed-python", tmp_path, env, models_dir / "simple")
    assert res.stdout.startswith("[[ 0.  2.  4.  6."), res.stdout
    assert "'model_stats'" in res.stdout and "# HELP " in res.stdout  # the metrics' first 80 characters
