import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)

    async def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN")
            params = json.loads(request.parameters())
            inner = {"error_at": params["error_at"]} if "error_at" in params else {}
            call = pb_utils.InferenceRequest(model_name="repeat_py", requested_output_names=["OUT"],
                                             inputs=[values], parameters={"mode": "thread", **inner})
            if params.get("mode") == "async":
                stream = await call.async_exec(decoupled=True)
                first = next(stream, None)  # an iterator, as Triton's (next() on a list fails)
                answers = ([first] if first is not None else []) + list(stream)
            else:
                answers = list(call.exec(decoupled=True))
            # The bare final flag of repeat_py is the last answer, with no outputs (as Triton's).
            if not answers or answers[-1].has_error() or answers[-1].output_tensors():
                raise pb_utils.TritonModelException("the last answer is not the empty final response")
            errors = [a.error().message() for a in answers if a.has_error()]
            if errors:
                response = pb_utils.InferenceResponse(error=pb_utils.TritonError("; ".join(errors)))
            else:
                outs = [int(pb_utils.get_output_tensor_by_name(a, "OUT").as_numpy()[0]) for a in answers[:-1]]
                response = pb_utils.InferenceResponse([pb_utils.Tensor("SUM", np.array([sum(outs)], np.int32)),
                                                       pb_utils.Tensor("ANSWERS", np.array([len(outs)], np.int32))])
            if self.decoupled:
                sender = request.get_response_sender()
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                responses.append(response)
        return None if self.decoupled else responses
