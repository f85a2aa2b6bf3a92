"""The rate limiter through tritonclient, as Triton's model configuration documents it: with
`--rate-limit execution_count`, instances whose `rate_limiter` needs more copies of a resource than
are free wait for them, and instances that wait together take turns by priority; flags that leave
too few copies, or a resource that is both global and per device, fail the load with Triton's words.

Each model reports when its `execute` started and ended, so the assertions are on which executions
overlapped and how many each model got, never on durations.
"""
import sys
import threading

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

pytestmark = [pytest.mark.server]

PYTHON = ["--backend-config", f"python,interpreter={sys.executable}"]

SPAN_MODEL = '''
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            start = time.time()
            time.sleep(int(pb_utils.get_input_tensor_by_name(r, "MS").as_numpy()[0]) / 1000)
            span = np.array([start, time.time()], np.float64)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("SPAN", span)]))
        return out
'''


def write_model(repo, name: str, rate_limiter: str):
    d = repo / name
    (d / "1").mkdir(parents=True)
    (d / "1" / "model.py").write_text(SPAN_MODEL)
    (d / "config.pbtxt").write_text(f'''
name: "{name}"
backend: "python"
input [ {{ name: "MS" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "SPAN" data_type: TYPE_FP64 dims: [ 2 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU rate_limiter {{ {rate_limiter} }} }} ]
''')


@pytest.fixture
def two_models(tmp_path):
    """`first` at priority 1 and `second` at priority 2, each needing one copy of R."""
    repo = tmp_path / "repo"
    write_model(repo, "first", 'resources [ { name: "R" count: 1 } ] priority: 1')
    write_model(repo, "second", 'resources [ { name: "R" count: 1 } ] priority: 2')
    return repo


def call(srv, model: str, ms: int):
    c = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        x = grpcclient.InferInput("MS", [1], "INT32")
        x.set_data_from_numpy(np.array([ms], np.int32))
        return tuple(c.infer(model, [x]).as_numpy("SPAN"))
    finally:
        c.close()


def two_clients_per_model(client, errors):
    """Runs `client(model)` on two threads per model until they return; none may have failed."""
    threads = [threading.Thread(target=client, args=(m,)) for m in ("first", "first", "second", "second")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors


def spans_of_concurrent_calls(srv, ms: int, per_model: int = 3):
    """Two clients per model, each sending `per_model` requests at once; returns every span."""
    spans, errors = [], []
    start = threading.Barrier(4)

    def client(model):
        try:
            start.wait()
            for _ in range(per_model):
                spans.append(call(srv, model, ms))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    two_clients_per_model(client, errors)
    return sorted(spans)


def overlaps(spans):
    return [(a, b) for a, b in zip(spans, spans[1:]) if b[0] < a[1]]


def test_one_copy_runs_one_execution_at_a_time_across_models(fresh_server, two_models):
    srv = fresh_server([two_models], PYTHON + ["--rate-limit", "execution_count", "--rate-limit-resource", "R:1"])
    spans = spans_of_concurrent_calls(srv, ms=40)
    assert len(spans) == 12
    assert overlaps(spans) == [], "executions that need the only copy of R ran at the same time"


def test_without_the_flag_the_rate_limiter_config_is_ignored(fresh_server, two_models):
    srv = fresh_server([two_models], PYTHON)
    spans = spans_of_concurrent_calls(srv, ms=300, per_model=1)
    assert overlaps(spans), "with --rate-limit off both models run at once, as in Triton"


def test_enough_copies_let_both_models_run_at_once(fresh_server, two_models):
    srv = fresh_server([two_models], PYTHON + ["--rate-limit=execution_count", "--rate-limit-resource=R:2"])
    spans = spans_of_concurrent_calls(srv, ms=300, per_model=1)
    assert overlaps(spans)


def test_priority_two_gets_about_half_the_turns_of_priority_one(fresh_server, two_models):
    srv = fresh_server([two_models], PYTHON + ["--rate-limit", "execution_count"])
    counts = {"first": 0, "second": 0}
    lock, stop, errors = threading.Lock(), threading.Event(), []

    def client(model):
        try:
            while not stop.is_set():
                call(srv, model, 5)
                with lock:
                    counts[model] += 1
                    if counts["first"] + counts["second"] >= 120:
                        stop.set()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
            stop.set()

    # Two clients per model keep a request waiting behind each execution, as Triton's test does.
    two_clients_per_model(client, errors)
    ratio = counts["first"] / max(counts["second"], 1)
    assert 1.6 < ratio < 2.6, f"turns {counts}: priority 1 should get about twice those of priority 2"


def reason(srv, model):
    entries = [e for e in srv.index() if e.get("name") == model]
    assert entries and entries[0].get("state") == "UNAVAILABLE", entries
    return entries[0].get("reason", "")


def test_too_few_copies_fail_the_load_with_tritons_message(fresh_server, tmp_path):
    repo = tmp_path / "repo"
    write_model(repo, "hungry", 'resources [ { name: "resource1" count: 4 } ]')
    write_model(repo, "modest", 'resources [ { name: "resource2" count: 1 } ]')
    srv = fresh_server(
        [repo],
        PYTHON + ["--rate-limit", "execution_count", "--rate-limit-resource", "resource1:1",
         "--rate-limit-resource", "resource2:1", "--exit-on-error", "false", "--strict-readiness", "false"],
        wait_models=["modest"],
    )
    assert reason(srv, "hungry") == (
        'Resource count for "resource1" is limited to 1 which will prevent scheduling of one or more '
        "model instances, the minimum required count is 4")
    assert call(srv, "modest", 1)[1] > 0, "the other model serves"


def test_a_resource_both_global_and_per_device_fails_the_load(fresh_server, tmp_path):
    repo = tmp_path / "repo"
    write_model(repo, "a_global", 'resources [ { name: "resource2" global: true count: 2 } ]')
    srv = fresh_server([repo], PYTHON + ["--rate-limit", "execution_count", "--exit-on-error", "false",
                                "--strict-readiness", "false", "--model-control-mode", "explicit",
                                "--load-model", "a_global"], wait_models=["a_global"])
    write_model(repo, "b_device", 'resources [ { name: "resource2" global: false count: 2 } ]')
    c = grpcclient.InferenceServerClient(srv.grpc_url)
    with pytest.raises(Exception) as e:
        c.load_model("b_device")
    assert ('Resource "resource2" is present as both global and device-specific resource in the '
            "model configuration.") in str(e.value)
    assert call(srv, "a_global", 1)[1] > 0
