"""Open sequences end to end (issue 52, item 5): STARTs per second over gRPC as 100 000 sequences
pile up on a node, none ended: each START opens a sequence of its own (distinct correlation ids) on
an ONNX accumulator with implicit state (oldest strategy, 131 072 candidate sequences, 120 s idle).
Before the sequence table was indexed, the rate fell from 2 161 to 251 STARTs/s as they piled up.

Reported: STARTs/s for each block of 10 000, and the last block's rate over the first's.
Output: a markdown report on stdout and in benches/results/sequences-e2e-<host>.md.
Usage: .venv/bin/python benches/sequences_e2e.py [--starts 100000] [--concurrency 16]
"""
import argparse
import asyncio
import platform
import sys
import tempfile
import time
from pathlib import Path

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benches"))
from mesh_util import MeshServer  # noqa: E402
from scheduling import env  # noqa: E402
from test_sequence import accumulate_model  # noqa: E402

BLOCK = 10_000


def start_request(seq: int) -> service_pb2.ModelInferRequest:
    r = service_pb2.ModelInferRequest(model_name="seq_many")
    r.parameters["sequence_id"].uint64_param = seq
    r.parameters["sequence_start"].bool_param = True
    t = r.inputs.add(name="INPUT", datatype="FP32")
    t.shape.extend([1, 1])
    r.raw_input_contents.append(np.ones((1, 1), np.float32).tobytes())
    return r


async def run(url: str, starts: int, concurrency: int) -> list[float]:
    channel = grpc.aio.insecure_channel(url)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    next_id, done, stamps = [1], [0], [time.perf_counter()]

    async def client():
        while next_id[0] <= starts:
            seq = next_id[0]
            next_id[0] += 1
            await stub.ModelInfer(start_request(seq), timeout=60)
            done[0] += 1
            if done[0] % BLOCK == 0:
                stamps.append(time.perf_counter())

    await asyncio.gather(*(client() for _ in range(concurrency)))
    await channel.close()
    return [BLOCK / (b - a) for a, b in zip(stamps, stamps[1:])]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--starts", type=int, default=100_000)
    ap.add_argument("--concurrency", type=int, default=16)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        accumulate_model(repo, "seq_many", 120_000_000)
        config = repo / "seq_many" / "config.pbtxt"
        config.write_text(config.read_text().replace("max_candidate_sequences: 8", "max_candidate_sequences: 131072"))
        srv = MeshServer(ROOT / "target" / "release" / "mesh-node", [repo], [], Path(tmp) / "node.log",
                         env()).start(["seq_many"], timeout=120)
        try:
            rates = asyncio.run(run(f"127.0.0.1:{srv.grpc_port}", a.starts, a.concurrency))
        finally:
            srv.stop()
    rows = [f"| {(i + 1) * BLOCK:,} | {r:,.0f} |".replace(",", " ") for i, r in enumerate(rates)]
    report = "\n".join([
        f"# Open sequences end to end, {time.strftime('%Y-%m-%d')}, {platform.node()}, concurrency {a.concurrency}",
        "",
        "| sequences open | STARTs/s over the last 10 000 |",
        "|---|---|",
        *rows,
        "",
        f"last block / first block: {rates[-1] / rates[0]:.2f}",
    ])
    print(report)
    (ROOT / "benches" / "results" / f"sequences-e2e-{platform.node()}.md").write_text(report + "\n")


if __name__ == "__main__":
    main()
