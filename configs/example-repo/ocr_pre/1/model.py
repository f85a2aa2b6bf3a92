"""OCR step 1: decode an encoded image file and build the PP-OCRv4 detector input."""
import io

import numpy as np
import triton_python_backend_utils as pb_utils
from PIL import Image

LIMIT_SIDE = 960  # longer side of the detector input, as PaddleOCR's limit_type "max"
MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)


def decode(data: bytes) -> np.ndarray:
    """The file's pixels as RGB uint8 [h, w, 3]; ValueError when it is not an image."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            return np.asarray(img.convert("RGB"), dtype=np.uint8)
    except Exception as e:  # noqa: BLE001 - Pillow raises several types for bad data
        raise ValueError(f"input 'image' is not a decodable image file ({len(data)} bytes): {e}") from None


def det_input(rgb: np.ndarray):
    """Resize so both sides are multiples of 32 (longer side <= LIMIT_SIDE) and normalise.

    Channels go in BGR order, as PaddleOCR (which reads images with OpenCV) trained the model."""
    h, w = rgb.shape[:2]
    ratio = min(1.0, LIMIT_SIDE / max(h, w))
    rh = max(32, int(round(h * ratio / 32)) * 32)
    rw = max(32, int(round(w * ratio / 32)) * 32)
    resized = np.asarray(Image.fromarray(rgb).resize((rw, rh), Image.BILINEAR), np.float32)
    x = ((resized[:, :, ::-1] / 255.0 - MEAN) / STD).transpose(2, 0, 1)[np.newaxis]
    return np.ascontiguousarray(x, np.float32), np.array([rh / h, rw / w], np.float32)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "image").as_numpy().tobytes()
            try:
                rgb = decode(data)
            except ValueError as e:
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(str(e), pb_utils.TritonError.INVALID_ARG)))
                continue
            x, scale = det_input(rgb)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("x", x), pb_utils.Tensor("original", rgb), pb_utils.Tensor("scale", scale)]))
        return responses
