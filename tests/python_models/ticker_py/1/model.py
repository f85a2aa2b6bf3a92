import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils

MAX_TICKS = 3000


class TritonPythonModel:
    """Streams a tick every PERIOD_MS until the client cancels, then writes the count it reached to
    the file named by the request parameter `marker`."""

    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "PERIOD_MS", "data_type": "TYPE_INT32", "dims": [1]})
        config.add_output({"name": "TICK", "data_type": "TYPE_INT32", "dims": [1]})
        config.set_model_transaction_policy(dict(decoupled=True))
        return config

    def execute(self, requests):
        for request in requests:
            period = int(pb_utils.get_input_tensor_by_name(request, "PERIOD_MS").as_numpy()[0]) / 1000
            marker = json.loads(request.parameters()).get("marker")
            sender = request.get_response_sender()
            tick = 0
            while tick < MAX_TICKS and not request.is_cancelled():
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("TICK", np.array([tick], np.int32))]))
                tick += 1
                time.sleep(period)
            if marker:
                with open(marker, "w") as f:
                    f.write(f"cancelled={sender.is_cancelled()} ticks={tick}")
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
