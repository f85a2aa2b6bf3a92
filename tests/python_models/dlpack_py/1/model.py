import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """DLPack round trips: an input exported as a capsule and read back (zero-copy), and an output
    built from any object with __dlpack__."""

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            assert x.is_cpu()
            same = pb_utils.Tensor.from_dlpack("SAME", x.to_dlpack())
            shared = np.shares_memory(same.as_numpy(), x.as_numpy())
            doubled = pb_utils.Tensor.from_dlpack("DOUBLED", np.asarray(x.as_numpy()) * 2)
            responses.append(pb_utils.InferenceResponse(
                [same, doubled, pb_utils.Tensor("SHARED", np.array([shared]))]))
        return responses
