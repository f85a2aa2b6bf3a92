"""The rate limiter through tritonclient, as Triton's model configuration documents it: with
`--rate-limit execution_count`, instances whose `rate_limiter` needs more copies of a resource than
are free wait for them, and instances that wait together take turns by priority; flags that leave
too few copies, or a resource that is both global and per device, fail the load with Triton's words.

Each model reports when its `execute` started and ended, or meets the other model's execution at a
barrier, or records the order of its turns while a gate holds the queues full, so the assertions are
on which executions overlapped and in which order they ran, never on durations.
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


# Each execution leaves a marker in DIR, then waits (up to 30 s) until two executions have started:
# SPAN answers [1, markers] when both were in `execute` at once, [0, markers] when the wait ran out
# (which is how an implementation that runs them one after another fails, whatever the timing).
BARRIER_MODEL = '''
import os
import time
import uuid

import numpy as np
import triton_python_backend_utils as pb_utils

DIR = @DIR@


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            open(os.path.join(DIR, "started-" + uuid.uuid4().hex), "w").close()
            deadline = time.monotonic() + 30
            while True:
                seen = len([n for n in os.listdir(DIR) if n.startswith("started-")])
                if seen >= 2 or time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            span = np.array([1.0 if seen >= 2 else 0.0, seen], np.float64)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("SPAN", span)]))
        return out
'''

# Each execution appends its model's name to DIR/turns (the rate limiter lets one run at a time, so
# the file is the order of turns), then waits (up to 60 s) for DIR/gate: the first execution holds
# the only copy of R until the test has every other request queued.
GATED_MODEL = '''
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

DIR = @DIR@


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]

    def execute(self, requests):
        out = []
        for r in requests:
            with open(os.path.join(DIR, "turns"), "a") as f:
                f.write(self.name + "\\n")
            deadline = time.monotonic() + 60
            while not os.path.exists(os.path.join(DIR, "gate")) and time.monotonic() < deadline:
                time.sleep(0.01)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("SPAN", np.zeros(2, np.float64))]))
        return out
'''


def write_model(repo, name: str, rate_limiter: str, code: str = SPAN_MODEL, shared=None):
    """`code` is the model's source; `shared` the directory its @DIR@ names (markers, turns, gate)."""
    d = repo / name
    (d / "1").mkdir(parents=True)
    (d / "1" / "model.py").write_text(code.replace("@DIR@", repr(str(shared))))
    (d / "config.pbtxt").write_text(f'''
name: "{name}"
backend: "python"
input [ {{ name: "MS" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "SPAN" data_type: TYPE_FP64 dims: [ 2 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU rate_limiter {{ {rate_limiter} }} }} ]
''')


def two_models_with(tmp_path, code=SPAN_MODEL):
    """`first` at priority 1 and `second` at priority 2, each needing one copy of R; their code
    shares tmp_path/shared."""
    repo, shared = tmp_path / "repo", tmp_path / "shared"
    shared.mkdir()
    write_model(repo, "first", 'resources [ { name: "R" count: 1 } ] priority: 1', code, shared)
    write_model(repo, "second", 'resources [ { name: "R" count: 1 } ] priority: 2', code, shared)
    return repo


@pytest.fixture
def two_models(tmp_path):
    return two_models_with(tmp_path)


@pytest.fixture
def two_barrier_models(tmp_path):
    return two_models_with(tmp_path, BARRIER_MODEL)


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


def one_call_per_model_at_once(srv):
    """One request to each model, sent at the same time; returns what each execution saw at the barrier."""
    results, errors = {}, []

    def client(model):
        try:
            results[model] = call(srv, model, 0)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=client, args=(m,)) for m in ("first", "second")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return results


def test_without_the_flag_the_rate_limiter_config_is_ignored(fresh_server, two_barrier_models):
    srv = fresh_server([two_barrier_models], PYTHON)
    met = one_call_per_model_at_once(srv)
    assert all(m[0] == 1.0 for m in met.values()), \
        f"with --rate-limit off both models run at once, as in Triton: {met}"


def test_enough_copies_let_both_models_run_at_once(fresh_server, two_barrier_models):
    srv = fresh_server([two_barrier_models], PYTHON + ["--rate-limit=execution_count", "--rate-limit-resource=R:2"])
    met = one_call_per_model_at_once(srv)
    assert all(m[0] == 1.0 for m in met.values()), f"two copies of R let both run at once: {met}"


def test_priority_two_gets_half_the_turns_of_priority_one(fresh_server, tmp_path):
    """One copy of R (the most either model needs). `first`'s first request holds it at a gate until
    9 requests of `first` and 5 of `second` are in the server, so each instance has its next request
    in hand whenever a turn ends and the order of turns is the rate limiter's alone: after the two
    models' first turns, `first` (priority 1) takes two turns for each of `second`'s (priority 2),
    and once `second` has no more requests `first` runs the rest. (The weighted order over many turns
    is the unit test in rate_limit/tests.rs.)"""
    from mesh_util import wait_pending
    from cluster_util import wait_until

    repo = two_models_with(tmp_path, GATED_MODEL)
    shared = tmp_path / "shared"
    srv = fresh_server([repo], PYTHON + ["--rate-limit", "execution_count"])
    turns = lambda: (shared / "turns").read_text().split() if (shared / "turns").exists() else []  # noqa: E731
    errors, threads = [], []

    def send(model):
        def client():
            try:
                call(srv, model, 0)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
        t = threading.Thread(target=client)
        t.start()
        threads.append(t)

    try:
        send("first")
        wait_until(lambda: turns() == ["first"], 60, lambda: f"first's gated execution to start: {turns()}")
        for _ in range(8):
            send("first")
        for _ in range(5):
            send("second")
        wait_pending(srv, "first", 9)
        wait_pending(srv, "second", 5)
        assert turns() == ["first"], "nothing else ran while the gated execution held R"
    finally:
        (shared / "gate").touch()
        for t in threads:
            t.join(120)
    assert not errors, errors
    order = "".join("A" if t == "first" else "B" for t in turns())
    # A B (each model's first turn), A B, then A A B while both have requests, then the last A.
    assert order == "ABAB" + "AAB" * 3 + "A", f"turns (A: priority 1, B: priority 2): {order}"


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
