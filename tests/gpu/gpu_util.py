"""Helpers of the GPU suite: whether the machine has a GPU, NVML's memory readings, plain HTTP
requests, and the models it serves, written from onnx and torch (nothing downloaded)."""
from __future__ import annotations

import ctypes
import json
from pathlib import Path

import numpy as np
from mesh_util import infer_path, json_input


def _gpu_reason() -> str | None:
    """None when the CUDA driver sees a device, else why not (the one reason every test skips with)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no GPU: the CUDA driver (libcuda.so.1) is not on this machine"
    if cuda.cuInit(0) != 0:
        return "no GPU: the CUDA driver sees no device"
    count = ctypes.c_int()
    if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        return "no GPU: the CUDA driver sees no device"
    return None


NO_GPU = _gpu_reason()


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class Nvml:
    """NVML's memory reading of GPU 0 (libnvidia-ml, which the driver installs)."""

    def __init__(self):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        assert self.lib.nvmlInit_v2() == 0
        self.device = ctypes.c_void_p()
        assert self.lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self.device)) == 0

    def memory(self) -> _Memory:
        m = _Memory()
        assert self.lib.nvmlDeviceGetMemoryInfo(self.device, ctypes.byref(m)) == 0
        return m

    def used(self) -> int:
        return self.memory().used

    def total(self) -> int:
        return self.memory().total


def python_args() -> list[str]:
    import sys
    return ["--backend-config", f"python,interpreter={sys.executable}"]


def onnx_add_sub(directory: Path, kind: str) -> None:
    """scripts/gen_models.py's add_sub (OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, FP32
    [16], max_batch_size 8) on instances of `kind`."""
    from gen_models import _add_sub_config
    from model_parts import add_sub_onnx
    (directory / "1").mkdir(parents=True)
    (directory / "1" / "model.onnx").write_bytes(add_sub_onnx())
    (directory / "config.pbtxt").write_text(_add_sub_config(
        directory.name, f"add_sub on {kind} instances (tests/gpu)",
        extra_top=f"instance_group [ {{ kind: {kind} count: 1 }} ]\n"))


def python_gpu_model(directory: Path, hold_bytes: int) -> None:
    """A KIND_GPU Python model that holds `hold_bytes` of GPU memory from initialize() (torch, on the
    instance's device) and answers Y = X + 1 there."""
    (directory / "1").mkdir(parents=True)
    (directory / "config.pbtxt").write_text(
        f'name: "{directory.name}"\nbackend: "python"\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'instance_group [ { kind: KIND_GPU count: 1 } ]\n')
    (directory / "1" / "model.py").write_text(f'''import torch
import torch.utils.dlpack
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.device = torch.device("cuda", int(args["model_instance_device_id"]))
        self.held = torch.empty({hold_bytes}, dtype=torch.uint8, device=self.device)

    def execute(self, requests):
        out = []
        for r in requests:
            x = torch.from_numpy(pb_utils.get_input_tensor_by_name(r, "X").as_numpy()).to(self.device)
            y = torch.utils.dlpack.to_dlpack(x + 1)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack("Y", y)]))
        return out
''')


def torchscript_mlp(directory: Path) -> None:
    """A TorchScript MLP (256 -> 1024 -> 256, fixed seed) on KIND_GPU with dynamic batching."""
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)).eval()
    (directory / "1").mkdir(parents=True)
    torch.jit.script(model).save(str(directory / "1" / "model.pt"))
    (directory / "config.pbtxt").write_text(
        f'name: "{directory.name}"\nbackend: "pytorch"\nmax_batch_size: 64\n'
        'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 256 ] } ]\n'
        'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 256 ] } ]\n'
        'instance_group [ { kind: KIND_GPU count: 1 } ]\n'
        'dynamic_batching { max_queue_delay_microseconds: 200 }\n')


def infer_json(server, model: str, inputs: dict[str, np.ndarray], parameters=None):
    """One request over plain HTTP/JSON (no client library needed)."""
    body = {"inputs": [json_input(k, v, "FP32") for k, v in inputs.items()]}
    if parameters:
        body["parameters"] = parameters
    return server.post(infer_path(model), json.dumps(body).encode(), headers={"Content-Type": "application/json"})
