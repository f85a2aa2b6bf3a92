import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            ms = int(pb_utils.get_input_tensor_by_name(r, "MS").as_numpy()[0])
            time.sleep(ms / 1000)
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x.copy())]))
        return out
