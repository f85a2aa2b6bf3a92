"""A gRPC client that cancels its ModelStreamInfer stream (tritonclient's
`stop_stream(cancel_requests=True)`, or grpcio's `call.cancel()`, an RST_STREAM) makes
`is_cancelled()` true for every request of that stream still running, on the request and on its
response sender, for decoupled models whose `execute` already returned (the answers come from the
model's own thread, as in Triton's L0_backend_python decoupled `test_decoupled_execute_cancel`) and
for models that are not decoupled (checking `request.is_cancelled()` inside `execute`), directly on
a node and through a router (the cancel crosses the cluster link).

The models write a marker file when they start watching and another when they see the cancel
(with the time they saw it), so each case asserts both that the cancel arrived and how soon."""
import json
import queue
import sys
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from cluster_util import wait_until

pytestmark = [pytest.mark.server]

# The README's bound is about 20 ms; the models look every 10 ms. This leaves room for a loaded
# machine, and is still far below the seconds a lost cancel shows up as.
CANCEL_BOUND_S = 1.0

WATCH = '''
import json
import os
import time

import triton_python_backend_utils as pb_utils


def watch(target, seconds, marker):
    """Looks at `target.is_cancelled()` every 10 ms for `seconds`; writes `marker`.started at once and
    `marker`.seen with what it saw (and when) at the end. Returns whether the cancel was seen."""
    with open(marker + ".started", "w") as f:
        f.write(str(os.getpid()))
    deadline = time.monotonic() + seconds
    seen = False
    while time.monotonic() < deadline:
        if target.is_cancelled():
            seen = True
            break
        time.sleep(0.01)
    with open(marker + ".tmp", "w") as f:
        f.write(json.dumps({"cancelled": seen, "at": time.time()}))
    os.rename(marker + ".tmp", marker + ".seen")
    pb_utils.Logger.log_info(f"[stream_cancel] {os.path.basename(marker)} cancelled={seen}")
    return seen


def answer(seen):
    if seen:
        return pb_utils.InferenceResponse(error=pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED))
    return pb_utils.InferenceResponse(error=pb_utils.TritonError("not cancelled"))


def args(request):
    seconds = float(pb_utils.get_input_tensor_by_name(request, "SECONDS").as_numpy().reshape(-1)[0])
    on_sender = int(pb_utils.get_input_tensor_by_name(request, "ON_SENDER").as_numpy().reshape(-1)[0])
    return seconds, on_sender, json.loads(request.parameters())["marker"]
'''

DECOUPLED = WATCH + '''
import threading


class TritonPythonModel:
    """Triton's execute_cancel in decoupled mode: execute starts a thread and returns; the thread
    watches the request or its response sender, then answers and sends the final flag."""

    def execute(self, requests):
        for request in requests:
            seconds, on_sender, marker = args(request)
            sender = request.get_response_sender()
            target = sender if on_sender else request

            def run(target=target, sender=sender, seconds=seconds, marker=marker):
                seen = watch(target, seconds, marker)
                sender.send(answer(seen), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

            threading.Thread(target=run, daemon=True).start()
        return None
'''

PLAIN = WATCH + '''

class TritonPythonModel:
    """Triton's execute_cancel as a model that is not decoupled: execute itself watches the request."""

    def execute(self, requests):
        return [answer(watch(request, *args(request)[::2])) for request in requests]
'''


def config(name, decoupled):
    policy = "model_transaction_policy { decoupled: true }\n" if decoupled else ""
    return (f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
            'input [ { name: "SECONDS" data_type: TYPE_FP32 dims: [ 1 ] },\n'
            '        { name: "ON_SENDER" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
            'output [ { name: "DUMMY" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
            # Two instances, so two requests of one stream run at once on the plain model too.
            'instance_group [ { count: 2 kind: KIND_CPU } ]\n' + policy)


MODELS = {"cancel_decoupled": (DECOUPLED, True), "cancel_plain": (PLAIN, False)}
PY_ARGS = ["--backend-config", f"python,interpreter={sys.executable}",
           "--backend-config", "python,execute-timeout-seconds=60"]


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("stream_cancel") / "repo"
    for name, (source, decoupled) in MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(source)
        (repo / name / "config.pbtxt").write_text(config(name, decoupled))
    return repo


@pytest.fixture(scope="module")
def node(server_factory, repo):
    return server_factory([repo], PY_ARGS, name="stream-cancel", wait_models=list(MODELS))


@pytest.fixture(scope="module")
def cluster(module_cluster_factory, repo):
    c = module_cluster_factory("cl-stream-cancel")
    c.start_router()
    c.start_node("n1", [repo], PY_ARGS, wait_models=list(MODELS))
    return c


@pytest.fixture(params=["node", pytest.param("router", marks=pytest.mark.cluster)])
def target(request):
    """The server a client talks to: the node itself, or a router in front of it."""
    if request.param == "node":
        return request.getfixturevalue("node")
    return request.getfixturevalue("cluster").router


def inputs(seconds, on_sender):
    s = grpcclient.InferInput("SECONDS", [1], "FP32")
    s.set_data_from_numpy(np.array([seconds], np.float32))
    o = grpcclient.InferInput("ON_SENDER", [1], "INT32")
    o.set_data_from_numpy(np.array([on_sender], np.int32))
    return [s, o]


def wait_started(markers):
    for m in markers:
        wait_until(lambda m=m: Path(str(m) + ".started").exists(), 60, f"the model to start watching {m.name}")


def assert_seen_within(markers, cancelled_at):
    for m in markers:
        seen = Path(str(m) + ".seen")
        wait_until(seen.exists, 30, f"the model to finish watching {m.name}")
        got = json.loads(seen.read_text())
        assert got["cancelled"], f"{m.name}: is_cancelled() stayed false after the stream was cancelled"
        late = got["at"] - cancelled_at
        print(f"{m.name}: is_cancelled() true {late * 1000:.0f} ms after the cancel")
        assert late < CANCEL_BOUND_S, f"{m.name}: is_cancelled() turned true {late:.3f} s after the cancel"


# (model, ON_SENDER) of each request sent on one stream.
CASES = {
    # Triton's case: execute returned, the model's thread watches the response sender.
    "decoupled-sender": [("cancel_decoupled", 1)],
    "decoupled-request": [("cancel_decoupled", 0)],
    # Every request of the stream still running sees it.
    "decoupled-both": [("cancel_decoupled", 1), ("cancel_decoupled", 0)],
    "plain": [("cancel_plain", 0)],
    "plain-two": [("cancel_plain", 0), ("cancel_plain", 0)],
    "mixed": [("cancel_plain", 0), ("cancel_decoupled", 1)],
}


@pytest.mark.parametrize("case", list(CASES))
def test_stop_stream_with_cancel_requests_reaches_is_cancelled(target, tmp_path, case):
    answers = queue.Queue()
    client = grpcclient.InferenceServerClient(target.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    markers = []
    try:
        for k, (model, on_sender) in enumerate(CASES[case]):
            marker = tmp_path / f"{case}-{k}"
            markers.append(marker)
            # 30 s: the model answers "not cancelled" only if the cancel never reaches it.
            client.async_stream_infer(model, inputs(30.0, on_sender), parameters={"marker": str(marker)})
        wait_started(markers)
        time.sleep(0.3)  # the requests run a while: nothing is cancelled before the client says so
        assert not any(Path(str(m) + ".seen").exists() for m in markers), "a request ended by itself"
        cancelled_at = time.time()
        client.stop_stream(cancel_requests=True)
        assert_seen_within(markers, cancelled_at)
    finally:
        client.close()
    # tritonclient reports its own cancel to the callback, as Triton's test expects.
    answer = answers.get(timeout=10)
    assert "CANCELLED" in str(answer.status()), answer


def raw_request(model, on_sender, marker, seconds=30.0):
    r = service_pb2.ModelInferRequest(model_name=model, id=marker.name)
    for name, dtype, value in (("SECONDS", "FP32", np.float32(seconds)), ("ON_SENDER", "INT32", np.int32(on_sender))):
        t = r.inputs.add()
        t.name, t.datatype = name, dtype
        t.shape.append(1)
        r.raw_input_contents.append(np.array([value]).tobytes())
    r.parameters["marker"].string_param = str(marker)
    return r


@pytest.mark.parametrize("model,on_sender", [("cancel_decoupled", 1), ("cancel_decoupled", 0), ("cancel_plain", 0)])
def test_grpcio_call_cancel_reaches_is_cancelled(target, tmp_path, model, on_sender):
    """A plain grpcio client that cancels the call (RST_STREAM) while its request side is still open."""
    marker = tmp_path / f"raw-{model}-{on_sender}"
    hold = threading.Event()

    def requests():
        yield raw_request(model, on_sender, marker)
        hold.wait(60)  # the client keeps its side of the stream open

    channel = grpc.insecure_channel(target.grpc_url)
    try:
        call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(requests())
        wait_started([marker])
        cancelled_at = time.time()
        call.cancel()
        assert_seen_within([marker], cancelled_at)
        with pytest.raises(grpc.RpcError) as e:
            next(call)
        assert e.value.code() == grpc.StatusCode.CANCELLED
    finally:
        hold.set()
        channel.close()


def test_a_stream_that_is_not_cancelled_lets_its_requests_run_out(target, tmp_path):
    """The other side: a request whose stream stays open is never reported cancelled."""
    client = grpcclient.InferenceServerClient(target.grpc_url)
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    marker = tmp_path / "open"
    try:
        client.async_stream_infer("cancel_decoupled", inputs(0.5, 1), parameters={"marker": str(marker)})
        answer = answers.get(timeout=30)
        assert "not cancelled" in str(answer), answer
        assert json.loads(Path(str(marker) + ".seen").read_text())["cancelled"] is False
    finally:
        client.stop_stream()
        client.close()
