"""A model without dynamic batching that, like many, reads only requests[0]: it doubles IN, reports
how many requests its execute() saw, and fails a negative input. Slow enough that requests queue."""
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.02)
        x = pb_utils.get_input_tensor_by_name(requests[0], "IN").as_numpy()
        if x[0] < 0:
            raise ValueError(f"negative input {x[0]}")
        seen = np.array([len(requests)], np.int32)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * 2), pb_utils.Tensor("SEEN", seen)])]
