import numpy as np
import triton_python_backend_utils as pb_utils

TARGET = "add_sub_py"


def run_target():
    ones = np.ones(4, np.float32)
    call = pb_utils.InferenceRequest(model_name=TARGET, requested_output_names=["OUTPUT0"],
                                     inputs=[pb_utils.Tensor("INPUT0", ones), pb_utils.Tensor("INPUT1", ones)])
    response = call.exec()
    if response.has_error():
        return f"error: {response.error().message()}"
    return str(pb_utils.get_output_tensor_by_name(response, "OUTPUT0").as_numpy().tolist())


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
            if mode == "cycle":
                seen = [pb_utils.is_model_ready(TARGET)]
                pb_utils.unload_model(TARGET)
                seen += [pb_utils.is_model_ready(TARGET), run_target().split(":")[0]]
                pb_utils.load_model(TARGET)
                seen += [pb_utils.is_model_ready(TARGET), run_target()]
                seen += [pb_utils.is_model_ready("no_such_model"), pb_utils.is_model_ready(TARGET, "7")]
                text = " ".join(str(s) for s in seen)
            else:
                try:
                    pb_utils.load_model("no_such_model")
                    text = "loaded"
                except pb_utils.TritonModelException as e:
                    text = f"TritonModelException: {e}"
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([text.encode()], np.object_))]))
        return out
