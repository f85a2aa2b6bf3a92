import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        assert auto_complete_model_config.as_dict()["name"] == "auto_cfg"
        auto_complete_model_config.add_input({"name": "IN", "data_type": "TYPE_INT32", "dims": [3]})
        auto_complete_model_config.add_input({"name": "BIAS", "data_type": "TYPE_INT32", "dims": [3], "optional": True})
        auto_complete_model_config.add_output({"name": "OUT", "data_type": "TYPE_INT32", "dims": [3]})
        auto_complete_model_config.set_max_batch_size(8)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            bias = pb_utils.get_input_tensor_by_name(request, "BIAS")
            y = x * 10 + (bias.as_numpy() if bias is not None else 0)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", y.astype(np.int32))]))
        return responses
