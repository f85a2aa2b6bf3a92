"""Router streams are credit windows (issue 24, item 3): gRPC clients that open streams of a
decoupled model through the router and then read nothing hold a small window of answers each in the
router, not all of them, and nothing unread in the link: credit flows back to the node only as a
client reads, so the model itself waits. Twenty such streams on one node would fill the link's
64 MiB connection window four times over if their answers waited unread in it; meanwhile 200 other
requests through the router to the same node succeed, and once the clients go away the models are
released and the router serves on.

How far a model got is read once its count has stopped moving (`settled`), never after a fixed
time, so a slow machine only makes the test slower."""
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
STREAMS, COUNT, SIZE = 20, 300, 256 << 10  # 1.5 GiB if nothing held the models back


def status_kib(pid: int, field: str) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field}")


def flood_request(progress: Path, count: int = COUNT, size: int = SIZE) -> service_pb2.ModelInferRequest:
    r = service_pb2.ModelInferRequest(model_name="flood_py", id=progress.name)
    r.parameters["progress"].string_param = str(progress)
    for name, value in (("COUNT", count), ("SIZE", size)):
        t = r.inputs.add(name=name, datatype="INT32")
        t.shape.append(1)
        r.raw_input_contents.append(np.array([value], np.int32).tobytes())
    return r


def sent(progress: Path) -> int:
    try:
        return int(progress.read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def settled(progress: list[Path], quiet: float = 1.0, timeout: float = 120.0) -> list[int]:
    """What each model has sent, once every one has sent something and none has sent more for
    `quiet` s (a model held back by its client stops; one that is not runs to COUNT and stops
    there); fails after `timeout` s."""
    deadline = time.monotonic() + timeout
    last, since = [sent(p) for p in progress], time.monotonic()
    while True:
        time.sleep(0.05)
        now = [sent(p) for p in progress]
        if now != last:
            last, since = now, time.monotonic()
        elif min(last) > 0 and time.monotonic() - since >= quiet:
            return last
        assert time.monotonic() < deadline, f"the models never settled: {last}"


def stall(url: str, progress: list[Path], hold: threading.Event, options, count: int = COUNT, size: int = SIZE,
          channel=None):
    """Opens one flood_py stream per `progress` file that sends its request and then reads nothing
    until `hold` is set: on `channel` if given (one connection for all), else each on a channel of
    its own. Returns (channels opened, streams)."""
    channels, streams = [], []
    for p in progress:
        ch = channel
        if ch is None:
            ch = grpc.insecure_channel(url, options=options)
            channels.append(ch)

        def requests(p=p):
            yield flood_request(p, count, size)
            hold.wait(120)  # the stream stays open, and nothing is read

        streams.append(service_pb2_grpc.GRPCInferenceServiceStub(ch).ModelStreamInfer(requests()))
    return channels, streams


def release(streams, hold: threading.Event, channels) -> None:
    for s in streams:
        s.cancel()
    hold.set()
    for ch in channels:
        ch.close()


def test_stream_clients_that_stop_reading_hold_a_window_not_the_router(cluster_factory, models_dir, tmp_path):
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

    progress = [tmp_path / f"flood-{k}" for k in range(STREAMS)]
    hold = threading.Event()
    # Without BDP probing the client's own HTTP/2 window stays small: grpc-core grows it with the
    # measured bandwidth (seen in CI: 32 MiB per stream, 153 answers), which measures the client,
    # not what the router and the node hold back.
    options = [("grpc.max_receive_message_length", -1), ("grpc.http2.bdp_probe", 0)]
    channels, streams = stall(router.grpc_url, progress, hold, options)
    try:
        # Every model is held back (or, unbounded, has sent all it has) before the other requests go.
        settled(progress)
        for done in range(200):  # each answers within the client's 30 s, or fails the test
            add_sub(done)
        made = settled(progress)
        peak = status_kib(pid, "VmHWM") - before
        # Unbounded, each model would have sent all its answers into the router. Bounded, it sent
        # 26: the router's window of 16, the link's 2 credits and the stub's allowance of 8.
        assert all(0 < m <= 32 for m in made), f"answers sent to clients reading none: {made}"
        assert peak < 320 * 1024, f"the router grew by {peak // 1024} MiB for {STREAMS} stalled streams"
        node = next(n for n in c.view()["nodes"] if n["name"] == "w1")
        assert node["state"] == "up", node
        print(f"{STREAMS} streams stalled: 200 other requests served, the models sent "
              f"{min(made)}-{max(made)} of {COUNT} answers each, router peak growth {peak // 1024} MiB")
        # Reading resumes: answers come in order.
        first = next(streams[0])
        assert first.error_message == "", first.error_message
        assert first.infer_response.id == "flood-0"
    finally:
        release(streams, hold, channels)
    # The clients are gone: the models are released (this one does not check is_cancelled(), so its
    # remaining answers are dropped unsent), nothing piles up in the router, and it serves on.
    deadline = time.monotonic() + 60
    while min(sent(p) for p in progress) < COUNT and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(sent(p) == COUNT for p in progress), "a model stayed blocked on a client that left"
    grown = status_kib(pid, "VmRSS") - before
    assert grown < 320 * 1024, f"the router holds {grown // 1024} MiB after the clients left"
    for i in range(5):
        add_sub(1000 + i)
    http.close()


def test_a_stalled_stream_holds_its_models_thread_not_the_instance(server_factory, tmp_path):
    """On a node: a client that stops reading a decoupled Python model's answers stops the model's
    thread that sends them (the stub's allowance), not the instance's reading thread, so the same
    instance keeps serving every other client."""
    repo = copy_models(PY_MODELS, tmp_path / "repo", ["flood_py"])
    server = server_factory([repo], PY_ARGS, name="stalled-stream", wait_models=["flood_py"])
    stalled = tmp_path / "stalled"
    hold = threading.Event()
    channel = grpc.insecure_channel(server.grpc_url, options=[("grpc.max_receive_message_length", -1)])
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

    def requests():
        yield flood_request(stalled)
        hold.wait(60)

    answers = stub.ModelStreamInfer(requests())
    try:
        [made] = settled([stalled])
        assert 0 < made < COUNT // 3, made
        # Another client of the same instance is served in full meanwhile.
        got = []
        for a in stub.ModelStreamInfer(iter([flood_request(tmp_path / "other", 5, 1024)]), timeout=30):
            assert a.error_message == "", a.error_message
            if a.infer_response.outputs:
                got.append(a.infer_response.id)
            if a.infer_response.parameters["triton_final_response"].bool_param or len(got) == 5:
                break
        assert len(got) == 5, got
    finally:
        answers.cancel()
        hold.set()
        channel.close()


def test_many_streams_of_one_connection_share_its_window(cluster_factory, models_dir, tmp_path):
    """One client connection with 60 streams through the router, reading none: their windows share
    the connection's (32 MiB, 128 of these answers, past the one answer each stream may always have
    out), so the models were let send far fewer answers than 60 streams' own windows would take
    (26 each, 1560), every stream still got its first, and a client on another connection is
    served in full meanwhile."""
    streams_n = 60
    repo = copy_models(PY_MODELS, tmp_path / "repo", ["flood_py"])
    c = cluster_factory()
    router = c.start_router()
    c.start_node("w1", [repo], PY_ARGS)
    options = [("grpc.max_receive_message_length", -1), ("grpc.http2.bdp_probe", 0)]
    channel = grpc.insecure_channel(router.grpc_url, options=options)
    progress = [tmp_path / f"conn-{k}" for k in range(streams_n)]
    hold = threading.Event()
    _, streams = stall(router.grpc_url, progress, hold, options, channel=channel)
    other = grpc.insecure_channel(router.grpc_url, options=options)
    try:
        made = settled(progress)
        # Bounded: 128 shared, plus per stream its first answer, the link's 2 credits, the stub's
        # allowance of 8 and what HTTP/2 buffers for the client (805 seen); each stream's own
        # window alone would allow 26 and those buffers each (1560 and more).
        assert sum(made) <= 1000, f"answers made for one connection reading none: {sum(made)} ({made})"
        other_stub = service_pb2_grpc.GRPCInferenceServiceStub(other)
        got = 0
        for a in other_stub.ModelStreamInfer(iter([flood_request(tmp_path / "other", 20, 1024)]), timeout=60):
            assert a.error_message == "", a.error_message
            got += bool(a.infer_response.outputs)
            if got == 20:
                break
        assert got == 20, "another connection's stream is served in full"
        print(f"{streams_n} stalled streams on one connection: {sum(made)} answers made "
              f"({min(made)}-{max(made)} each)")
    finally:
        release(streams, hold, [channel, other])


def test_stalled_streams_of_large_answers_never_drop_a_healthy_node(cluster_factory, tmp_path):
    """The link's idle timeout holds under load, at the product's timings (keep-alive 150 ms, link
    dead after 750 ms of silence): 20 clients on their own connections stall streams of 1 MiB
    answers through the router, so the link carries what their windows let through and then waits
    on them, for 5 s; the router keeps the node up the whole time (its view, read every 100 ms,
    never shows it otherwise), and the node serves another client meanwhile."""
    link = ["--cluster-keepalive-ms", "150", "--cluster-idle-timeout-ms", "750"]
    repo = copy_models(PY_MODELS, tmp_path / "repo", ["flood_py"])
    c = cluster_factory()
    router = c.start_router(args=link)
    c.start_node("w1", [repo], PY_ARGS + link)
    options = [("grpc.max_receive_message_length", -1), ("grpc.http2.bdp_probe", 0),
               ("grpc.use_local_subchannel_pool", 1)]
    progress = [tmp_path / f"big-{k}" for k in range(20)]
    hold = threading.Event()
    channels, streams = stall(router.grpc_url, progress, hold, options, count=100, size=1 << 20)
    try:
        settled(progress)
        states, end = set(), time.monotonic() + 5
        while time.monotonic() < end:
            states.add(c.node_info("w1")["state"])
            time.sleep(0.1)
        assert states == {"up"}, f"the router saw the node {states} while streams stalled"
        other = grpc.insecure_channel(router.grpc_url, options=options)
        channels.append(other)
        got = 0
        stub = service_pb2_grpc.GRPCInferenceServiceStub(other)
        for a in stub.ModelStreamInfer(iter([flood_request(tmp_path / "other", 5, 1 << 20)]), timeout=60):
            assert a.error_message == "", a.error_message
            got += bool(a.infer_response.outputs)
            if got == 5:
                break
        assert got == 5
        assert c.node_info("w1")["state"] == "up"
    finally:
        release(streams, hold, channels)
