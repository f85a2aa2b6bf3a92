import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def _one(self, request):
        call = pb_utils.InferenceRequest(model_name="async_py", requested_output_names=["SEEN"],
                                         inputs=[pb_utils.get_input_tensor_by_name(request, n) for n in ("GATHER", "FAIL")])
        sender = request.get_response_sender()
        for answer in await call.async_exec(decoupled=True):  # next() blocks: the first is already in
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            if answer.output_tensors():
                sender.send(pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(answer, "SEEN")]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    async def execute(self, requests):
        await asyncio.gather(*(self._one(r) for r in requests))
        return None
