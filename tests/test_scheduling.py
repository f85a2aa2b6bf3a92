"""Scheduling through tritonclient: dynamic batching, queue limits and timeouts, priorities, instance groups.

Each test writes its own config.pbtxt around a generated ONNX model and starts a private server,
so statistics and metrics count only what the test sent. A test that needs requests queued waits
until the server counts them in flight (mesh_util.wait_pending) instead of sleeping; queue delays
are seconds long, so what the test does meanwhile fits in them on a loaded machine. The assertions
are on behaviour (which batch, which error, which order), never on durations.
"""
import re
import shutil
import sys
import threading

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from mesh_util import wait_pending
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.server]

# How long a batcher holds a request that a test keeps queued while it probes the server (µs): long
# enough for any probe on a loaded machine, short enough that the suite does not wait long for it.
HOLD_US = 6_000_000

ADD_SUB_IO = """
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
"""
IDENTITY_IO = """
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


def make_repo(tmp_path, models_dir, source: str, name: str, body: str):
    """A repository with one model `name`: the ONNX file of `source` (simple/ or dtypes/) and `body` as config."""
    repo = tmp_path / f"repo_{name}"
    (repo / name / "1").mkdir(parents=True)
    src = next(p for p in (models_dir / "simple" / source, models_dir / "dtypes" / source) if p.exists())
    shutil.copy(src / "1" / "model.onnx", repo / name / "1" / "model.onnx")
    (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "onnxruntime"\n{body}\n')
    return repo


def add_sub_inputs(value: float, rows: int = 1, client=httpclient):
    """INPUT0 = value, INPUT1 = 1, for tritonclient.http (default) or tritonclient.grpc."""
    a = np.full((rows, 16), value, np.float32)
    b = np.ones((rows, 16), np.float32)
    ins = [client.InferInput("INPUT0", [rows, 16], "FP32"), client.InferInput("INPUT1", [rows, 16], "FP32")]
    ins[0].set_data_from_numpy(a)
    ins[1].set_data_from_numpy(b)
    return ins


def add_sub_json_body() -> bytes:
    """A one-row add_sub request in plain JSON, for raw HTTP clients."""
    ones = ",".join(["1"] * 16)
    return ('{"inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"FP32","data":[%s]},'
            '{"name":"INPUT1","shape":[1,16],"datatype":"FP32","data":[%s]}]}' % (ones, ones)).encode()


def run_threads(fns):
    results = [None] * len(fns)

    def wrap(i, f):
        try:
            results[i] = ("ok", f())
        except Exception as e:  # noqa: BLE001 - the test inspects it
            results[i] = ("err", e)

    threads = [threading.Thread(target=wrap, args=(i, f)) for i, f in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


def concurrent_add_sub(srv, model, n):
    """n concurrent one-row add_sub requests (INPUT0 = i), each answer checked; the model's statistics."""
    def one(i):
        c = httpclient.InferenceServerClient(srv.http_url)
        try:
            return c.infer(model, add_sub_inputs(float(i))).as_numpy("OUTPUT0")
        finally:
            c.close()

    results = run_threads([lambda i=i: one(i) for i in range(n)])
    for i, (kind, value) in enumerate(results):
        assert kind == "ok", value
        np.testing.assert_array_equal(value, np.full((1, 16), i + 1.0, np.float32))
    c = httpclient.InferenceServerClient(srv.http_url)
    try:
        return c.get_inference_statistics(model)["model_stats"][0]
    finally:
        c.close()


def test_dynamic_batching_merges_concurrent_requests_and_splits_outputs(fresh_server, models_dir, tmp_path):
    # A batch runs as soon as four requests are queued (or after HOLD_US): 12 concurrent requests
    # are batched however the threads are scheduled.
    repo = make_repo(tmp_path, models_dir, "add_sub", "batched",
                     "max_batch_size: 8\n" + ADD_SUB_IO +
                     f"dynamic_batching {{ preferred_batch_size: [ 4 ] max_queue_delay_microseconds: {HOLD_US} }}")
    srv = fresh_server([repo])
    st = concurrent_add_sub(srv, "batched", 12)
    assert st["inference_count"] == 12
    assert st["execution_count"] < 12, st
    assert max(b["batch_size"] for b in st["batch_stats"]) > 1, st["batch_stats"]
    assert sum(b["batch_size"] * b["compute_infer"]["count"] for b in st["batch_stats"]) == 12


def test_tritons_delay_scheduler_hook_holds_batches_until_its_count(fresh_server, models_dir, tmp_path):
    """TRITONSERVER_DELAY_SCHEDULER=6 (the test hook Triton's L0_batcher sets): no batch forms until
    six requests are queued, so six concurrent requests run as one batch of the preferred 6, never
    as the preferred 2 that the first two would make without it."""
    repo = make_repo(tmp_path, models_dir, "add_sub", "held",
                     "max_batch_size: 8\n" + ADD_SUB_IO +
                     f"dynamic_batching {{ preferred_batch_size: [ 2, 6 ] max_queue_delay_microseconds: {HOLD_US} }}")
    fresh_server.env = dict(fresh_server.env, TRITONSERVER_DELAY_SCHEDULER="6")
    srv = fresh_server([repo])
    st = concurrent_add_sub(srv, "held", 6)
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in st["batch_stats"]] == [(6, 1)], st["batch_stats"]
    assert "TRITONSERVER_DELAY_SCHEDULER is set" in srv.log_path.read_text()


def assert_refused_over_http_and_grpc(srv, model, reason):
    """One add_sub request over each protocol is refused at once: 503 naming `reason`, and UNAVAILABLE."""
    r = srv.post(f"/v2/models/{model}/infer", add_sub_json_body())
    assert r.status == 503, r
    assert reason in r.error_message()
    g = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as e:
            g.infer(model, add_sub_inputs(1.0, client=grpcclient))
        assert "UNAVAILABLE" in str(e.value.status())
    finally:
        g.close()


def test_max_queue_size_rejects_at_once_with_unavailable(fresh_server, models_dir, tmp_path):
    repo = make_repo(tmp_path, models_dir, "add_sub", "bounded",
                     "max_batch_size: 8\n" + ADD_SUB_IO +
                     f"dynamic_batching {{ max_queue_delay_microseconds: {HOLD_US} "
                     "default_queue_policy { max_queue_size: 1 } }")
    srv = fresh_server([repo])
    first = {}

    def hold():
        c = httpclient.InferenceServerClient(srv.http_url)
        try:
            first["out"] = c.infer("bounded", add_sub_inputs(1.0)).as_numpy("OUTPUT0")
        finally:
            c.close()

    t = threading.Thread(target=hold)
    t.start()
    wait_pending(srv, "bounded", 1)  # the first request now waits in the queue for its delay
    assert_refused_over_http_and_grpc(srv, "bounded", "queue full")
    t.join(timeout=60)
    np.testing.assert_array_equal(first["out"], np.full((1, 16), 2.0, np.float32))


def test_queue_timeouts_reject_and_per_request_override(fresh_server, models_dir, tmp_path):
    repo = make_repo(tmp_path, models_dir, "add_sub", "timed",
                     "max_batch_size: 8\n" + ADD_SUB_IO +
                     "dynamic_batching { max_queue_delay_microseconds: 5000000 "
                     "default_queue_policy { default_timeout_microseconds: 150000 allow_timeout_override: true } }")
    srv = fresh_server([repo])
    c = httpclient.InferenceServerClient(srv.http_url)
    try:
        with pytest.raises(InferenceServerException) as e:
            c.infer("timed", add_sub_inputs(1.0))
        assert "timed out" in str(e.value)
        # a request may ask for its own (here also short) timeout, which this policy honours
        with pytest.raises(InferenceServerException) as e:
            c.infer("timed", add_sub_inputs(1.0), timeout=50_000)
        assert "timed out" in str(e.value)
        st = c.get_inference_statistics("timed")["model_stats"][0]
        assert st["inference_stats"]["fail"]["count"] == 2
        assert st["execution_count"] == 0
    finally:
        c.close()


def test_priorities_reorder_the_queue(fresh_server, models_dir, tmp_path):
    # max_batch_size 3: low-a (1 row) and low-b (1 row) wait for the delay; high (2 rows, priority 1)
    # then forms a full batch with low-a, ahead of low-b. Without priorities low-a and low-b would
    # have run first and high after them. Each is sent once the one before is queued.
    repo = make_repo(tmp_path, models_dir, "identity_fp32", "prio",
                     "max_batch_size: 3\n" + IDENTITY_IO +
                     f"dynamic_batching {{ max_queue_delay_microseconds: {HOLD_US} priority_levels: 2 "
                     "default_priority_level: 2 }")
    srv = fresh_server([repo])
    done = []
    lock = threading.Lock()
    results = {}

    def send(tag, rows, priority):
        c = httpclient.InferenceServerClient(srv.http_url)
        try:
            x = np.full((rows, 4), float(rows), np.float32)
            i = httpclient.InferInput("INPUT0", [rows, 4], "FP32")
            i.set_data_from_numpy(x)
            out = c.infer("prio", [i], priority=priority).as_numpy("OUTPUT0")
            np.testing.assert_array_equal(out, x)
            with lock:
                done.append(tag)
            results[tag] = "ok"
        except Exception as e:  # noqa: BLE001 - the test inspects it
            results[tag] = e
        finally:
            c.close()

    threads = []
    for queued, (tag, rows, priority) in enumerate([("low-a", 1, 2), ("low-b", 1, 2), ("high", 2, 1)]):
        wait_pending(srv, "prio", queued)
        threads.append(threading.Thread(target=send, args=(tag, rows, priority)))
        threads[-1].start()
    for t in threads:
        t.join(timeout=60)
    assert all(v == "ok" for v in results.values()) and len(results) == 3, results
    assert done.index("high") < done.index("low-b"), done
    c = httpclient.InferenceServerClient(srv.http_url)
    sizes = {b["batch_size"] for b in c.get_inference_statistics("prio")["model_stats"][0]["batch_stats"]}
    c.close()
    assert sizes == {3, 1}, sizes


def test_two_instances_share_the_load(fresh_server, models_dir, tmp_path):
    repo = make_repo(tmp_path, models_dir, "add_sub", "pair",
                     "max_batch_size: 8\n" + ADD_SUB_IO + "instance_group [ { count: 2 kind: KIND_CPU } ]")
    srv = fresh_server([repo])

    def burst():
        c = httpclient.InferenceServerClient(srv.http_url)
        try:
            for k in range(10):
                out = c.infer("pair", add_sub_inputs(float(k))).as_numpy("OUTPUT0")
                np.testing.assert_array_equal(out, np.full((1, 16), k + 1.0, np.float32))
        finally:
            c.close()

    assert all(k == "ok" for k, _ in run_threads([burst] * 4))
    per_instance = {m.group(1): float(m.group(2)) for m in re.finditer(
        r'mesh_instance_executions_total\{[^}]*instance="([^"]+)"[^}]*\} (\S+)', srv.metrics())
        if 'model="pair"' in m.group(0)}
    assert len(per_instance) == 2, per_instance
    assert all(v > 0 for v in per_instance.values()), per_instance
    assert sum(per_instance.values()) == 40


def test_kind_gpu_without_gpus_is_a_clear_load_error(fresh_server, models_dir, tmp_path):
    repo = make_repo(tmp_path, models_dir, "add_sub", "gpu_only",
                     "max_batch_size: 8\n" + ADD_SUB_IO + "instance_group [ { kind: KIND_GPU } ]")
    shutil.copytree(models_dir / "simple" / "add_sub", repo / "add_sub")
    srv = fresh_server([repo], wait_models=["add_sub"])
    rows = srv.settle(["gpu_only"])
    row = next(r for r in rows if r["name"] == "gpu_only")
    assert row["state"] == "UNAVAILABLE"
    assert "KIND_GPU" in row["reason"] and "no GPUs" in row["reason"], row


def test_gpus_flag_naming_a_missing_gpu_stops_start_up(fresh_server, models_dir, tmp_path):
    from mesh_util import ServerStartError
    with pytest.raises(ServerStartError) as e:
        fresh_server([models_dir / "simple"], ["--gpus", "0"], wait_models=["add_sub"])
    assert "exited with" in str(e.value)


def test_model_warmup_runs_before_ready_and_bad_samples_fail_the_load(fresh_server, models_dir, tmp_path):
    warm = ('model_warmup [ { name: "zeros" batch_size: 2 count: 3 '
            'inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } } '
            'inputs { key: "INPUT1" value: { data_type: TYPE_FP32 dims: [ 16 ] random_data: true } } }, '
            '{ name: "from_file" batch_size: 1 '
            'inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] input_data_file: "ones.bin" } } '
            'inputs { key: "INPUT1" value: { data_type: TYPE_FP32 dims: [ 16 ] input_data_file: "ones.bin" } } } ]')
    repo = make_repo(tmp_path, models_dir, "add_sub", "warm", "max_batch_size: 8\n" + ADD_SUB_IO + warm)
    (repo / "warm" / "warmup").mkdir()
    (repo / "warm" / "warmup" / "ones.bin").write_bytes(np.ones(16, np.float32).tobytes())
    bad = make_repo(tmp_path, models_dir, "add_sub", "cold", "max_batch_size: 8\n" + ADD_SUB_IO +
                    warm.replace("ones.bin", "missing.bin"))
    shutil.move(str(bad / "cold"), str(repo / "cold"))
    srv = fresh_server([repo], wait_models=["warm"])
    executions = [float(m.group(1)) for m in re.finditer(
        r'mesh_instance_executions_total\{[^}]*model="warm"[^}]*\} (\S+)', srv.metrics())]
    assert executions == [4.0], executions  # 3 x "zeros" + 1 x "from_file", before any client request
    c = httpclient.InferenceServerClient(srv.http_url)
    try:
        assert c.get_inference_statistics("warm")["model_stats"][0]["inference_count"] == 0
        out = c.infer("warm", add_sub_inputs(2.0)).as_numpy("OUTPUT0")
        np.testing.assert_array_equal(out, np.full((1, 16), 3.0, np.float32))
    finally:
        c.close()
    row = next(r for r in srv.settle(["cold"]) if r["name"] == "cold")
    assert row["state"] == "UNAVAILABLE" and "warmup 'from_file'" in row["reason"] and "missing.bin" in row["reason"]


def test_client_disconnect_removes_its_request_from_the_queue(fresh_server, models_dir, tmp_path):
    import socket
    repo = make_repo(tmp_path, models_dir, "add_sub", "cancel",
                     "max_batch_size: 8\n" + ADD_SUB_IO +
                     f"dynamic_batching {{ max_queue_delay_microseconds: {HOLD_US} "
                     "default_queue_policy { max_queue_size: 1 } }")
    srv = fresh_server([repo])
    body = add_sub_json_body()
    head = (f"POST /v2/models/cancel/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    s = socket.create_connection(("127.0.0.1", srv.http_port))
    s.sendall(head + body)
    wait_pending(srv, "cancel", 1)  # the request now sits in the (size 1) queue
    s.close()                       # ...and its client goes away
    wait_pending(srv, "cancel", 0)
    r = srv.post("/v2/models/cancel/infer", body)  # would be "queue full" had the first stayed queued
    assert r.status == 200, r
    metrics = srv.metrics()
    canceled = re.search(r'nv_inference_request_failure\{[^}]*model="cancel"[^}]*reason="CANCELED"[^}]*\} (\S+)', metrics)
    assert canceled and float(canceled.group(1)) == 1.0, metrics
    pending = re.search(r'nv_inference_pending_request_count\{[^}]*model="cancel"[^}]*\} (\S+)', metrics)
    assert pending and float(pending.group(1)) == 0.0, metrics
    c = httpclient.InferenceServerClient(srv.http_url)
    st = c.get_inference_statistics("cancel")["model_stats"][0]
    c.close()
    assert st["execution_count"] == 1 and st["inference_stats"]["fail"]["count"] == 1


def test_inflight_byte_budget_refuses_at_once_and_frees_on_answer(fresh_server, models_dir, tmp_path):
    """Under overload memory stays bounded: past --max-inflight-bytes a request is refused with
    UNAVAILABLE at once, while the admitted ones are served and then free their bytes."""
    repo = make_repo(tmp_path, models_dir, "add_sub", "held",
                     "max_batch_size: 64\n" + ADD_SUB_IO + f"dynamic_batching {{ max_queue_delay_microseconds: {HOLD_US} }}")
    # First come, first served (no reserve for fair shares: tests/test_fair_shares.py has those).
    srv = fresh_server([repo], ["--max-inflight-bytes", "150000", "--inflight-reserve-bytes", "0"])
    outs, errors = [], []

    def hold():  # 2 inputs x 16 FP32 = 128 bytes each, and 20480 for the request: seven fit in 150000
        c = httpclient.InferenceServerClient(srv.http_url)
        try:
            outs.append(c.infer("held", add_sub_inputs(1.0)).as_numpy("OUTPUT0"))
        except Exception as e:  # noqa: BLE001 - collected for the assertion
            errors.append(e)
        finally:
            c.close()

    holders = [threading.Thread(target=hold) for _ in range(7)]
    for t in holders:
        t.start()
    wait_pending(srv, "held", 7)  # the seven now wait in the queue for their delay
    assert_refused_over_http_and_grpc(srv, "held", "--max-inflight-bytes 150000")
    for t in holders:
        t.join(timeout=60)
    assert not errors and len(outs) == 7, errors[:3]
    for out in outs:
        np.testing.assert_array_equal(out, np.full((1, 16), 2.0, np.float32))
    # the answered requests gave their bytes back
    c = httpclient.InferenceServerClient(srv.http_url)
    try:
        np.testing.assert_array_equal(c.infer("held", add_sub_inputs(2.0)).as_numpy("OUTPUT0"),
                                      np.full((1, 16), 3.0, np.float32))
    finally:
        c.close()
    small = fresh_server([repo], ["--max-inflight-bytes", "5000"])
    c = httpclient.InferenceServerClient(small.http_url)
    try:
        with pytest.raises(InferenceServerException) as e:
            c.infer("held", add_sub_inputs(1.0, rows=8))  # 1024 + 20480 bytes: never fits
        assert "larger than the in-flight budget" in str(e.value)
    finally:
        c.close()
    failures = re.findall(r'nv_inference_request_failure\{[^}]*model="held"[^}]*reason="REJECTED"[^}]*\} (\S+)',
                          srv.metrics())
    assert [float(v) for v in failures] == [2.0], failures


BLOCKS_UNTIL_MARKER = """import os, time
import numpy as np
import triton_python_backend_utils as pb_utils
class TritonPythonModel:
    def execute(self, requests):
        end = time.monotonic() + 60
        while not os.path.exists({marker!r}) and time.monotonic() < end:
            time.sleep(0.02)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", np.ones(1, np.float32))]) for _ in requests]
"""


def test_requests_without_tensors_are_bounded_by_the_budget_too(fresh_server, tmp_path):
    """A flood of requests that carry no tensors (a model with no inputs) costs bounded memory: each
    is charged 20480 bytes of the in-flight budget, so with 150000 seven wait for the model (blocked
    until a marker appears) and the rest are refused at once as overload (503 / UNAVAILABLE),
    never queued in the instance's mailbox without end; the seven are then served."""
    marker = tmp_path / "go"
    repo = tmp_path / "repo"
    (repo / "blocked" / "1").mkdir(parents=True)
    (repo / "blocked" / "1" / "model.py").write_text(BLOCKS_UNTIL_MARKER.format(marker=str(marker)))
    (repo / "blocked" / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 0\noutput [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n')
    srv = fresh_server([repo], ["--max-inflight-bytes", "150000", "--inflight-reserve-bytes", "0", "--backend-config",
                                f"python,interpreter={sys.executable}"], wait_models=["blocked"])
    c = httpclient.InferenceServerClient(srv.http_url, concurrency=12)
    try:
        pending = [c.async_infer("blocked", []) for _ in range(7)]
        wait_pending(srv, "blocked", 7)  # one runs, six wait in the queue: seven in flight
        refused = []
        for _ in range(5):
            r = srv.post("/v2/models/blocked/infer", b'{"inputs": []}')
            refused.append((r.status, "server overloaded" in r.error_message()))
        assert refused == [(503, True)] * 5, refused
        marker.write_text("go")
        assert [p.get_result().as_numpy("y").tolist() for p in pending] == [[1.0]] * 7
    finally:
        marker.write_text("go")
        c.close()
