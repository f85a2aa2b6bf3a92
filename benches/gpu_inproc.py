#!/usr/bin/env python3
"""The in-process reference of benches/gpu.sh: a TorchScript model.pt run by torch on a GPU in this
process, each call as a server runs it (a host array in, copied to the device, forward, the output
copied back and read), with no server in between.

    gpu_inproc.py <model.pt> <input width> <seconds>

Prints one JSON object: p50/p99 µs of a batch-1 call, and rows/s of back-to-back batch-64 calls."""
import json
import sys
import time

import numpy as np
import torch


def run(model, x, seconds):
    device = torch.device("cuda", 0)
    times = []
    stop = time.monotonic() + seconds
    with torch.no_grad():
        while time.monotonic() < stop:
            t0 = time.perf_counter_ns()
            y = model(torch.from_numpy(x).to(device))
            y.cpu().numpy()
            times.append((time.perf_counter_ns() - t0) / 1000)
    return sorted(times)


def main():
    path, width, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    model = torch.jit.load(path, map_location="cuda:0").eval()
    rng = np.random.default_rng(0)
    one = rng.standard_normal((1, width), dtype=np.float32)
    batch = rng.standard_normal((64, width), dtype=np.float32)
    run(model, one, 1.0)  # warm-up: the profiling executor optimises after its first runs
    run(model, batch, 1.0)
    single = run(model, one, seconds)
    many = run(model, batch, seconds)
    pct = lambda v, p: v[min(len(v) - 1, int(p * len(v)))]  # noqa: E731
    print(json.dumps({
        "batch1_p50_us": round(pct(single, 0.5), 1), "batch1_p99_us": round(pct(single, 0.99), 1),
        "batch64_rows_per_s": round(64 * len(many) / (sum(many) / 1e6)),
        "batch64_p50_us": round(pct(many, 0.5), 1),
        "device": torch.cuda.get_device_name(0),
    }))


if __name__ == "__main__":
    main()
