"""A model without dynamic batching that, like many, reads only requests[0]: it doubles IN, reports
how many requests its execute() saw, and fails a negative input. Slow enough that requests queue;
an input of 1000 or more waits until the file gate<IN> appears in its model directory."""
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.dir = args["model_repository"]

    def execute(self, requests):
        x = pb_utils.get_input_tensor_by_name(requests[0], "IN").as_numpy()
        if x[0] >= 1000:
            gate = os.path.join(self.dir, f"gate{int(x[0])}")
            end = time.time() + 30
            while not os.path.exists(gate) and time.time() < end:
                time.sleep(0.01)
        else:
            time.sleep(0.02)
        if x[0] < 0:
            raise ValueError(f"negative input {x[0]}")
        seen = np.array([len(requests)], np.int32)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * 2), pb_utils.Tensor("SEEN", seen)])]
