"""Shared memory and the response cache (issue 15), measured in one run on this machine against
their references: a 4 MiB FP32 tensor through identity_fp32 with its input and output in system
shared memory (tritonclient.utils.shared_memory) against the same tensor carried in the request
and response bodies (HTTP binary extension, gRPC raw contents); and the `mlp` model answered from
the response cache (identical requests) against the same model computing each request (a copy
without the cache). Sequential requests from one client; p50 and p99 of the client's latency.
Output: a markdown report on stdout and in benches/results/extensions-<host>.md.
Usage: .venv/bin/python benches/extensions.py [--requests 300]   (needs scripts/setup.sh)
"""
import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from mesh_util import free_ports  # noqa: E402

N = 1 << 20  # FP32 elements: 4 MiB


def percentiles(samples):
    s = sorted(samples)
    return s[len(s) // 2] * 1e3, s[int(len(s) * 0.99) - 1] * 1e3


def timed(fn, n):
    for _ in range(10):
        fn()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return percentiles(out)


def timed_each(make, n):
    """Like `timed`, with a fresh request (built outside the timing) for every call."""
    for _ in range(10):
        make()()
    out = []
    for _ in range(n):
        call = make()
        t = time.perf_counter()
        call()
        out.append(time.perf_counter() - t)
    return percentiles(out)


def start_node(repo, log):
    http, grpc, metrics = free_ports(3)
    cmd = [str(ROOT / "target/release/mesh-node"), "--model-repository", str(repo), "--http-port", str(http),
           "--grpc-port", str(grpc), "--metrics-port", str(metrics), "--cache-config", "local,size=67108864"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    c = httpclient.InferenceServerClient(f"127.0.0.1:{http}")
    for _ in range(300):
        try:
            if c.is_server_ready():
                break
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.1)
    return proc, f"127.0.0.1:{http}", f"127.0.0.1:{grpc}"


def shared_memory_rows(http_url, grpc_url, n):
    x = np.random.default_rng(1).random((1, N), dtype=np.float32)
    size = x.nbytes
    key = f"/mesh_bench_{os.getpid()}"
    h_in = shm.create_shared_memory_region("bin", key + "_in", size)
    h_out = shm.create_shared_memory_region("bout", key + "_out", size)
    shm.set_shared_memory_region(h_in, [x])
    rows = []
    try:
        for proto, mod, url in (("HTTP", httpclient, http_url), ("gRPC", grpcclient, grpc_url)):
            c = mod.InferenceServerClient(url) if proto == "HTTP" else mod.InferenceServerClient(
                url, channel_args=[("grpc.max_receive_message_length", 64 << 20)])
            c.unregister_system_shared_memory()
            c.register_system_shared_memory("in", key + "_in", size)
            c.register_system_shared_memory("out", key + "_out", size)
            body_in = mod.InferInput("INPUT0", [1, N], "FP32")
            body_in.set_data_from_numpy(x)
            body_out = [mod.InferRequestedOutput("OUTPUT0", binary_data=True)] if proto == "HTTP" else None
            shm_in = mod.InferInput("INPUT0", [1, N], "FP32")
            shm_in.set_shared_memory("in", size)
            shm_out = mod.InferRequestedOutput("OUTPUT0")
            shm_out.set_shared_memory("out", size)

            def by_body():
                r = c.infer("identity_fp32", [body_in], outputs=body_out)
                assert r.as_numpy("OUTPUT0").shape == (1, N)

            def by_shm():
                c.infer("identity_fp32", [shm_in], outputs=[shm_out])

            ref = timed(by_body, n)
            got = timed(by_shm, n)
            assert np.array_equal(shm.get_contents_as_numpy(h_out, np.float32, [1, N]), x)
            rows.append((f"{proto}, 4 MiB in and out", ref, got))
            c.unregister_system_shared_memory()
            c.close()
    finally:
        shm.destroy_shared_memory_region(h_in)
        shm.destroy_shared_memory_region(h_out)
    return rows


def cache_rows(http_url, n):
    c = httpclient.InferenceServerClient(http_url)
    x = np.random.default_rng(2).random((1, 64), dtype=np.float32)
    i = httpclient.InferInput("x", [1, 64], "FP32")
    i.set_data_from_numpy(x)
    ref = timed(lambda: c.infer("mlp", [i]), n)
    got = timed(lambda: c.infer("mlp_cached", [i]), n)
    # Every request new: what a miss costs (hashing the inputs, storing the outputs) over no cache.
    fresh = iter(range(1 << 30))

    def one(model):
        j = httpclient.InferInput("x", [1, 64], "FP32")
        j.set_data_from_numpy(x + np.float32(next(fresh)))
        return lambda: c.infer(model, [j])
    miss_ref = timed_each(lambda: one("mlp"), n)
    miss = timed_each(lambda: one("mlp_cached"), n)
    same = c.infer("mlp", [i]).as_numpy("y").tobytes() == c.infer("mlp_cached", [i]).as_numpy("y").tobytes()
    stats = c.get_inference_statistics("mlp_cached")["model_stats"][0]["inference_stats"]
    c.close()
    assert same, "cached outputs differ from computed ones"
    return [("mlp, HTTP, identical requests (hits)", ref, got),
            ("mlp, HTTP, every request new (misses)", miss_ref, miss),
            (f"(cache totals: hits {stats['cache_hit']['count']}, misses {stats['cache_miss']['count']})",
             (1, 1), (1, 1))]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=300)
    n = p.parse_args().requests
    work = Path(tempfile.mkdtemp(prefix="mesh-bench-ext-"))
    subprocess.run([sys.executable, str(ROOT / "scripts/gen_models.py"), "--out", str(work / "gen")], check=True,
                   capture_output=True)
    repo = work / "repo"
    shutil.copytree(work / "gen/dtypes/identity_fp32", repo / "identity_fp32")
    shutil.copytree(work / "gen/simple/mlp", repo / "mlp")
    shutil.copytree(repo / "mlp", repo / "mlp_cached")
    cfg = repo / "mlp_cached/config.pbtxt"
    cfg.write_text(cfg.read_text().replace('name: "mlp"', 'name: "mlp_cached"') + "\nresponse_cache { enable: true }\n")
    with open(work / "node.log", "w") as log:
        proc, http_url, grpc_url = start_node(repo, log)
        try:
            shm_table = shared_memory_rows(http_url, grpc_url, n)
            cache_table = cache_rows(http_url, n)
        finally:
            proc.terminate()
            proc.wait(10)
    host = socket.gethostname()
    lines = [f"# Shared memory and response cache ({host}, {os.cpu_count()} vCPU, {n} sequential requests each)", ""]
    for title, ref_name, new_name, table in (
            ("Shared memory", "in the body", "in system shared memory", shm_table),
            ("Response cache", "computed (no cache)", "from the cache", cache_table)):
        lines += [f"## {title}", "", f"| case | {ref_name} p50 / p99 ms | {new_name} p50 / p99 ms | p50 ratio |",
                  "|---|---|---|---|"]
        for case, (r50, r99), (g50, g99) in table:
            if case.startswith("("):
                lines.append(f"| {case} | | | |")
                continue
            lines.append(f"| {case} | {r50:.3f} / {r99:.3f} | {g50:.3f} / {g99:.3f} | {g50 / r50:.2f}× |")
        lines.append("")
    report = "\n".join(lines)
    print(report)
    out = ROOT / "benches/results" / f"extensions-{'vm' if host.startswith(('plain', 'vm')) else host}.md"
    out.write_text(report + "\n")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
