"""GPU tensors the way Triton's Python models use them. Modes (request parameter "mode"):
- "bls": X goes through a BLS call to add_sub (preferred memory on GPU 0); Y is its OUTPUT0 and
  ON_GPU says where that output came back (CPU where the stub has no CUDA driver);
- "fake": answers with a DLPack capsule that says it is on GPU 0 but points at no memory (the
  stub's copy out must fail with a clear error, and the instance must keep serving);
- "torch": Y = 2 * X computed with torch on GPU 0 and returned as Triton's models do,
  pb_utils.Tensor.from_dlpack of torch.utils.dlpack.to_dlpack(y); ON_GPU is [is_cpu() is False,
  as_numpy() raised Triton's message, the object form (from_dlpack(y)) agreed, to_dlpack went back
  to torch without a copy];
- "cupy": Y = X + 1 computed with cupy and returned through its __dlpack__;
- "as_gpu" and "object" (for tests/test_gpu_tensors.py's stand-in CUDA driver, whose "device"
  memory is host memory): Y = 3 * X answered as a capsule that says GPU 0 over the array's own
  memory, given as a capsule or by an object with __dlpack__."""
import json

import numpy as np
import triton_python_backend_utils as pb_utils


def fake_gpu_capsule(n):
    """A CUDA DLPack capsule over no real memory (its data pointer is 0x1000)."""
    import mesh_stub_cuda as cuda
    data = cuda.GpuData(0x1000, 0, 4 * n, [n], "FP32", None)
    return cuda.make_capsule(data, None)


class TritonPythonModel:
    def execute(self, requests):
        return [self.one(r) for r in requests]

    def one(self, request):
        mode = json.loads(request.parameters()).get("mode", "")
        x = pb_utils.get_input_tensor_by_name(request, "X")
        assert x.is_cpu()  # inputs come over HTTP: in CPU memory, as in Triton even with FORCE_CPU_ONLY "no"
        if mode == "bls":
            a = pb_utils.Tensor("INPUT0", np.tile(x.as_numpy()[:1], 16).reshape(1, 16).astype(np.float32))
            b = pb_utils.Tensor("INPUT1", np.ones((1, 16), np.float32))
            answer = pb_utils.InferenceRequest(
                model_name="add_sub", inputs=[a, b], requested_output_names=["OUTPUT0"],
                preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU, 0)).exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            out = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0")
            return pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack("Y", out.to_dlpack()),
                                               pb_utils.Tensor("ON_GPU", np.array([not out.is_cpu()]))])
        if mode == "fake":
            return pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack("Y", fake_gpu_capsule(4))])
        if mode == "torch":
            import torch
            import torch.utils.dlpack
            y = torch.from_numpy(x.as_numpy().copy()).to("cuda:0") * 2
            out = pb_utils.Tensor.from_dlpack("Y", torch.utils.dlpack.to_dlpack(y))
            try:
                out.as_numpy()
                refused = False
            except pb_utils.TritonModelException as e:
                refused = str(e) == "Tensor is stored in GPU and cannot be converted to NumPy."
            again = pb_utils.Tensor.from_dlpack("Y2", y)
            back = torch.utils.dlpack.from_dlpack(out.to_dlpack())
            same = back.data_ptr() == y.data_ptr() and again._gpu.pointer == y.data_ptr()
            checks = [not out.is_cpu(), refused, not again.is_cpu(), same]
            return pb_utils.InferenceResponse([out, pb_utils.Tensor("ON_GPU", np.array(checks))])
        if mode in ("as_gpu", "object"):
            import mesh_stub_cuda as cuda
            y = np.ascontiguousarray(x.as_numpy() * 3)
            data = cuda.GpuData(y.ctypes.data, 0, y.nbytes, y.shape, "FP32", y)

            class OnGpu:
                def __dlpack_device__(self):
                    return (cuda.KDL_CUDA, 0)

                def __dlpack__(self, stream=None):
                    return cuda.make_capsule(data, y)
            source = cuda.make_capsule(data, y) if mode == "as_gpu" else OnGpu()
            return pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack("Y", source)])
        if mode == "cupy":
            import cupy
            y = cupy.asarray(x.as_numpy()) + 1
            return pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack("Y", y),
                                               pb_utils.Tensor("ON_GPU", np.array([True]))])
        raise pb_utils.TritonModelException(f"unknown mode {mode!r}")
