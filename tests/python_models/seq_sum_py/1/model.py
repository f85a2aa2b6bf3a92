import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            key = request.correlation_id()
            if request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
                self.sums[key] = 0
            self.sums[key] = self.sums.get(key, 0) + int(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0])
            total = self.sums[key]
            if request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
                del self.sums[key]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", np.array([total], np.int32))]))
        return responses
