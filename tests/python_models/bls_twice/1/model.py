import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            first = pb_utils.InferenceRequest(
                model_name="add_sub", requested_output_names=["OUTPUT0"], inputs=[a, b]).exec()
            if first.has_error():
                raise pb_utils.TritonModelException(first.error().message())
            total = pb_utils.get_output_tensor_by_name(first, "OUTPUT0").as_numpy()
            second = pb_utils.InferenceRequest(
                model_name="add_sub", requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.Tensor("INPUT0", total), pb_utils.Tensor("INPUT1", b.as_numpy())]).exec()
            if second.has_error():
                responses.append(pb_utils.InferenceResponse(error=second.error()))
                continue
            out = pb_utils.get_output_tensor_by_name(second, "OUTPUT0")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", out.as_numpy())]))
        return responses
