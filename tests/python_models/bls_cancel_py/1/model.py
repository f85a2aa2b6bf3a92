import json

import numpy as np
import triton_python_backend_utils as pb_utils


def cancel_after_three(stream):
    """Three ticks, cancel(), then the rest: (ticks, answers after cancel, last error code or -1)."""
    ticks = [next(stream) for _ in range(3)]
    assert all(not t.has_error() for t in ticks)
    stream.cancel()
    rest = list(stream)
    code = rest[-1].error().code() if rest and rest[-1].has_error() else -1
    return len(ticks), len(rest), code


class TritonPythonModel:
    def _call(self, request):
        params = json.loads(request.parameters())
        period = pb_utils.get_input_tensor_by_name(request, "PERIOD_MS")
        call = pb_utils.InferenceRequest(model_name="ticker_py", requested_output_names=["TICK"],
                                         inputs=[period], parameters={"marker": params["marker"]})
        return params.get("mode"), call

    @staticmethod
    def _response(ticks, after, code):
        return pb_utils.InferenceResponse([pb_utils.Tensor("TICKS", np.array([ticks], np.int32)),
                                           pb_utils.Tensor("AFTER", np.array([after], np.int32)),
                                           pb_utils.Tensor("CODE", np.array([code], np.int32))])

    async def execute(self, requests):
        out = []
        for request in requests:
            mode, call = self._call(request)
            stream = await call.async_exec(decoupled=True) if mode == "async" else call.exec(decoupled=True)
            out.append(self._response(*cancel_after_three(stream)))
        return out
