import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            sum_call = pb_utils.InferenceRequest(model_name="add_sub", requested_output_names=["OUTPUT0"], inputs=[a, b])
            diff_call = pb_utils.InferenceRequest(model_name="add_sub", requested_output_names=["OUTPUT1"], inputs=[a, b])
            missing = pb_utils.InferenceRequest(model_name="no_such_model", requested_output_names=[], inputs=[a])
            s, d, m = await asyncio.gather(sum_call.async_exec(), diff_call.async_exec(), missing.async_exec())
            message = m.error().message() if m.has_error() else "no error"
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("SUM", pb_utils.get_output_tensor_by_name(s, "OUTPUT0").as_numpy()),
                pb_utils.Tensor("DIFF", pb_utils.get_output_tensor_by_name(d, "OUTPUT1").as_numpy()),
                pb_utils.Tensor("MISSING_ERROR", np.array([[message.encode()]] * a.as_numpy().shape[0], dtype=np.object_)),
            ]))
        return responses
