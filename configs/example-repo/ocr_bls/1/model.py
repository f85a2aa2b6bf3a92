"""The OCR pipeline as BLS: ocr_pre -> ocr_det -> ocr_post -> ocr_rec -> ocr_decode via exec()."""
import triton_python_backend_utils as pb_utils

# (model, {its input: pipeline tensor}, {its output: pipeline tensor}), as the ensemble `ocr` wires them.
STEPS = [
    ("ocr_pre", {"image": "image"}, {"x": "det_input", "original": "original", "scale": "scale"}),
    ("ocr_det", {"x": "det_input"}, {"sigmoid_0.tmp_0": "prob_map"}),
    ("ocr_post", {"prob": "prob_map", "original": "original", "scale": "scale"}, {"crops": "crops"}),
    ("ocr_rec", {"x": "crops"}, {"softmax_11.tmp_0": "rec_probs"}),
    ("ocr_decode", {"probs": "rec_probs"}, {"text": "text"}),
]


class StepFailed(Exception):
    def __init__(self, model, error):
        super().__init__(f"{model}: {error.message()}")
        self.code = error.code()


def run_pipeline(image):
    tensors = {"image": image.as_numpy()}
    for model, inputs, outputs in STEPS:
        response = pb_utils.InferenceRequest(
            model_name=model,
            inputs=[pb_utils.Tensor(name, tensors[src]) for name, src in inputs.items()],
            requested_output_names=list(outputs)).exec()
        if response.has_error():
            raise StepFailed(model, response.error())
        for name, dst in outputs.items():
            tensors[dst] = pb_utils.get_output_tensor_by_name(response, name).as_numpy()
    return pb_utils.Tensor("text", tensors["text"])


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                text = run_pipeline(pb_utils.get_input_tensor_by_name(request, "image"))
                responses.append(pb_utils.InferenceResponse([text]))
            except StepFailed as e:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e), e.code)))
        return responses
