import json
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            size = int(pb_utils.get_input_tensor_by_name(request, "SIZE").as_numpy()[0])
            progress = json.loads(request.parameters()).get("progress")
            threading.Thread(target=self.flood, args=(request.get_response_sender(), count, size, progress),
                             daemon=True).start()
        return None

    def flood(self, sender, count, size, progress):
        payload = np.zeros(size, np.uint8)
        for n in range(count):
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("DATA", payload),
                                                    pb_utils.Tensor("N", np.array([n], np.int32))]))
            if progress:
                with open(progress, "w") as f:
                    f.write(str(n + 1))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
