import argparse
import json
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

from . import helper


class TritonPythonModel:
    def initialize(self, args):
        # A model that parses its own command line must find nothing of the node's there.
        argparse.ArgumentParser().parse_args()
        self.instance = args["model_instance_name"]

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", helper.double(x)),
                pb_utils.Tensor("ARGV", np.array([json.dumps(sys.argv).encode()], dtype=np.object_)),
                pb_utils.Tensor("INSTANCE", np.array([self.instance.encode()], dtype=np.object_)),
            ]))
        return out
