#!/usr/bin/env python3
"""The in-process reference for benches/torch.sh: the same model.pt run by torch in this process,
from C threads at once, one [1, 64] input per call, no server in between.

    torch_inproc.py <model.pt> <concurrency> <seconds> <intra-op threads>

Prints one markdown row: | model | concurrency | torch in-process | infer/s | p50 µs | p99 µs |
"""
import sys
import threading
import time

import torch


def main():
    path, conc, secs, intra = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(intra)
    model = torch.jit.load(path).eval()
    x = torch.rand(1, 64)
    with torch.no_grad():
        for _ in range(50):  # the profiling executor optimizes after its first runs
            model(x)
    latencies = [[] for _ in range(conc)]
    stop = time.monotonic() + secs

    def worker(mine):
        inp = torch.rand(1, 64)
        with torch.no_grad():
            while time.monotonic() < stop:
                t0 = time.perf_counter_ns()
                out = model(inp)
                out["probs"].numpy()  # the caller reads the answer, as a client would
                mine.append((time.perf_counter_ns() - t0) / 1000)

    threads = [threading.Thread(target=worker, args=(latencies[i],)) for i in range(conc)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    allv = sorted(v for l in latencies for v in l)
    pct = lambda p: allv[min(len(allv) - 1, int(p * len(allv)))]
    print(f"| dict_mlp | {conc} | torch in-process | {len(allv) / wall:.0f} | {pct(0.5):.0f} | {pct(0.99):.0f} |")


if __name__ == "__main__":
    main()
