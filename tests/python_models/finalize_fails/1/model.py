import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
                for r in requests]

    def finalize(self):
        pb_utils.Logger.log_info("finalize_fails is finalizing")
        raise RuntimeError("finalize_fails cannot let go")
