import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        self.args = args
        out0 = pb_utils.get_output_config_by_name(self.model_config, "OUTPUT0")
        self.out0_dtype = pb_utils.triton_string_to_numpy(out0["data_type"])
        out1 = pb_utils.get_output_config_by_name(self.model_config, "OUTPUT1")
        self.out1_dtype = pb_utils.triton_string_to_numpy(out1["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            out0 = pb_utils.Tensor("OUTPUT0", (in0 + in1).astype(self.out0_dtype))
            out1 = pb_utils.Tensor("OUTPUT1", (in0 - in1).astype(self.out1_dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out0, out1]))
        return responses

    def finalize(self):
        path = self.args["model_repository"] + "/finalized.txt"
        with open(path, "a") as f:
            f.write(self.args["model_instance_name"] + "\n")
