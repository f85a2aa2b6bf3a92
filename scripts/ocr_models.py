"""The OCR pipeline of the example repository: the PP-OCRv4 recognizer and its character list from the wheel.

gen_models.py --example calls plan_ocr(), which adds to the example plan:

* ``ocr_rec/1/model.onnx`` and ``ocr_rec/config.pbtxt``: the recognizer
  (``x`` [N,3,48,W] -> ``softmax_11.tmp_0`` [N,W/8,6625]);
* ``ocr_decode/1/ppocr_keys.txt``: its character list, one per line, for CTC
  indices 1..6624 (index 0 is the CTC blank). The list is the model's own
  ``character`` metadata plus the trailing space that PaddleOCR appends;
* the hand-written models (``ocr_pre``, ``ocr_post``, ``ocr_decode``,
  ``ocr_bls`` and the ensemble ``ocr``), copied from configs/example-repo so
  that a repository written elsewhere (the tests' temp dirs) is complete.

The .onnx files and ppocr_keys.txt are generated (gitignored); the rest is
committed.
"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import numpy as np
import onnx

REPO_ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_SRC = REPO_ROOT / "configs" / "example-repo"

OCR_REC_MEMBER = "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx"
OCR_REC_SHA256 = "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b"
OCR_REC_INPUT = "x"
OCR_REC_OUTPUT = "softmax_11.tmp_0"
OCR_REC_CLASSES = 6625
KEYS_REL = "ocr_decode/1/ppocr_keys.txt"

# Hand-written, committed files of the pipeline (relative to the repository).
OCR_SOURCES = [
    "ocr_pre/config.pbtxt", "ocr_pre/1/model.py",
    "ocr_post/config.pbtxt", "ocr_post/1/model.py",
    "ocr_decode/config.pbtxt", "ocr_decode/1/model.py",
    "ocr_bls/config.pbtxt", "ocr_bls/1/model.py",
    "ocr/config.pbtxt", "ocr/1/.gitkeep",
]


def ocr_rec_config() -> str:
    return """\
# PP-OCRv4 text recognizer from rapidocr-onnxruntime 1.4.4
# (rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx).
# x[N,3,48,W] (text-line crops, (RGB/255-0.5)/0.5, W a multiple of 8) -> softmax [N,W/8,6625]
# over the CTC classes: 0 is the blank, 1..6624 are the lines of ocr_decode/1/ppocr_keys.txt.
# Unbatched (max_batch_size 0): one request carries all the crops of one image.
# model.onnx is extracted by: python scripts/gen_models.py --example configs/example-repo
name: "ocr_rec"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [
  {
    name: "x"
    data_type: TYPE_FP32
    dims: [ -1, 3, 48, -1 ]
  }
]
output [
  {
    name: "softmax_11.tmp_0"
    data_type: TYPE_FP32
    dims: [ -1, -1, 6625 ]
  }
]
instance_group [
  {
    count: 1
    kind: KIND_CPU
  }
]
"""


def character_list(model: bytes) -> list[str]:
    """CTC characters for indices 1..6624: the model's `character` metadata plus a trailing space."""
    meta = {p.key: p.value for p in onnx.load_from_string(model).metadata_props}
    if "character" not in meta:
        raise RuntimeError(f"{OCR_REC_MEMBER} has no `character` metadata")
    chars = meta["character"].split("\n")
    if chars and chars[-1] == "":
        chars.pop()
    chars.append(" ")
    if len(chars) + 1 != OCR_REC_CLASSES:
        raise RuntimeError(f"{len(chars)} characters + blank != {OCR_REC_CLASSES} recognizer classes")
    if any("\n" in c or "\r" in c for c in chars):
        raise RuntimeError("a character contains a line break")
    return chars


def plan_ocr(plan, wheel: Path, make_check) -> None:
    """Add the recognizer, its keys and the hand-written OCR models to `plan` (a gen_models.Plan)."""
    with zipfile.ZipFile(wheel) as zf:
        rec = zf.read(OCR_REC_MEMBER)
    digest = hashlib.sha256(rec).hexdigest()
    if digest != OCR_REC_SHA256:
        raise RuntimeError(f"{wheel.name}:{OCR_REC_MEMBER} has sha256 {digest}, expected {OCR_REC_SHA256}")
    plan.add("ocr_rec/1/model.onnx", rec)
    plan.add("ocr_rec/config.pbtxt", ocr_rec_config())
    plan.add(KEYS_REL, "".join(c + "\n" for c in character_list(rec)))
    for rel in OCR_SOURCES:
        plan.add(rel, (EXAMPLE_SRC / rel).read_bytes())
    crops = np.random.default_rng(4).uniform(-1, 1, (2, 3, 48, 96)).astype(np.float32)
    plan.checks.append(make_check("ocr_rec/1/model.onnx", {OCR_REC_INPUT: crops}, expect=None))
