import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            inputs = [pb_utils.get_input_tensor_by_name(r, n) for n in ("INPUT0", "INPUT1")]
            inner = pb_utils.InferenceRequest(model_name="bls_outer", requested_output_names=["OUTPUT0"],
                                              inputs=inputs).exec()
            if inner.has_error():
                raise pb_utils.TritonModelException(inner.error().message())
            out.append(pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(inner, "OUTPUT0")]))
        return out
