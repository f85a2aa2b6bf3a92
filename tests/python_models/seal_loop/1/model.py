import json

import numpy as np
import triton_python_backend_utils as pb_utils

END = 0


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.max_steps = int(config["parameters"]["MAX_STEPS"]["string_value"])

    def call(self, model, inputs, outputs):
        response = pb_utils.InferenceRequest(model_name=model, requested_output_names=outputs, inputs=inputs).exec()
        if response.has_error():
            raise pb_utils.TritonModelException(f"{model}: {response.error().message()}")
        return [pb_utils.get_output_tensor_by_name(response, name).as_numpy() for name in outputs]

    def execute(self, requests):
        responses = []
        for request in requests:
            image = pb_utils.get_input_tensor_by_name(request, "IMAGE")
            (memory,) = self.call("seal_encoder", [pb_utils.Tensor("pixels", image.as_numpy())], ["memory"])
            token = np.array([[1]], dtype=np.int64)  # start token
            tokens, steps = [], 0
            while steps < self.max_steps:
                (token,) = self.call("seal_decoder", [pb_utils.Tensor("memory", memory),
                                                     pb_utils.Tensor("token", token)], ["next_token"])
                steps += 1
                if int(token[0, 0]) == END:
                    break
                tokens.append(int(token[0, 0]))
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("TOKENS", np.array(tokens, dtype=np.int64)),
                pb_utils.Tensor("STEPS", np.array([steps], dtype=np.int32)),
            ]))
        return responses
