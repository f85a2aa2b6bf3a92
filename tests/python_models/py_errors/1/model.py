import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            v = float(x[0])
            if v == 13:
                raise ValueError("thirteen is unlucky")
            if v == 99:
                os._exit(3)
            if v == 77:
                time.sleep(3600)
            if v < 0:
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("negative input", pb_utils.TritonError.INVALID_ARG)))
                continue
            pb_utils.Logger.log_info(f"py_errors served {v}")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 2)]))
        return responses
