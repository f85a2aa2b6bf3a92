"""A gRPC stream's requests are bounded (issue 24, item 3): a client that sends 200 requests of
1 MiB on one stream to one sequence, whose first request holds the model for seconds, gets at
most 64 of them taken in (the rest wait in HTTP/2 flow control, in the client), and the node's
memory grows by far less than the 200 MiB sent. After the client goes away, the node serves on.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

pytestmark = [pytest.mark.server]

SLOW_SEQ = """import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            time.sleep(2)
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("N", np.array([x.size], np.int64))]))
        return out
"""

CONFIG = """name: "slow_seq"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "N" data_type: TYPE_INT64 dims: [ 1 ] } ]
sequence_batching { max_sequence_idle_microseconds: 60000000 }
"""

PER_REQUEST = 1 << 20  # bytes of X
SENT = 200


def rss_kib(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def request(i: int) -> service_pb2.ModelInferRequest:
    r = service_pb2.ModelInferRequest(model_name="slow_seq", id=str(i))
    r.parameters["sequence_id"].uint64_param = 7
    r.parameters["sequence_start"].bool_param = i == 0
    t = r.inputs.add(name="X", datatype="FP32")
    t.shape.append(PER_REQUEST // 4)
    r.raw_input_contents.append(np.full(PER_REQUEST // 4, i, np.float32).tobytes())
    return r


def test_a_stream_that_floods_one_sequence_is_bounded(fresh_server, tmp_path):
    import sys
    import grpc

    repo = tmp_path / "repo"
    (repo / "slow_seq" / "1").mkdir(parents=True)
    (repo / "slow_seq" / "config.pbtxt").write_text(CONFIG)
    (repo / "slow_seq" / "1" / "model.py").write_text(SLOW_SEQ)
    srv = fresh_server([repo], ["--backend-config", f"python,interpreter={sys.executable}"])
    pid = srv.proc.pid
    before = rss_kib(pid)

    taken = [0]
    stop = threading.Event()

    def requests():
        for i in range(SENT):
            if stop.is_set():
                return
            taken[0] = i + 1
            yield request(i)
        stop.wait(60)

    channel = grpc.insecure_channel(srv.grpc_url, options=[("grpc.max_send_message_length", 8 << 20)])
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    call = stub.ModelStreamInfer(requests())  # never read: the answers wait in the window
    time.sleep(6)
    grown_mib = (rss_kib(pid) - before) / 1024
    handed = taken[0]
    print(f"requests handed to the stream: {handed} of {SENT}; node RSS grew {grown_mib:.0f} MiB")
    assert handed < SENT, "every request was taken in: the stream is not bounded"
    assert grown_mib < 256, f"the node grew by {grown_mib:.0f} MiB for one stream"
    stop.set()
    call.cancel()
    channel.close()

    # The node serves on: the flooded sequence can be ended, and then its instance's one slot
    # (max_batch_size 0) takes the next sequence, as Triton's backlog would.
    c = grpcclient.InferenceServerClient(srv.grpc_url)
    assert c.is_server_ready()
    x = grpcclient.InferInput("X", [4], "FP32")
    x.set_data_from_numpy(np.ones(4, np.float32))
    for seq, start in ((7, False), (8, True)):
        r = c.infer("slow_seq", [x], sequence_id=seq, sequence_start=start, sequence_end=True, client_timeout=60)
        assert r.as_numpy("N").tolist() == [4]
    c.close()
