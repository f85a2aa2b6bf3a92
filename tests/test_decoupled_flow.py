"""Decoupled Python models, second round (issue 15): BLS to a decoupled model
(`exec(decoupled=True)` and `async_exec(decoupled=True)`, from plain and decoupled models); a
decoupled instance takes its next execute as soon as execute returns while earlier requests keep
streaming; and the answer stream is bounded, so a client that stops reading stops its model
instead of growing the node's memory."""
import queue
import shutil
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.server]

PY_MODELS = Path(__file__).parent / "python_models"
MODELS = ["repeat_py", "add_sub_py", "bls_stream_py", "bls_stream_dec_py", "flood_py"]


@pytest.fixture(scope="module")
def server(server_factory, tmp_path_factory):
    repo = tmp_path_factory.mktemp("decoupled_flow") / "repo"
    for name in ("repeat_py", "add_sub_py", "bls_stream_py", "flood_py"):
        shutil.copytree(PY_MODELS / name, repo / name)
    # The same BLS model, decoupled: its stub has a reading thread, and answers from it.
    shutil.copytree(PY_MODELS / "bls_stream_py", repo / "bls_stream_dec_py")
    cfg = repo / "bls_stream_dec_py" / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace('name: "bls_stream_py"', 'name: "bls_stream_dec_py"')
                   + "model_transaction_policy { decoupled: true }\n")
    args = ["--backend-config", f"python,interpreter={sys.executable}",
            "--backend-config", "python,execute-timeout-seconds=30"]
    return server_factory([repo], args, name="decoupled-flow", wait_models=MODELS)


class Stream:
    def __init__(self, url, callback=None):
        self.client = grpcclient.InferenceServerClient(url)
        self.answers = queue.Queue()
        self.client.start_stream(callback=callback or (lambda result, error: self.answers.put((result, error))))

    def send(self, model, inputs, request_id="", **parameters):
        self.client.async_stream_infer(model, inputs, request_id=request_id, parameters=parameters or None,
                                       enable_empty_final_response=True)

    def next(self, timeout=30):
        return self.answers.get(timeout=timeout)

    def close(self, cancel=False):
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def ints(name, values):
    t = grpcclient.InferInput(name, [len(values)], "INT32")
    t.set_data_from_numpy(np.array(values, np.int32))
    return t


def final(result):
    r = result.get_response()
    return r.parameters["triton_final_response"].bool_param and not r.outputs


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_bls_to_a_decoupled_model_iterates_its_answers(server, mode):
    c = httpclient.InferenceServerClient(server.http_url)
    t = httpclient.InferInput("IN", [4], "INT32")
    t.set_data_from_numpy(np.array([1, 2, 3, 40], np.int32))
    r = c.infer("bls_stream_py", [t], parameters={"mode": mode})
    assert int(r.as_numpy("SUM")[0]) == 46 and int(r.as_numpy("ANSWERS")[0]) == 4
    # Zero answers (only the final flag): the iteration is one empty response, as Triton's
    # (bls_stream_py fails unless every iteration ends with that empty final response).
    t0 = httpclient.InferInput("IN", [0], "INT32")
    t0.set_data_from_numpy(np.zeros(0, np.int32))
    r = c.infer("bls_stream_py", [t0], parameters={"mode": mode})
    assert int(r.as_numpy("ANSWERS")[0]) == 0
    # An answer that is an error reaches the caller as an error response of the iteration.
    with pytest.raises(InferenceServerException) as e:
        c.infer("bls_stream_py", [t], parameters={"mode": mode, "error_at": 2})
    assert "no answer for element 2" in str(e.value)
    c.close()


def test_a_decoupled_model_makes_decoupled_bls_calls_from_its_reading_thread(server):
    s = Stream(server.grpc_url)
    try:
        for mode in ("sync", "async"):
            s.send("bls_stream_dec_py", [ints("IN", [5, 6, 7])], request_id=mode, mode=mode)
            result, error = s.next()
            assert error is None, error
            assert int(result.as_numpy("SUM")[0]) == 18 and result.get_response().id == mode
    finally:
        s.close()


def test_a_decoupled_instance_takes_the_next_execute_while_earlier_requests_stream(server):
    """repeat_py has one instance: a slow request (5 answers, 1 s apart, from a thread) must not
    hold back a quick one sent after it. The quick request needs well under a second; the slow one
    streams for 5 s, so only an instance that waits for the stream to end answers it later."""
    s = Stream(server.grpc_url)
    try:
        s.send("repeat_py", [ints("IN", [1, 2, 3, 4, 5])], request_id="slow", mode="thread", delay_ms=1000)
        s.send("repeat_py", [ints("IN", [9])], request_id="quick", mode="thread")
        finished = []
        seen = {"slow": [], "quick": []}
        while len(finished) < 2:
            result, error = s.next()
            assert error is None, error
            rid = result.get_response().id
            if final(result):
                finished.append(rid)
            else:
                seen[rid].append(int(result.as_numpy("OUT")[0]))
        assert finished == ["quick", "slow"], "the quick request finished while the slow one streamed"
        assert seen == {"slow": [1, 2, 3, 4, 5], "quick": [9]}, "every later answer reached its client"
    finally:
        s.close()


def test_a_client_that_stops_reading_stops_the_model_and_loses_nothing(server, tmp_path):
    count, size = 400, 256 << 10
    progress = tmp_path / "progress"
    got = queue.Queue()
    paused = {"first": True}
    reading = threading.Event()

    def slow_reader(result, error):
        if paused["first"]:  # the client reads one answer, then nothing until the test says so
            paused["first"] = False
            reading.wait(60)
        got.put((result, error))

    s = Stream(server.grpc_url, callback=slow_reader)
    try:
        s.send("flood_py", [ints("COUNT", [count]), ints("SIZE", [size])], request_id="flood",
               progress=str(progress))
        # Unbounded, the model would send all 400 answers (100 MiB); bounded, it waits for the client
        # once the node's window (16), the gRPC stream's (64) and the transport's buffers are full:
        # what it has sent once it stops is the bound.
        sent = sent_when_stopped(progress)
        assert 0 < sent < count // 2, f"the model sent {sent} of {count} answers to a client reading none"
        reading.set()
        numbers = []
        while True:
            result, error = got.get(timeout=60)
            assert error is None, error
            if final(result):
                break
            assert result.as_numpy("DATA").nbytes == size
            numbers.append(int(result.as_numpy("N")[0]))
        assert numbers == list(range(count)), "every answer, in order"
    finally:
        reading.set()
        s.close()


def sent_when_stopped(progress: Path, quiet: float = 1.0, timeout: float = 60.0) -> int:
    """The count in `progress` (written by flood_py after each answer) once it is above 0 and has not
    changed for `quiet` s, or has reached the end; fails after `timeout` s."""
    def read():
        try:
            return int(progress.read_text() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    deadline = time.monotonic() + timeout
    last, since = read(), time.monotonic()
    while True:
        time.sleep(0.05)
        now = read()
        if now != last:
            last, since = now, time.monotonic()
        elif last > 0 and time.monotonic() - since >= quiet:
            return last
        assert time.monotonic() < deadline, f"flood_py kept sending (or never started): {last} answers"
