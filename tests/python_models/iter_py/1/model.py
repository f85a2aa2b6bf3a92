import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.rounds = {}

    def execute(self, requests):
        for request in requests:
            key = request.request_id()
            rounds = int(pb_utils.get_input_tensor_by_name(request, "ROUNDS").as_numpy()[0])
            done = self.rounds.get(key, 0) + 1
            self.rounds[key] = done
            sender = request.get_response_sender()
            answer = pb_utils.InferenceResponse([pb_utils.Tensor("ROUND", np.array([done], np.int32))])
            if done < rounds:
                sender.send(answer)
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            else:
                del self.rounds[key]
                sender.send(answer, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
