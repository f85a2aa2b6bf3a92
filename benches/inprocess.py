"""In-process inference (issue 43) in one run, on the README's MLP (batch 1, no dynamic batching) and
the Python add_sub: raw ONNX Runtime in this Python process, the mesh's `tritonserver` package, the
mesh's C API from a C program (benches/capi_latency.c; with --million, it and the package each show
their resident memory over a million calls), the same model over gRPC and HTTP (tritonclient, sync)
from mesh-node, and perf_analyzer's C API mode against the mesh's library and against Triton
2.51's own (the Python add_sub: the only backend Triton's PyPI build ships is Python's).

    .venv/bin/python benches/inprocess.py [--calls 20000] [--million]

Needs scripts/setup.sh (and ../shared/tools/peers.sh in .peers for Triton's library). Results go
to benches/results/inprocess-<date>.json and are printed as a table.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from mesh_util import free_ports, wait_live  # noqa: E402

LIB = ROOT / "target" / "release" / "libtritonserver.so"
PEERS = ROOT / ".peers"
PA = ROOT / ".venv-pytriton" / "bin" / "perf_analyzer"


def percentiles(samples_us):
    s = sorted(samples_us)
    return {"p50_us": round(s[len(s) // 2], 2), "p99_us": round(s[len(s) * 99 // 100], 2),
            "mean_us": round(statistics.fmean(s), 2), "calls": len(s)}


def timed(call, n):
    for _ in range(min(1000, n // 10)):
        call()
    out = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        call()
        out.append((time.perf_counter_ns() - t0) / 1000)
    return percentiles(out)


def repo(tmp):
    """The MLP without dynamic batching (so no queue delay is waited); the Python add_sub apart, as
    perf_analyzer's C API mode loads every model of its repository (Triton's has no ONNX backend)."""
    r = Path(tmp) / "repo"
    shutil.copytree(ROOT / "target" / "models" / "simple" / "mlp", r / "mlp")
    cfg = r / "mlp" / "config.pbtxt"
    cfg.write_text(re.sub(r"dynamic_batching\s*\{[^}]*\}", "", cfg.read_text()))
    shutil.copytree(ROOT / "tests" / "python_models" / "add_sub_py", Path(tmp) / "py" / "add_sub_py")
    return r


def raw_ort(r, n):
    import onnxruntime
    opts = onnxruntime.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = onnxruntime.InferenceSession(str(r / "mlp" / "1" / "model.onnx"), opts)
    x = numpy.random.rand(1, 64).astype(numpy.float32)
    return timed(lambda: sess.run(["y"], {"x": x}), n)


def rss_kib() -> int:
    """This process's resident memory."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def python_api(r, n, memory_calls=0):
    os.environ["MESH_TRITONSERVER_LIBRARY"] = str(LIB)
    import tritonserver
    server = tritonserver.Server(model_repository=str(r), model_control_mode=tritonserver.ModelControlMode.EXPLICIT,
                                 startup_models=["mlp"]).start(wait_until_ready=True)
    model = server.model("mlp")
    x = numpy.random.rand(1, 64).astype(numpy.float32)

    def call():
        for response in model.infer(inputs={"x": x}):
            numpy.from_dlpack(response.outputs["y"])

    try:
        result = timed(call, n)
        if memory_calls:
            import gc
            gc.collect()
            result["rss_kib_after_warmup"], objects = rss_kib(), len(gc.get_objects())
            for _ in range(memory_calls):
                call()
            gc.collect()
            result.update(rss_kib_end=rss_kib(), memory_calls=memory_calls,
                          python_objects_grown=len(gc.get_objects()) - objects)
        return result
    finally:
        server.stop()


def c_api(r, n, tmp):
    exe = Path(tmp) / "capi_latency"
    subprocess.run(["cc", "-O2", str(ROOT / "benches" / "capi_latency.c"), "-I",
                    str(ROOT / "crates" / "capi" / "include"), "-L", str(LIB.parent), "-ltritonserver",
                    f"-Wl,-rpath,{LIB.parent}", "-lpthread", "-o", str(exe)], check=True)
    out = subprocess.run([str(exe), str(r), "mlp", "x", "y", "64", str(n)], capture_output=True, text=True,
                         check=True, timeout=1800)
    return json.loads(out.stdout.strip().splitlines()[-1])


def network(r, n):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    http_port, grpc_port, metrics_port = free_ports(3)
    log = Path(tempfile.mkstemp(suffix=".log")[1])
    proc = subprocess.Popen([str(ROOT / "target" / "release" / "mesh-node"), "--model-repository", str(r),
                             "--model-control-mode", "explicit", "--load-model", "mlp",
                             "--http-port", str(http_port), "--grpc-port", str(grpc_port),
                             "--metrics-port", str(metrics_port)], stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        wait_live(proc, http_port, log, timeout=60, path="/v2/models/mlp/ready")
        x = numpy.random.rand(1, 64).astype(numpy.float32)
        g = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        gi = grpcclient.InferInput("x", [1, 64], "FP32")
        gi.set_data_from_numpy(x)
        h = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
        hi = httpclient.InferInput("x", [1, 64], "FP32")
        hi.set_data_from_numpy(x, binary_data=True)
        return (timed(lambda: g.infer("mlp", [gi]).as_numpy("y"), n),
                timed(lambda: h.infer("mlp", [hi]).as_numpy("y"), n))
    finally:
        proc.terminate()
        proc.wait(30)


def perf_analyzer(lib, r, backends, env):
    """perf_analyzer --service-kind=triton_c_api on add_sub_py with `lib` as DIR/lib/libtritonserver.so."""
    d = Path(tempfile.mkdtemp())
    (d / "lib").mkdir()
    (d / "lib" / "libtritonserver.so").symlink_to(lib)
    if backends:
        shutil.copytree(backends, d / "backends" / "python")
    res = subprocess.run([str(PA), "-m", "add_sub_py", "--service-kind=triton_c_api", f"--triton-server-directory={d}",
                          f"--model-repository={r}", "--measurement-interval", "3000", "--concurrency-range", "1",
                          "--stability-percentage", "50"], capture_output=True, text=True, env=env, timeout=600)
    p50 = re.search(r"p50 latency: (\d+) usec", res.stdout)
    rate = re.search(r"Throughput: ([\d.]+) infer/sec", res.stdout)
    if res.returncode != 0 or not p50:
        return {"error": (res.stdout + res.stderr)[-400:]}
    return {"p50_us": int(p50.group(1)), "infer_per_s": float(rate.group(1))}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--million", action="store_true",
                    help="the C API and the Python package also make 1 000 000 calls each (memory growth)")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    r = repo(tmp)
    rows = {"raw ONNX Runtime (Python, 1 thread)": raw_ort(r, a.calls),
            "mesh tritonserver package (Python)": python_api(r, a.calls, 1_000_000 if a.million else 0),
            "mesh C API (C program)": c_api(r, 1_000_000 if a.million else a.calls * 5, tmp)}
    rows["mesh-node gRPC (tritonclient)"], rows["mesh-node HTTP (tritonclient)"] = network(r, a.calls // 4)
    env = dict(os.environ, PATH=f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}")
    py = Path(tmp) / "py"
    rows["perf_analyzer C API, add_sub_py: mesh"] = perf_analyzer(LIB, py, None, env)
    tlib = next((PEERS / "venv-triton").glob("lib/python3*/site-packages/nvidia_pytriton.libs/libtritonserver-*.so"), None)
    if tlib and (PEERS / "triton" / "backends" / "python").is_dir():
        libpy = subprocess.run([str(PEERS / "venv-triton" / "bin" / "python"), "-c",
                                "import sysconfig;print(sysconfig.get_config_var('LIBDIR'))"],
                               capture_output=True, text=True).stdout.strip()
        tenv = dict(os.environ, CUDA_VISIBLE_DEVICES="", PATH=f"{PEERS / 'venv-triton' / 'bin'}:{os.environ['PATH']}",
                    LD_LIBRARY_PATH=f"{tlib.parent}:{libpy}")
        rows["perf_analyzer C API, add_sub_py: Triton 2.51"] = perf_analyzer(tlib, py, PEERS / "triton" / "backends" / "python",
                                                                     tenv)
    else:
        rows["perf_analyzer C API, add_sub_py: Triton 2.51"] = {"error": "no .peers (run ../shared/tools/peers.sh)"}
    out = ROOT / "benches" / "results" / f"inprocess-{time.strftime('%Y%m%d-%H%M')}.json"
    out.write_text(json.dumps(rows, indent=1))
    print(f"{'path':48} {'p50 µs':>9} {'p99 µs':>9}")
    for k, v in rows.items():
        print(f"{k:48} {v.get('p50_us', '-')!s:>9} {v.get('p99_us', '-')!s:>9}  {v.get('error', '')[:120]}")
    c = rows["mesh C API (C program)"]
    print(f"C API resident memory: {c['rss_kib_after_warmup']} KiB after warm-up, {c['rss_kib_end']} KiB after "
          f"{c['iterations']} calls; heap in use {c['heap_bytes_in_use_after_warmup']} then "
          f"{c['heap_bytes_in_use_end']} bytes")
    p = rows["mesh tritonserver package (Python)"]
    if "rss_kib_end" in p:
        print(f"Python package resident memory: {p['rss_kib_after_warmup']} KiB after warm-up, {p['rss_kib_end']} KiB "
              f"after {p['memory_calls']} more calls; Python objects grown by {p['python_objects_grown']}")
    print(f"results: {out}")


if __name__ == "__main__":
    main()
