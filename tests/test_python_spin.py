"""A wait for a Python stub's answer polls first (`spin-microseconds`) only while polls keep catching
the answer: on a node whose model takes longer than the poll, the waits soon sleep at once instead
of burning the poll's CPU every time. Both ends hold to it: mesh-node's executor thread waiting for
an execute, and the stub waiting for the answer to a BLS call.

The model here sleeps 5 ms per execute against polls of 3 ms, so a wait that always polled would
burn at least 3 ms of CPU per execute; CPU time is read from /proc in clock ticks (10 ms)."""
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from proc_util import cpu_ticks, stubs_of

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "crates" / "node" / "python"))
from mesh_stub_calls import SpinPolicy  # noqa: E402  (the stub's own copy of the policy)

CALLS = 100
POLL_US = 3000
# 100 polls of 3 ms that miss are at least 30 ticks; the work itself is a few.
MOST_TICKS = 12

SLEEPY_PY = '''
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.005)
        return [pb_utils.InferenceResponse([pb_utils.get_input_tensor_by_name(r, "X")]) for r in requests]
'''
CALLER_PY = '''
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
            out.append(pb_utils.InferenceResponse([x]))
        return out
'''
CONFIG = '''name: "{name}"
backend: "python"
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU }} ]
'''


@pytest.fixture
def spin_server(fresh_server, tmp_path):
    repo = tmp_path / "repo"
    for name, code in (("sleepy", SLEEPY_PY), ("caller", CALLER_PY)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name))
        (repo / name / "1" / "model.py").write_text(code)
    return fresh_server([repo], ["--backend-config", f"python,interpreter={sys.executable}",
                                 "--backend-config", f"python,spin-microseconds={POLL_US}"],
                        wait_models=["sleepy", "caller"])


def infer(client, model: str, value: float) -> None:
    x = httpclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.array([value], np.float32))
    np.testing.assert_array_equal(client.infer(model, [x]).as_numpy("X"), [value])


def thread_ticks(pid: int, name: str) -> int:
    """CPU ticks of the node's executor thread of an instance (named after it)."""
    ticks = cpu_ticks(pid, name)
    assert ticks is not None, f"no thread named {name} in the node"
    return ticks


def stub_ticks(stubs: list[int]) -> int:
    """CPU ticks of the stub processes, summed (a stub that exited fails the test)."""
    ticks = [cpu_ticks(s) for s in stubs]
    assert None not in ticks, f"a stub of {stubs} exited"
    return sum(ticks)


@pytest.mark.server
def test_the_executor_thread_stops_polling_for_a_slow_model(spin_server):
    """Requests one after the other to the sleepy model wait on its executor thread (its executions
    are too long to run on an async worker)."""
    client = httpclient.InferenceServerClient(spin_server.http_url)
    try:
        infer(client, "sleepy", 1.0)
        pid = spin_server.proc.pid
        before = thread_ticks(pid, "sleepy_0_0_v1")
        for i in range(CALLS):
            infer(client, "sleepy", float(i))
        burnt = thread_ticks(pid, "sleepy_0_0_v1") - before
    finally:
        client.close()
    assert burnt < MOST_TICKS, f"the executor thread burnt {burnt} ticks over {CALLS} requests"


@pytest.mark.server
def test_a_stub_waiting_for_bls_answers_stops_polling_for_a_slow_model(spin_server):
    """One execute of the caller makes 100 BLS calls to the sleepy model: neither the caller's stub
    (waiting for each answer) nor the thread that runs the calls keeps polling."""
    client = httpclient.InferenceServerClient(spin_server.http_url, network_timeout=60)
    try:
        infer(client, "caller", 1.0)
        pid = spin_server.proc.pid
        stubs = stubs_of(pid)
        assert len(stubs) == 2, stubs
        before = stub_ticks(stubs), thread_ticks(pid, "caller_0_0_v1")
        infer(client, "caller", float(CALLS))
        after = stub_ticks(stubs), thread_ticks(pid, "caller_0_0_v1")
    finally:
        client.close()
    stubs_burnt, thread_burnt = after[0] - before[0], after[1] - before[1]
    assert stubs_burnt < MOST_TICKS, f"the stubs burnt {stubs_burnt} ticks over {CALLS} BLS calls"
    assert thread_burnt < MOST_TICKS, f"the caller's executor thread burnt {thread_burnt} ticks"


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
