import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils

WAIT_S = 20


class TritonPythonModel:
    def initialize(self, args):
        self.in_flight = 0
        self.most = 0
        self.changed = None

    async def execute(self, requests):
        if self.changed is None:
            self.changed = asyncio.Condition()
        for request in requests:
            gather = int(pb_utils.get_input_tensor_by_name(request, "GATHER").as_numpy()[0])
            fail = int(pb_utils.get_input_tensor_by_name(request, "FAIL").as_numpy()[0])
            async with self.changed:
                self.in_flight += 1
                self.most = max(self.most, self.in_flight)
                self.changed.notify_all()
                try:
                    await asyncio.wait_for(self.changed.wait_for(lambda: self.most >= gather), WAIT_S)
                except asyncio.TimeoutError:
                    pass
                seen = self.most
                self.in_flight -= 1
                if self.in_flight == 0:
                    self.most = 0  # the next group counts afresh
            if fail:
                raise RuntimeError(f"async_py failed on purpose after seeing {seen}")
            request.get_response_sender().send(
                pb_utils.InferenceResponse([pb_utils.Tensor("SEEN", np.array([seen], np.int32))]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
