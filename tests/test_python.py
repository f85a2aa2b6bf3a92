"""The Python backend through tritonclient: Triton model.py files run unmodified in stub processes,
BLS (sync, async, an autoregressive loop) goes back through the node, and failures stay contained."""
import json
import re
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException
from mesh_util import wait_pending

pytestmark = [pytest.mark.server]

PY_MODELS = Path(__file__).parent / "python_models"
SERVING = ["add_sub_py", "py_package", "bls_twice", "bls_async", "py_errors", "auto_cfg", "strings_py", "seal_loop",
           "dlpack_py", "bls_outer", "bls_outer2", "bls_threads", "add_sub", "seal_encoder", "seal_decoder",
           "each_py", "inplace_py"]


def seal_models(repo: Path):
    """A toy encoder (memory = pixels) and decoder (next = token + 1 while token < sum(memory), else 0)."""
    import onnx
    from onnx import TensorProto, helper
    enc = helper.make_graph([helper.make_node("Identity", ["pixels"], ["memory"])], "enc",
                            [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, [1, 8])],
                            [helper.make_tensor_value_info("memory", TensorProto.FLOAT, [1, 8])])
    one = helper.make_tensor("one", TensorProto.INT64, [1, 1], [1])
    zero = helper.make_tensor("zero", TensorProto.INT64, [1, 1], [0])
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    dec = helper.make_graph([
        helper.make_node("ReduceSum", ["memory", "axes"], ["total"], keepdims=1),
        helper.make_node("Cast", ["total"], ["length"], to=TensorProto.INT64),
        helper.make_node("Less", ["token", "length"], ["more"]),
        helper.make_node("Add", ["token", "one"], ["plus"]),
        helper.make_node("Where", ["more", "plus", "zero"], ["next_token"]),
    ], "dec", [helper.make_tensor_value_info("memory", TensorProto.FLOAT, [1, 8]),
               helper.make_tensor_value_info("token", TensorProto.INT64, [1, 1])],
        [helper.make_tensor_value_info("next_token", TensorProto.INT64, [1, 1])], [one, zero, axes])
    for name, graph in (("seal_encoder", enc), ("seal_decoder", dec)):
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        (repo / name / "1").mkdir(parents=True)
        onnx.save(model, str(repo / name / "1" / "model.onnx"))
        (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "onnxruntime"\n')


def python_repo(tmp: Path, models_dir: Path) -> Path:
    repo = tmp / "pyrepo"
    shutil.copytree(PY_MODELS, repo)
    shutil.copytree(models_dir / "simple" / "add_sub", repo / "add_sub")
    seal_models(repo)
    return repo


def python_args(timeout_secs=3):
    return ["--backend-config", f"python,interpreter={sys.executable}",
            "--backend-config", f"python,execute-timeout-seconds={timeout_secs}"]


@pytest.fixture(scope="module")
def py_server(server_factory, models_dir, tmp_path_factory):
    repo = python_repo(tmp_path_factory.mktemp("python"), models_dir)
    srv = server_factory([repo], python_args() + ["--strict-readiness", "false"], name="python",
                         wait_models=SERVING)
    srv.repo = repo
    return srv


@pytest.fixture
def http(py_server):
    c = httpclient.InferenceServerClient(py_server.http_url)
    yield c
    c.close()


def fp32(name, array, mod=httpclient):
    t = mod.InferInput(name, list(array.shape), "FP32")
    t.set_data_from_numpy(array)
    return t


def test_triton_add_sub_example_runs_unchanged(http, py_server):
    a = np.array([1, 2, 3, 4], np.float32)
    b = np.array([10, 20, 30, 40], np.float32)
    r = http.infer("add_sub_py", [fp32("INPUT0", a), fp32("INPUT1", b)])
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)
    g = grpcclient.InferenceServerClient(py_server.grpc_url)
    try:
        r = g.infer("add_sub_py", [fp32("INPUT0", a, grpcclient), fp32("INPUT1", b, grpcclient)],
                    outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
        np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)
        assert r.as_numpy("OUTPUT0") is None, "only the requested output comes back"
    finally:
        g.close()


def test_a_model_sees_its_package_a_clean_argv_and_tritons_instance_name(http):
    """`from . import helper` in model.py, argparse on sys.argv in initialize(), and
    args["model_instance_name"] as real Triton 2.51 names it: `<model>_<index>` for a config without
    instance_group (py_package), `<model>_<group>_<index>` with one (add_sub_py: `add_sub_py_0_0`,
    as Triton's own init_args test expects)."""
    import json
    r = http.infer("py_package", [fp32("IN", np.array([1.5, -2], np.float32))])
    np.testing.assert_array_equal(r.as_numpy("OUT"), [3, -4])
    assert json.loads(r.as_numpy("ARGV")[0]) == [""]
    assert r.as_numpy("INSTANCE")[0] == b"py_package_0"


def test_bls_calls_another_model_twice(http):
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    b = np.full((2, 16), 0.5, np.float32)
    r = http.infer("bls_twice", [fp32("INPUT0", a), fp32("INPUT1", b)])
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + 2 * b)
    stats = http.get_inference_statistics("add_sub")["model_stats"][0]
    assert int(stats["inference_count"]) >= 4, "the BLS calls are counted by the model they reach"


def test_nested_bls_runs_python_models_inline_on_the_calling_thread(http):
    """bls_outer (Python) calls bls_twice (Python, run inline on bls_outer's thread), which calls
    the ONNX add_sub in turn: a blocking BLS inside a blocking BLS."""
    before = int(http.get_inference_statistics("bls_twice")["model_stats"][0]["inference_count"])
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.full((1, 16), 2.0, np.float32)
    for _ in range(3):
        r = http.infer("bls_outer", [fp32("INPUT0", a), fp32("INPUT1", b)])
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + 2 * b)
    after = int(http.get_inference_statistics("bls_twice")["model_stats"][0]["inference_count"])
    assert after - before == 3, "the inner model ran once per call and kept its own statistics"
    for _ in range(3):  # three Python levels: a wait inside a wait inside a wait on one thread
        r = http.infer("bls_outer2", [fp32("INPUT0", a), fp32("INPUT1", b)])
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + 2 * b)


def test_blocking_bls_from_a_thread_pool(http):
    """Threads of one execute() each wait for their own BLS answer, whichever thread reads it."""
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    for _ in range(40):
        r = http.infer("bls_threads", [fp32("INPUT0", x)])
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), 4 * x + 6)


def test_async_bls_overlaps_and_reports_errors_per_call(http):
    a = np.full((1, 16), 3.0, np.float32)
    b = np.ones((1, 16), np.float32)
    r = http.infer("bls_async", [fp32("INPUT0", a), fp32("INPUT1", b)])
    np.testing.assert_array_equal(r.as_numpy("SUM"), a + b)
    np.testing.assert_array_equal(r.as_numpy("DIFF"), a - b)
    message = r.as_numpy("MISSING_ERROR")[0, 0].decode()
    assert "no_such_model" in message and "not found" in message


def test_autoregressive_loop_stops_at_the_end_token(http):
    def run(total):
        image = np.zeros((1, 8), np.float32)
        image[0, 0] = total
        r = http.infer("seal_loop", [fp32("IMAGE", image)])
        return list(r.as_numpy("TOKENS")), int(r.as_numpy("STEPS")[0])

    assert run(5) == ([2, 3, 4, 5], 5), "decoder runs until it emits the end token"
    assert run(1) == ([], 1)
    tokens, steps = run(40)
    assert steps == 12 and tokens == list(range(2, 14)), "MAX_STEPS bounds the loop"
    dec = http.get_inference_statistics("seal_decoder")["model_stats"][0]
    enc = http.get_inference_statistics("seal_encoder")["model_stats"][0]
    assert int(dec["inference_count"]) >= 18 and int(enc["inference_count"]) >= 3


def test_bytes_ids_and_parameters_reach_the_model(http):
    t = httpclient.InferInput("TEXT", [3], "BYTES")
    t.set_data_from_numpy(np.array([b"abc", b"d\x00e", "zé".encode()], dtype=np.object_))
    r = http.infer("strings_py", [t], request_id="req-7", parameters={"mode": "loud", "n": 3})
    assert list(r.as_numpy("UPPER")) == [b"ABC", b"D\x00E", "Zé".encode()]
    info = json.loads(r.as_numpy("INFO")[0])
    assert info["id"] == "req-7"
    assert info["parameters"] == {"mode": "loud", "n": 3}
    assert info["writeable"] is True, "inputs are writable, as in Triton"


def test_a_model_may_change_its_inputs_in_place_and_the_next_request_sees_its_own(http):
    """as_numpy() of an input is writable (Triton's is a copy): the model's `x -= 1` works, and what
    it wrote never reaches a later request, whose inputs land in the same pages of shared memory.
    Sizes from a few floats to several pages."""
    for i, n in enumerate([4, 4, 3000, 3000, 70000, 5, 70000]):
        x = np.arange(n, dtype=np.float32) + 10 * i
        t = httpclient.InferInput("IN", [n], "FP32")
        t.set_data_from_numpy(x)
        np.testing.assert_array_equal(http.infer("inplace_py", [t]).as_numpy("OUT"), x - 1)


def test_auto_complete_config_fills_the_config(http):
    cfg = http.get_model_config("auto_cfg")
    assert [i["name"] for i in cfg["input"]] == ["IN", "BIAS"]
    assert cfg["input"][1].get("optional") is True
    assert cfg["max_batch_size"] == 8 and "dynamic_batching" in cfg
    x = httpclient.InferInput("IN", [2, 3], "INT32")
    x.set_data_from_numpy(np.array([[1, 2, 3], [4, 5, 6]], np.int32))
    r = http.infer("auto_cfg", [x])
    np.testing.assert_array_equal(r.as_numpy("OUT"), np.array([[10, 20, 30], [40, 50, 60]], np.int32))


def test_initialize_exception_is_a_load_error_with_the_traceback(http):
    row = next(r for r in http.get_model_repository_index() if r["name"] == "init_fails")
    assert row["state"] == "UNAVAILABLE"
    reason = row["reason"]
    assert "cannot find the weights file" in reason and "Traceback" in reason and "helper" in reason
    assert http.is_model_ready("add_sub_py"), "the other models keep serving"


def test_bls_in_initialize_is_tritons_load_error(http):
    row = next(r for r in http.get_model_repository_index() if r["name"] == "bls_in_init")
    assert row["state"] == "UNAVAILABLE"
    assert "BLS is only supported during the 'execute' function." in row["reason"], row


def test_dlpack_round_trips(http):
    x = np.array([1.5, -2.0, 3.25], np.float32)
    r = http.infer("dlpack_py", [fp32("X", x)])
    np.testing.assert_array_equal(r.as_numpy("SAME"), x)
    np.testing.assert_array_equal(r.as_numpy("DOUBLED"), 2 * x)
    assert r.as_numpy("SHARED")[0], "to_dlpack of an input shares its memory, no copy"


def x_input(v):
    return [fp32("X", np.array([v], np.float32))]


def test_errors_fail_only_their_request(http):
    with pytest.raises(InferenceServerException) as e:
        http.infer("py_errors", x_input(-1.0))
    assert "negative input" in str(e.value) and e.value.status() == "400"
    with pytest.raises(InferenceServerException) as e:
        http.infer("py_errors", x_input(13.0))
    assert "thirteen is unlucky" in str(e.value)
    np.testing.assert_array_equal(http.infer("py_errors", x_input(2.0)).as_numpy("Y"), [4.0])


def grouped_requests(srv, model):
    found = re.search(r'mesh_instance_grouped_requests_total\{[^}]*model="' + model + r'"[^}]*\} (\S+)', srv.metrics())
    return float(found.group(1)) if found else 0.0


def each_py(srv, value):
    """One each_py request: (OUT, SEEN) or the error's message."""
    c = httpclient.InferenceServerClient(srv.http_url, network_timeout=60)
    try:
        t = httpclient.InferInput("IN", [1], "FP32")
        t.set_data_from_numpy(np.array([value], np.float32))
        r = c.infer("each_py", [t])
        return r.as_numpy("OUT").tolist(), r.as_numpy("SEEN").tolist()
    except InferenceServerException as e:
        return str(e)
    finally:
        c.close()


def test_requests_that_queue_travel_together_yet_each_gets_its_own_execute(py_server):
    """each_py (no dynamic batching, reads only requests[0], 20 ms per execute): 32 requests from 16
    clients queue behind one instance (held by a first request until 16 are queued) and travel to
    its stub in groups, but every execute() sees one request, each request gets its own answer from
    the shared memory, a failing request fails alone, and the statistics count one execution per
    request."""
    values = [-float(i) if i % 5 == 0 else float(i) for i in range(1, 33)]
    before = grouped_requests(py_server, "each_py")
    stats = httpclient.InferenceServerClient(py_server.http_url)
    start = stats.get_inference_statistics("each_py")["model_stats"][0]
    with ThreadPoolExecutor(17) as pool:
        holder = pool.submit(each_py, py_server, 1002.0)
        wait_pending(py_server, "each_py", 1)
        queued = [pool.submit(each_py, py_server, v) for v in values]
        wait_pending(py_server, "each_py", 17)
        (py_server.repo / "each_py" / "gate1002").touch()
        results = [f.result(timeout=60) for f in queued]
        assert holder.result(timeout=60) == ([2004.0], [1])
    for value, got in zip(values, results):
        if value < 0:
            assert f"negative input {value}" in got, got
        else:
            assert got == ([value * 2], [1]), (value, got)
    assert grouped_requests(py_server, "each_py") > before, "requests that queued went to the stub one by one"
    end = stats.get_inference_statistics("each_py")["model_stats"][0]
    served = int(end["inference_count"]) - int(start.get("inference_count", 0))
    assert served == 27, end  # the holder and 32 requests, 6 of them failing
    assert int(end["execution_count"]) - int(start.get("execution_count", 0)) == served
    stats.close()


def test_an_answer_does_not_wait_for_the_requests_that_travelled_with_it(py_server):
    """While a first request holds each_py's stub, two more queue and then travel to it together:
    the first of them is answered while the second is still running."""
    model_dir = py_server.repo / "each_py"
    before = grouped_requests(py_server, "each_py")
    with ThreadPoolExecutor(3) as pool:
        holder = pool.submit(each_py, py_server, 1000.0)
        wait_pending(py_server, "each_py", 1)
        early = pool.submit(each_py, py_server, 3.0)
        wait_pending(py_server, "each_py", 2)
        late = pool.submit(each_py, py_server, 1001.0)
        wait_pending(py_server, "each_py", 3)
        (model_dir / "gate1000").touch()
        try:
            assert holder.result(timeout=20) == ([2000.0], [1])
            assert early.result(timeout=20) == ([6.0], [1])
            assert not late.done(), "the late request runs until its gate opens"
        finally:
            (model_dir / "gate1001").touch()
        assert late.result(timeout=20) == ([2002.0], [1])
    assert grouped_requests(py_server, "each_py") - before == 2, "the two queued requests travelled together"


def wait_ready_and_serving(http, what):
    end = time.time() + 30
    while time.time() < end:
        try:
            return http.infer("py_errors", x_input(1.0)).as_numpy("Y")
        except InferenceServerException:
            time.sleep(0.2)
    pytest.fail(f"py_errors did not serve again after {what}")


def test_a_dying_stub_fails_its_request_and_is_restarted(http, py_server):
    with pytest.raises(InferenceServerException) as e:
        http.infer("py_errors", x_input(99.0))
    assert "exited" in str(e.value)
    np.testing.assert_array_equal(wait_ready_and_serving(http, "os._exit"), [2.0])
    assert "instance restarted" in py_server.log_tail(200)


def test_a_hung_execute_hits_the_stub_timeout(http, py_server):
    with pytest.raises(InferenceServerException) as e:
        http.infer("py_errors", x_input(77.0))
    assert "execute-timeout-seconds" in str(e.value)
    np.testing.assert_array_equal(wait_ready_and_serving(http, "a hang"), [2.0])


def children(pid):
    """(pid, state, cmdline) of each child process of `pid`, read from /proc."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                out.append((int(d.name), fields[0], (d / "cmdline").read_bytes()))
        except (OSError, IndexError, ValueError):
            pass
    return out


def test_unload_finalizes_and_leaves_no_process(fresh_server, models_dir, tmp_path):
    repo = python_repo(tmp_path, models_dir)
    srv = fresh_server([repo], python_args() + ["--model-control-mode", "explicit", "--load-model", "add_sub_py"],
                       wait_models=["add_sub_py"])
    c = httpclient.InferenceServerClient(srv.http_url)
    try:
        def stubs():
            return [p for p in children(srv.proc.pid) if b"mesh_stub.py" in p[2]]
        assert len(stubs()) == 1
        c.unload_model("add_sub_py")
        end = time.time() + 15
        while (stubs() or children(srv.proc.pid)) and time.time() < end:
            time.sleep(0.1)
        assert not stubs(), "the stub must be stopped on unload"
        assert not [p for p in children(srv.proc.pid) if p[1] == "Z"], "and reaped: no zombie"
        assert (repo / "add_sub_py" / "finalized.txt").read_text().strip() == "add_sub_py_0_0", "Triton 2.51 names it <group>_<index>"
    finally:
        c.close()


def test_execution_env_path_tarball_provides_the_interpreter(fresh_server, tmp_path):
    """EXECUTION_ENV_PATH naming a packed environment ($$TRITON_MODEL_DIRECTORY/env.tar.gz) is
    unpacked once and its bin/python3 runs the stub."""
    import tarfile
    model = tmp_path / "repo" / "env_probe"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(
        'name: "env_probe"\nbackend: "python"\n'
        'output [ { name: "MARK" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
        'parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }\n')
    (model / "1" / "model.py").write_text(
        "import os\nimport numpy as np\nimport triton_python_backend_utils as pb_utils\n\n\n"
        "class TritonPythonModel:\n"
        "    def execute(self, requests):\n"
        "        mark = os.environ.get('MESH_ENV_MARK', 'none').encode()\n"
        "        return [pb_utils.InferenceResponse([pb_utils.Tensor('MARK', np.array([mark], dtype=np.object_))])\n"
        "                for _ in requests]\n")
    env = tmp_path / "env"
    (env / "bin").mkdir(parents=True)
    python3 = env / "bin" / "python3"
    python3.write_text(f'#!/bin/sh\nMESH_ENV_MARK=packed exec "{sys.executable}" "$@"\n')
    python3.chmod(0o755)
    with tarfile.open(model / "env.tar.gz", "w:gz") as tar:
        tar.add(env / "bin", arcname="bin")
    srv = fresh_server([tmp_path / "repo"], ["--backend-config", "python,interpreter=/nonexistent/python3"],
                       wait_models=["env_probe"])
    c = httpclient.InferenceServerClient(srv.http_url)
    try:
        assert c.infer("env_probe", []).as_numpy("MARK")[0] == b"packed"
    finally:
        c.close()


def test_only_stubs_of_async_models_load_asyncio(http, py_server):
    """A stub imports asyncio (10 MB of its memory, with ssl and libcrypto) only when its model needs
    it (issue 26): async models' stubs map the `_ssl` module, plain models' stubs do not."""
    assert http.is_model_ready("async_py") and http.is_model_ready("add_sub_py")
    maps = []
    for pid, _, cmdline in children(py_server.proc.pid):
        if b"mesh_stub.py" in cmdline:
            try:
                maps.append(Path(f"/proc/{pid}/maps").read_text())
            except OSError:
                pass
    with_ssl = sum("_ssl" in m for m in maps)
    assert with_ssl >= 1, "an async model's stub loads asyncio"
    assert len(maps) - with_ssl >= 1, "a plain model's stub must not import asyncio"
