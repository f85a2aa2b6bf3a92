import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            assert text.dtype == np.object_ and all(isinstance(t, bytes) for t in text.reshape(-1))
            upper = np.array([t.upper() for t in text.reshape(-1)], dtype=np.object_).reshape(text.shape)
            info = json.dumps({
                "id": request.request_id(),
                "parameters": json.loads(request.parameters()),
                "requested": request.requested_output_names(),
                "writeable": bool(text.flags.writeable),
            })
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("UPPER", upper),
                pb_utils.Tensor("INFO", np.array([info.encode()], dtype=np.object_)),
            ]))
        return responses
