"""Helpers for benches/python.sh: the BLS round-trip probe model, its client, and the stubs' memory.

  write REPO [--onnx]        adds bls_probe (and, with --onnx, add_sub_onnx: the same sum in ONNX)
  probe HTTP_PORT SERVER T.. times 300 blocking BLS exec() calls from inside bls_probe to each target
  rss SERVER PID             resident memory of the Python stub processes under PID (RSS, PSS, private)
"""
import sys
from pathlib import Path

PROBE = '''import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Times blocking BLS calls from inside execute(): p50 and mean per call, in microseconds."""

    def execute(self, requests):
        out = []
        for r in requests:
            params = json.loads(r.parameters())
            target, calls = params.get("target", "add_sub"), int(params.get("calls", 300))
            a = pb_utils.Tensor("INPUT0", np.ones(4, np.float32))
            b = pb_utils.Tensor("INPUT1", np.ones(4, np.float32))
            times = []
            for _ in range(calls):
                t = time.perf_counter()
                resp = pb_utils.InferenceRequest(model_name=target, requested_output_names=["OUTPUT0"],
                                                 inputs=[a, b]).exec()
                times.append(time.perf_counter() - t)
                if resp.has_error():
                    raise pb_utils.TritonModelException(resp.error().message())
            times.sort()
            stats = np.array([times[len(times) // 2], sum(times) / len(times)], np.float64) * 1e6
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("US", stats)]))
        return out
'''

PROBE_CONFIG = '''name: "bls_probe"
backend: "python"
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "US" data_type: TYPE_FP64 dims: [ 2 ] } ]
instance_group [ { kind: KIND_CPU } ]
'''


def write(repo: Path, onnx_too: bool):
    (repo / "bls_probe" / "1").mkdir(parents=True, exist_ok=True)
    (repo / "bls_probe" / "1" / "model.py").write_text(PROBE)
    (repo / "bls_probe" / "config.pbtxt").write_text(PROBE_CONFIG)
    if onnx_too:
        import onnx
        from onnx import TensorProto, helper
        io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in ("INPUT0", "INPUT1")]
        graph = helper.make_graph([helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"])], "add", io,
                                  [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [4])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        (repo / "add_sub_onnx" / "1").mkdir(parents=True, exist_ok=True)
        onnx.save(model, str(repo / "add_sub_onnx" / "1" / "model.onnx"))
        (repo / "add_sub_onnx" / "config.pbtxt").write_text('name: "add_sub_onnx"\nbackend: "onnxruntime"\n')


def probe(port: str, server: str, targets):
    import numpy as np
    import tritonclient.http as httpclient
    client = httpclient.InferenceServerClient(f"localhost:{port}", network_timeout=300)
    n = httpclient.InferInput("N", [1], "INT32")
    n.set_data_from_numpy(np.array([0], np.int32))
    for target in targets:
        client.infer("bls_probe", [n], parameters={"target": target, "calls": 50})  # warm-up
        p50, mean = client.infer("bls_probe", [n], parameters={"target": target, "calls": 300}).as_numpy("US")
        print(f"| {server} | {target} | {p50:.0f} | {mean:.0f} |")


def rss(server: str, pid: str):
    def children(p):
        kids = []
        for task in Path(f"/proc/{p}/task").iterdir():
            try:
                kids += (task / "children").read_text().split()
            except OSError:
                pass
        return kids + [g for k in kids for g in children(k)]

    sizes = []
    for child in children(pid):
        try:
            cmd = Path(f"/proc/{child}/cmdline").read_bytes()
            status = Path(f"/proc/{child}/status").read_text()
        except OSError:
            continue
        if b"mesh_stub" in cmd or b"triton_python_backend_stub" in cmd:
            kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
            sizes.append((kb / 1024, *pss_and_private(child)))
    if sizes:
        mean = [sum(s[i] for s in sizes) / len(sizes) for i in range(3)]
        print(f"| {server} | {len(sizes)} | {max(s[0] for s in sizes):.1f} | {mean[0]:.1f} | {mean[1]:.1f} | {mean[2]:.1f} |")


def pss_and_private(pid: str) -> tuple[float, float]:
    """A process's proportional set size and its private pages (what one more instance costs), in MB."""
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:])
    except OSError:
        return (float("nan"), float("nan"))
    kb = lambda name: int(fields.get(name, "0 kB").split()[0])
    return (kb("Pss") / 1024, (kb("Private_Clean") + kb("Private_Dirty")) / 1024)


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "write":
        write(Path(args[0]), "--onnx" in args)
    elif cmd == "probe":
        probe(args[0], args[1], args[2:])
    elif cmd == "rss":
        rss(args[0], args[1])
    else:
        sys.exit(__doc__)
