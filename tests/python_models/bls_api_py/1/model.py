import gc
import json

import numpy as np
import triton_python_backend_utils as pb_utils


def sequence():
    sums = []
    for i, x in enumerate((1, 2, 3)):
        flags = 0
        if i == 0:
            flags |= pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
        if i == 2:
            flags |= pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
        request = pb_utils.InferenceRequest(model_name="seq_sum_py", requested_output_names=["SUM"],
                                            inputs=[pb_utils.Tensor("X", np.array([x], np.int32))],
                                            correlation_id=77, flags=flags)
        response = request.exec()
        if response.has_error():
            return {"error": response.error().message()}
        sums.append(int(pb_utils.get_output_tensor_by_name(response, "SUM").as_numpy()[0]))
    return {"sums": sums}


def memory():
    inputs = [pb_utils.Tensor("INPUT0", np.full(4, 5, np.float32)), pb_utils.Tensor("INPUT1", np.ones(4, np.float32))]
    request = pb_utils.InferenceRequest(
        model_name="add_sub_py", requested_output_names=["OUTPUT0"], inputs=inputs,
        preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0))
    response = request.exec()
    kept = pb_utils.get_output_tensor_by_name(response, "OUTPUT0")
    del response, request
    gc.collect()
    return {"kept": kept.as_numpy().tolist(), "cpu": kept.is_cpu()}


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy().reshape(-1)[0].decode()
            out = sequence() if mode == "sequence" else memory()
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", np.array([json.dumps(out).encode()], dtype=np.object_))]))
        return responses
