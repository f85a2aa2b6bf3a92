"""A request to a Python model that finds its instance idle runs on the async worker that decoded it,
which writes to the stub and reads its answer itself, instead of handing it to the instance's
executor thread and back (two wake-ups of four). One async worker always stays free, and a model
that makes a BLS call goes back to its executor thread for good (the call's first request finishes
with the worker handed over, so the tasks it starts are not stuck behind it).

The node counts the requests each instance ran this way (`mesh_instance_inline_executions_total`).
Whether a model is quick enough for it is measured (its executions must average under
`inline-limit-microseconds`); the tests set that limit to a minute, so that how fast this machine
happens to be never decides the path. The wake-ups saved are measured in benches/scheduling.py."""
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from cluster_util import add_sub_inputs
from mesh_util import metric_sum, parse_metrics

pytestmark = [pytest.mark.server]

REQUESTS = 200
WARM = 5  # the first request runs on the executor thread, until its execution time is known

# OUTPUT0 = INPUT0 + INPUT1, computed here, or through a BLS call (async_exec) to the ONNX add_sub
# when INPUT0 starts with a negative number.
MODEL_PY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "INPUT0")
            b = pb_utils.get_input_tensor_by_name(r, "INPUT1")
            if a.as_numpy().flat[0] < 0:
                call = pb_utils.InferenceRequest(model_name="add_sub", requested_output_names=["OUTPUT0"],
                                                 inputs=[a, b])
                answer = await call.async_exec()
                if answer.has_error():
                    raise RuntimeError(answer.error().message())
                total = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0").as_numpy()
            else:
                total = a.as_numpy() + b.as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", total)]))
        return out
'''
CONFIG = '''name: "inl"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
instance_group [ { kind: KIND_CPU } ]
'''


@pytest.fixture
def inline_repo(models_dir, tmp_path) -> Path:
    import shutil
    repo = tmp_path / "repo"
    shutil.copytree(models_dir / "simple" / "add_sub", repo / "add_sub")
    (repo / "inl" / "1").mkdir(parents=True)
    (repo / "inl" / "config.pbtxt").write_text(CONFIG)
    (repo / "inl" / "1" / "model.py").write_text(MODEL_PY)
    return repo


def start(fresh_server, repo, workers: int):
    fresh_server.env = dict(fresh_server.env, TOKIO_WORKER_THREADS=str(workers))
    # A BLS call stuck behind its caller would fail its request at the execute timeout.
    return fresh_server([repo], ["--backend-config", f"python,interpreter={sys.executable}",
                                 "--backend-config", "python,execute-timeout-seconds=60",
                                 "--backend-config", "python,inline-limit-microseconds=60000000"],
                        wait_models=["inl", "add_sub"])


def inline_runs(srv) -> int:
    """Requests the inl instance ran on the async worker that received them."""
    samples = parse_metrics(srv.metrics())
    return int(metric_sum(samples, "mesh_instance_inline_executions_total", instance="inl_0_0_v1") or 0)


def send(client, count: int, *, via_bls: bool = False) -> None:
    """`count` requests one after the other, each checked (negative inputs take the BLS path)."""
    for i in range(count):
        a, b = add_sub_inputs(i)
        if via_bls:
            a = -a - 1
        inputs = [httpclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        out = client.infer("inl", inputs).as_numpy("OUTPUT0")
        np.testing.assert_array_equal(out, a + b)


def inline_over(srv, client, count: int, **kw) -> int:
    """How many of `count` requests, sent one after the other, ran inline."""
    before = inline_runs(srv)
    send(client, count, **kw)
    return inline_runs(srv) - before


@pytest.mark.parametrize("workers", [2, 1])
def test_a_request_to_an_idle_python_model_skips_its_executor_thread(fresh_server, inline_repo, workers):
    """With two async workers, every request sent one after the other finds the instance idle and
    runs inline. With one, that worker must stay free, so every request goes through the executor
    thread."""
    srv = start(fresh_server, inline_repo, workers)
    client = httpclient.InferenceServerClient(srv.http_url, network_timeout=120)
    try:
        send(client, WARM)
        inline = inline_over(srv, client, REQUESTS)
    finally:
        client.close()
    assert inline == (REQUESTS if workers == 2 else 0), f"{inline} of {REQUESTS} requests ran inline"


def test_a_bls_call_from_a_request_run_inline_is_answered_and_sends_the_model_back(fresh_server, inline_repo):
    """The model's first BLS call comes from a request the async worker runs itself: the call (an
    async_exec, whose task the runtime must run meanwhile) is answered before the execute timeout.
    From then on the model's requests go through its executor thread again."""
    srv = start(fresh_server, inline_repo, 2)
    client = httpclient.InferenceServerClient(srv.http_url, network_timeout=120)
    try:
        send(client, WARM)
        assert inline_over(srv, client, 50) == 50, "requests did not run inline before the BLS call"
        assert inline_over(srv, client, 1, via_bls=True) == 1, "the first BLS call came from an inline request"
        send(client, 20, via_bls=True)
        inline = inline_over(srv, client, REQUESTS)
    finally:
        client.close()
    assert inline == 0, f"{inline} requests ran inline after the model made a BLS call"
    assert "did not answer within" not in srv.log_path.read_text(errors="replace")
