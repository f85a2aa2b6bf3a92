"""OCR step 3: DB post-processing of the detector map into recognizer-ready text-line crops."""
import math

import cv2
import numpy as np
import triton_python_backend_utils as pb_utils

THRESH = 0.3        # pixel threshold on the probability map
BOX_THRESH = 0.5    # minimum mean probability inside a region
UNCLIP = 2.0        # DB's unclip ratio: how far a shrunk text kernel is grown back
MIN_SIDE = 3        # regions thinner than this (in map pixels) are noise
MAX_REGIONS = 1000
REC_H, MIN_REC_W = 48, 320


def ordered(points: np.ndarray) -> np.ndarray:
    """The 4 corners as top-left, top-right, bottom-right, bottom-left."""
    p = points[np.argsort(points[:, 0], kind="stable")]
    left, right = p[:2][np.argsort(p[:2, 1])], p[2:][np.argsort(p[2:, 1])]
    return np.array([left[0], right[0], right[1], left[1]], np.float32)


def regions(prob: np.ndarray, scale: np.ndarray, shape) -> list:
    """Quadrilaterals (in original-image pixels) around the text regions of `prob` [H, W]."""
    mask = cv2.dilate((prob > THRESH).astype(np.uint8), np.ones((2, 2), np.uint8))
    contours, _ = cv2.findContours(mask, cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)
    boxes = []
    for contour in contours[:MAX_REGIONS]:
        (cx, cy), (w, h), angle = cv2.minAreaRect(contour)
        if min(w, h) < MIN_SIDE:
            continue
        x, y, bw, bh = cv2.boundingRect(contour)
        inside = np.zeros((bh, bw), np.uint8)
        cv2.fillPoly(inside, [contour.reshape(-1, 2) - [x, y]], 1)
        if cv2.mean(prob[y:y + bh, x:x + bw], inside)[0] < BOX_THRESH:
            continue
        grow = w * h * UNCLIP / (2 * (w + h))  # offset distance of DB's unclip, for a rectangle
        box = cv2.boxPoints(((cx, cy), (w + 2 * grow, h + 2 * grow), angle))
        box = box / scale[::-1]  # map pixels -> original pixels: (x / sx, y / sy)
        box[:, 0] = np.clip(box[:, 0], 0, shape[1] - 1)
        box[:, 1] = np.clip(box[:, 1], 0, shape[0] - 1)
        boxes.append(ordered(box))
    return boxes


def reading_order(boxes: list) -> list:
    """Top to bottom by lines (top edges within half a line height), left to right in a line."""
    lines = []
    for box in sorted(boxes, key=lambda b: (b[0, 1], b[0, 0])):
        height = box[3, 1] - box[0, 1]
        if lines and abs(box[0, 1] - lines[-1][0][0, 1]) < max(10.0, height / 2):
            lines[-1].append(box)
        else:
            lines.append([box])
    return [b for line in lines for b in sorted(line, key=lambda b: b[0, 0])]


def crop(image: np.ndarray, box: np.ndarray) -> np.ndarray:
    """The region straightened by a perspective warp; tall crops are turned to read left to right."""
    w = int(max(np.linalg.norm(box[0] - box[1]), np.linalg.norm(box[3] - box[2])))
    h = int(max(np.linalg.norm(box[0] - box[3]), np.linalg.norm(box[1] - box[2])))
    w, h = max(w, 1), max(h, 1)
    target = np.array([[0, 0], [w, 0], [w, h], [0, h]], np.float32)
    out = cv2.warpPerspective(image, cv2.getPerspectiveTransform(box, target), (w, h),
                              borderMode=cv2.BORDER_REPLICATE, flags=cv2.INTER_CUBIC)
    return np.rot90(out) if h / w >= 1.5 else out


def rec_batch(crops: list) -> np.ndarray:
    """Crops resized to height 48, normalised to [-1, 1] and right-padded to one width (x8)."""
    ratios = [c.shape[1] / c.shape[0] for c in crops]
    width = max(MIN_REC_W, math.ceil(REC_H * max(ratios)))
    width = (width + 7) // 8 * 8
    batch = np.zeros((len(crops), 3, REC_H, width), np.float32)
    for i, (c, r) in enumerate(zip(crops, ratios)):
        w = min(width, max(1, math.ceil(REC_H * r)))
        resized = cv2.resize(np.ascontiguousarray(c), (w, REC_H)).astype(np.float32)
        batch[i, :, :, :w] = (resized.transpose(2, 0, 1) / 255.0 - 0.5) / 0.5
    return batch


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            prob = pb_utils.get_input_tensor_by_name(request, "prob").as_numpy()[0, 0]
            rgb = pb_utils.get_input_tensor_by_name(request, "original").as_numpy()
            scale = pb_utils.get_input_tensor_by_name(request, "scale").as_numpy()
            bgr = np.ascontiguousarray(rgb[:, :, ::-1])  # PP-OCR models were trained on BGR
            boxes = reading_order(regions(prob, scale, bgr.shape))
            crops = [crop(bgr, b) for b in boxes] or [np.full((REC_H, MIN_REC_W, 3), 255, np.uint8)]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("crops", rec_batch(crops))]))
        return responses
