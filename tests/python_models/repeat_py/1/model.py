import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            params = json.loads(request.parameters())
            if params.get("mode") == "raise":
                raise pb_utils.TritonModelException("asked to fail")
            # inputs are views valid while execute() runs: a thread keeps a copy
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().copy()
            sender = request.get_response_sender()
            if params.get("mode") == "thread":
                threading.Thread(target=self.answer, args=(sender, values, params), daemon=True).start()
            else:
                self.answer(sender, values, params)
        return None

    def answer(self, sender, values, params):
        for i, v in enumerate(values):
            time.sleep(params.get("delay_ms", 0) / 1000)
            if params.get("error_at") == i:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"no answer for element {i}")))
                continue
            out = int(v)
            if params.get("bls"):  # through add_sub_py: (v, v, v, v) + (1, 1, 1, 1) - 1
                inputs = [pb_utils.Tensor("INPUT0", np.full(4, v, np.float32)),
                          pb_utils.Tensor("INPUT1", np.ones(4, np.float32))]
                r = pb_utils.InferenceRequest(model_name="add_sub_py", requested_output_names=["OUTPUT0"],
                                              inputs=inputs).exec()
                out = int(pb_utils.get_output_tensor_by_name(r, "OUTPUT0").as_numpy()[0]) - 1
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([out], np.int32)),
                                                    pb_utils.Tensor("IDX", np.array([i], np.uint32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
