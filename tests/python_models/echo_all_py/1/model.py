import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        # One input and output per type of pb_utils' public table (TYPE_BOOL ... TYPE_STRING).
        assert pb_utils.TRITON_STRING_TO_NUMPY["TYPE_STRING"] is np.object_
        for t in pb_utils.TRITON_STRING_TO_NUMPY:
            name = t[len("TYPE_"):].lower()
            config.add_input({"name": f"{name}_input", "data_type": t, "dims": [-1, -1], "optional": True})
            config.add_output({"name": f"{name}_output", "data_type": t, "dims": [-1, -1]})
        config.add_output({"name": "output_parameters", "data_type": "TYPE_STRING", "dims": [1]})
        config.set_max_batch_size(0)
        if config.as_dict()["parameters"]["decoupled"]["string_value"] == "True":
            config.set_model_transaction_policy({"decoupled": True})
        return config

    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.decoupled = config.get("model_transaction_policy", {}).get("decoupled", False)

    def answer(self, request):
        outputs = [pb_utils.Tensor(t.name().replace("input", "output"), t.as_numpy()) for t in request.inputs()]
        params = np.array([request.parameters().encode()], dtype=np.object_)
        outputs.append(pb_utils.Tensor("output_parameters", params))
        return pb_utils.InferenceResponse(output_tensors=outputs)

    def execute(self, requests):
        if not self.decoupled:
            return [self.answer(r) for r in requests]
        for r in requests:
            sender = r.get_response_sender()
            sender.send(self.answer(r))
            sender.send(self.answer(r))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
