"""OCR step 5: CTC greedy decoding of the PP-OCRv4 recognizer output into text."""
import os

import numpy as np
import triton_python_backend_utils as pb_utils


def ctc_greedy(probs: np.ndarray, chars: list) -> list:
    """Best class per step, repeats merged, blanks (class 0) dropped; one stripped string per row."""
    texts = []
    for best in probs.argmax(axis=2):
        keep = np.ones(len(best), bool)
        keep[1:] = best[1:] != best[:-1]
        keep &= best != 0
        texts.append("".join(chars[i] for i in best[keep]).strip())
    return texts


class TritonPythonModel:
    def initialize(self, args):
        here = os.path.join(args["model_repository"], args["model_version"])
        with open(os.path.join(here, "ppocr_keys.txt"), encoding="utf-8") as f:
            self.chars = [""] + [line[:-1] if line.endswith("\n") else line for line in f]

    def execute(self, requests):
        responses = []
        for request in requests:
            probs = pb_utils.get_input_tensor_by_name(request, "probs").as_numpy()
            if probs.ndim != 3 or probs.shape[2] != len(self.chars):
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    f"probs must be [N, T, {len(self.chars)}], got {list(probs.shape)}",
                    pb_utils.TritonError.INVALID_ARG)))
                continue
            text = np.array([t.encode("utf-8") for t in ctc_greedy(probs, self.chars)], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("text", text)]))
        return responses
