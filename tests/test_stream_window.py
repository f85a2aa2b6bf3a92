"""Router streams are credit windows (issue 24, item 3): a gRPC client that opens a stream of a
decoupled model through the router and then reads nothing for 20 s holds a small window of answers
in the router, not all of them; credit flows back to the node only as the client reads, so the
model itself waits. Meanwhile 200 other requests through the router succeed, and once the client
goes away the model is released and the router serves on."""
from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from cluster_util import add_sub_inputs, copy_models

pytestmark = [pytest.mark.server, pytest.mark.cluster]

PY_MODELS = Path(__file__).parent / "python_models"
PY_ARGS = ["--backend-config", f"python,interpreter={sys.executable}"]
COUNT, SIZE = 150, 4 << 20  # 600 MiB if nothing held the model back


def status_kib(pid: int, field: str) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field}")


def flood_request(progress: Path) -> service_pb2.ModelInferRequest:
    r = service_pb2.ModelInferRequest(model_name="flood_py", id="flood")
    r.parameters["progress"].string_param = str(progress)
    for name, value in (("COUNT", COUNT), ("SIZE", SIZE)):
        t = r.inputs.add(name=name, datatype="INT32")
        t.shape.append(1)
        r.raw_input_contents.append(np.array([value], np.int32).tobytes())
    return r


def sent(progress: Path) -> int:
    try:
        return int(progress.read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def test_a_stream_client_that_stops_reading_holds_a_window_not_the_router(cluster_factory, models_dir, tmp_path):
    repo = copy_models(models_dir / "simple", tmp_path / "repo", ["add_sub"])
    copy_models(PY_MODELS, repo, ["flood_py"])
    c = cluster_factory()
    router = c.start_router()
    c.start_node("w1", [repo], PY_ARGS)
    http = httpclient.InferenceServerClient(router.http_url, network_timeout=30)

    def add_sub(i: int) -> None:
        a, b = add_sub_inputs(i)
        ins = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
        ins[0].set_data_from_numpy(a)
        ins[1].set_data_from_numpy(b)
        r = http.infer("add_sub", ins)
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)

    for i in range(20):  # warm the router's allocator and paths
        add_sub(i)
    pid = router.proc.pid
    before = status_kib(pid, "VmRSS")

    progress = tmp_path / "progress"
    channel = grpc.insecure_channel(router.grpc_url, options=[("grpc.max_receive_message_length", -1)])
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    hold = threading.Event()

    def requests():
        yield flood_request(progress)
        hold.wait(120)  # the stream stays open, and nothing is read

    answers = stub.ModelStreamInfer(requests())
    try:
        deadline = time.monotonic() + 20
        done = 0
        while time.monotonic() < deadline:
            add_sub(done)
            done += 1
            if done >= 200:
                time.sleep(0.05)
        assert done >= 200, f"only {done} requests got through in 20 s beside the stalled stream"
        made = sent(progress)
        peak = status_kib(pid, "VmHWM") - before
        # Unbounded, the model would have sent all 150 answers (600 MiB) into the router by now.
        assert 0 < made < COUNT // 3, f"the model sent {made} of {COUNT} answers to a client reading none"
        assert peak < 160 * 1024, f"the router grew by {peak // 1024} MiB for one stalled stream"
        print(f"stalled 20 s: {done} other requests served, the model sent {made} of {COUNT} answers, "
              f"router peak growth {peak // 1024} MiB")
        # Reading resumes: the answers come in order, one window at a time.
        first = next(answers)
        assert first.error_message == "", first.error_message
        assert first.infer_response.id == "flood"
    finally:
        answers.cancel()
        hold.set()
        channel.close()
    # The client is gone: the model is released (this one does not check is_cancelled(), so its
    # remaining answers are dropped unsent), nothing piles up in the router, and it serves on.
    deadline = time.monotonic() + 60
    while sent(progress) < COUNT and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sent(progress) == COUNT, f"the model stayed blocked on a client that left ({sent(progress)} sent)"
    grown = status_kib(pid, "VmRSS") - before
    assert grown < 160 * 1024, f"the router holds {grown // 1024} MiB after the client left"
    for i in range(5):
        add_sub(1000 + i)
    http.close()
