"""Counts the requests it serves and saves the count in finalize(), after FINALIZE_SECONDS: what a
model persisting a cache or counters at shutdown does (tests/test_finalize.py)."""
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.save_to = params["SAVE_TO"]["string_value"]
        self.seconds = float(params["FINALIZE_SECONDS"]["string_value"])
        self.served = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            self.served += 1
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value.astype(np.int32))]))
        return responses

    def finalize(self):
        pb_utils.Logger.log_info(f"finalize_saves: saving in {self.seconds} s")
        time.sleep(self.seconds)
        if not self.save_to:
            return
        partial = self.save_to + ".partial"
        with open(partial, "w") as f:
            json.dump({"served": self.served}, f)
        os.replace(partial, self.save_to)
        pb_utils.Logger.log_info(f"finalize_saves: saved {self.served}")
        print("Cleaning up...")  # not flushed: stdout is a pipe, and the line must still reach the log
