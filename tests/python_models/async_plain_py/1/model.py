import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.in_flight = 0
        self.most = 0

    async def execute(self, requests):
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await asyncio.sleep(0.2)
        self.in_flight -= 1
        return [pb_utils.InferenceResponse([pb_utils.Tensor("SEEN", np.array([self.most], np.int32))])
                for _ in requests]
