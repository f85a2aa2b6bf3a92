#!/usr/bin/env python3
"""The models of benches/gpu.sh, written from torch and onnx (nothing downloaded): one MLP
(256 -> 1024 -> 256, fixed seed) as TorchScript and as ONNX on KIND_GPU, each without and with
dynamic batching; the same MLP in a Python model on KIND_GPU (torch, answering through DLPack,
Triton's usual way), and Triton's add_sub Python example on the CPU (the server's own round trip).

    gpu_models.py <out dir>     writes <out>/mlp.pt and the repository <out>/repo"""
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

ADD_SUB = Path(__file__).resolve().parent.parent / "tests" / "python_models" / "add_sub_py"
WIDTH, HIDDEN = 256, 1024
IO = (f'input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]\n'
      f'output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]\n')
GPU = 'instance_group [ { kind: KIND_GPU count: 1 } ]\n'
BATCHING = 'dynamic_batching { max_queue_delay_microseconds: 100 }\n'

MLP_PY = '''import torch
import torch.utils.dlpack
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.device = torch.device("cuda", int(args["model_instance_device_id"]))
        self.model = torch.jit.load(args["model_repository"] + "/mlp.pt", map_location=self.device).eval()

    def execute(self, requests):
        out = []
        with torch.no_grad():
            for r in requests:
                x = torch.from_numpy(pb_utils.get_input_tensor_by_name(r, "INPUT__0").as_numpy()).to(self.device)
                y = self.model(x)
                out.append(pb_utils.InferenceResponse(
                    [pb_utils.Tensor.from_dlpack("OUTPUT__0", torch.utils.dlpack.to_dlpack(y))]))
        return out
'''

def config(name, backend, extra=""):
    return f'name: "{name}"\nbackend: "{backend}"\nmax_batch_size: 64\n{IO}{extra}'


def onnx_mlp(model):
    w1, b1 = model[0].weight.detach().numpy(), model[0].bias.detach().numpy()
    w2, b2 = model[2].weight.detach().numpy(), model[2].bias.detach().numpy()
    inits = [numpy_helper.from_array(np.ascontiguousarray(a.T if a.ndim == 2 else a), n)
             for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"))]
    nodes = [helper.make_node("MatMul", ["INPUT__0", "w1"], ["h0"]), helper.make_node("Add", ["h0", "b1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h2"]), helper.make_node("MatMul", ["h2", "w2"], ["h3"]),
             helper.make_node("Add", ["h3", "b2"], ["OUTPUT__0"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("INPUT__0", TensorProto.FLOAT, [None, WIDTH])],
                              [helper.make_tensor_value_info("OUTPUT__0", TensorProto.FLOAT, [None, WIDTH])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def main():
    out = Path(sys.argv[1])
    repo = out / "repo"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, WIDTH)).eval()
    out.mkdir(parents=True, exist_ok=True)
    torch.jit.script(model).save(str(out / "mlp.pt"))
    proto = onnx_mlp(model)
    for name, backend, extra in (("mlp_gpu", "pytorch", GPU), ("mlp_gpu_batched", "pytorch", GPU + BATCHING),
                                 ("mlp_onnx", "onnxruntime", GPU), ("mlp_onnx_batched", "onnxruntime", GPU + BATCHING),
                                 ("mlp_py", "python", GPU)):
        (repo / name / "1").mkdir(parents=True, exist_ok=True)
        (repo / name / "config.pbtxt").write_text(config(name, backend, extra))
        if backend == "pytorch":
            (repo / name / "1" / "model.pt").write_bytes((out / "mlp.pt").read_bytes())
        elif backend == "onnxruntime":
            onnx.save(proto, str(repo / name / "1" / "model.onnx"))
        else:
            (repo / name / "mlp.pt").write_bytes((out / "mlp.pt").read_bytes())
            (repo / name / "1" / "model.py").write_text(MLP_PY)
    # Triton's add_sub example, as the Python tests serve it.
    shutil.copytree(ADD_SUB, repo / "add_sub_py", dirs_exist_ok=True)

if __name__ == "__main__":
    main()
