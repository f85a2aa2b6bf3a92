"""A wait for a Python stub's answer polls first (`spin-microseconds`) only while polls keep catching
the answer: on a node whose model takes longer than the poll, the waits soon sleep at once instead
of burning the poll's CPU every time. Both ends hold to it: mesh-node's executor thread waiting for
an execute, and the stub waiting for the answer to a BLS call.

The model here sleeps 5 ms per execute against polls of 3 ms, so polls miss. The tests read how the
waits went (the node's `mesh_python_stub_waits_total`, the stub's own policy counts) and check what
the policy guarantees whatever the scheduling: over any run, at most 4 + 2 * caught + waits // 32
polls miss (spin.rs proves the bound over every mix of outcomes). A wait that always polled would
miss on every one of its waits. How much CPU the waits save is measured in benches/scheduling.py."""
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from mesh_util import metric_sum, parse_metrics

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "crates" / "node" / "python"))
from mesh_stub_calls import SpinPolicy  # noqa: E402  (the stub's own copy of the policy)

CALLS = 100
POLL_US = 3000

SLEEPY_PY = '''
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.005)
        return [pb_utils.InferenceResponse([pb_utils.get_input_tensor_by_name(r, "X")]) for r in requests]
'''
# Also answers how its stub's waits for BLS answers went (the stub's policy, read in the stub
# process: a test's look inside, not an API).
CALLER_PY = '''
import sys

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X")
            for _ in range(int(x.as_numpy().flat[0])):
                answer = pb_utils.InferenceRequest(model_name="sleepy", requested_output_names=["X"],
                                                   inputs=[x]).exec()
                if answer.has_error():
                    raise RuntimeError(answer.error().message())
            spin = sys.modules["mesh_stub_host"].spin
            waits = np.array([spin.waits, spin.caught, spin.missed], np.int64)
            out.append(pb_utils.InferenceResponse([x, pb_utils.Tensor("WAITS", waits)]))
        return out
'''
CONFIG = '''name: "{name}"
backend: "python"
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
{extra}
instance_group [ {{ kind: KIND_CPU }} ]
'''
WAITS_OUTPUT = 'output [ { name: "WAITS" data_type: TYPE_INT64 dims: [ 3 ] } ]'


def write_repo(repo: Path) -> Path:
    """The sleepy model and its BLS caller, in `repo` (benches/scheduling.py serves it too)."""
    for name, code in (("sleepy", SLEEPY_PY), ("caller", CALLER_PY)):
        (repo / name / "1").mkdir(parents=True)
        extra = WAITS_OUTPUT if name == "caller" else ""
        (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, extra=extra))
        (repo / name / "1" / "model.py").write_text(code)
    return repo


@pytest.fixture
def spin_server(fresh_server, tmp_path):
    repo = write_repo(tmp_path / "repo")
    return fresh_server([repo], ["--backend-config", f"python,interpreter={sys.executable}",
                                 "--backend-config", f"python,spin-microseconds={POLL_US}"],
                        wait_models=["sleepy", "caller"])


def infer(client, model: str, value: float):
    x = httpclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.array([value], np.float32))
    result = client.infer(model, [x])
    np.testing.assert_array_equal(result.as_numpy("X"), [value])
    return result


def assert_polls_stop(waits: int, caught: int, missed: int, whose: str) -> None:
    """The policy's guarantee, and that the waits were counted at all."""
    assert waits >= CALLS, f"{whose}: only {waits} waits counted for {CALLS} calls"
    most = 4 + 2 * caught + waits // SpinPolicy.PROBE_EVERY
    assert missed <= most, f"{whose}: {missed} polls missed over {waits} waits ({caught} caught), more than {most}"


@pytest.mark.server
def test_the_executor_thread_stops_polling_for_a_slow_model(spin_server):
    """Requests one after the other to the sleepy model wait on its executor thread (its executions
    are too long to run on an async worker)."""
    client = httpclient.InferenceServerClient(spin_server.http_url)
    try:
        for i in range(CALLS):
            infer(client, "sleepy", float(i))
    finally:
        client.close()
    samples = parse_metrics(spin_server.metrics())
    count = {poll: int(metric_sum(samples, "mesh_python_stub_waits_total", instance="sleepy_0_0_v1", poll=poll) or 0)
             for poll in ("none", "caught", "missed")}
    assert_polls_stop(sum(count.values()), count["caught"], count["missed"], "the executor thread")


@pytest.mark.server
def test_a_stub_waiting_for_bls_answers_stops_polling_for_a_slow_model(spin_server):
    """One execute of the caller makes 100 BLS calls to the sleepy model: the caller's stub, waiting
    for each answer, stops polling."""
    client = httpclient.InferenceServerClient(spin_server.http_url, network_timeout=120)
    try:
        waits, caught, missed = infer(client, "caller", float(CALLS)).as_numpy("WAITS").tolist()
    finally:
        client.close()
    assert_polls_stop(waits, caught, missed, "the caller's stub")


def run(policy: SpinPolicy, waits: int, catches) -> int:
    """`waits` waits; the `k`th poll among them catches when `catches(k)` says so. How many polled."""
    polled = 0
    for _ in range(waits):
        if policy.next() > 0:
            policy.record(catches(polled))
            polled += 1
    return polled


def test_the_stubs_policy_polls_while_polls_catch_and_then_only_probes():
    """The stub's copy of the rule, as mesh-node's spin.rs tests it."""
    probes = 3200 // SpinPolicy.PROBE_EVERY
    p = SpinPolicy(0.0001)
    assert run(p, 1000, lambda k: k % 10 != 0) == 1000, "nine catches in ten pay"
    assert run(p, 3, lambda k: False) == 3
    assert run(p, 3200, lambda k: False) == probes, "the third miss in a row stops polls; then only probes"
    assert any(run(p, 1, lambda k: True) for _ in range(SpinPolicy.PROBE_EVERY)), "a probe that catches"
    assert run(p, 100, lambda k: True) == 100, "starts polls again"
    run(p, 100, lambda k: False)
    lucky = run(p, 3200, lambda k: k % 2 == 0)
    assert probes < lucky <= 2 * probes, f"each lucky probe costs one more poll, not more: {lucky}"
    assert run(SpinPolicy(0.0001), 3200, lambda k: k % 2 == 0) < 3200 // 8, "half the polls catching is not enough"
    assert run(SpinPolicy(0.0), 100, lambda k: True) == 0
