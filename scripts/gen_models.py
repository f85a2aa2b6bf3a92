#!/usr/bin/env python3
"""Build ONNX models and Triton-style model repositories for the mesh.

    python scripts/gen_models.py [--out DIR] [--example DIR] [--no-check]

Under ``--out DIR`` (default: ``<repo>/models-gen``) three repositories are
written, one directory each, so that a test can point ``mesh-node`` at exactly
what it needs:

* ``DIR/dtypes``  identity models for each of Triton's 14 data types, plus an
  unbatched FP32 variant.
* ``DIR/simple``  add_sub, an MLP for benchmarks, models whose configuration
  must be auto-completed, version-policy models and a custom file name.
* ``DIR/broken``  models that must fail to load, each for one reason, plus one
  model (``good``) that must serve.

``--example DIR`` writes the example repository (``mlp``, the PP-OCRv4
detector ``ocr_det`` taken from the rapidocr-onnxruntime wheel, and the OCR
pipeline of scripts/ocr_models.py), configs included.

The script is deterministic and idempotent: a file is only rewritten when its
content changes, and stale files inside the managed repositories are removed.
At the end every generated model is loaded and run in onnxruntime and checked
against numpy (skip with ``--no-check``).

Only ``numpy`` and ``onnx`` are needed to generate; ``onnxruntime`` for the
check.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ocr_models  # noqa: E402  (the OCR pipeline of the example repository)

REPO_ROOT = Path(__file__).resolve().parent.parent

# opset 17 with IR version 8 is the pairing onnx itself records for opset 17;
# onnxruntime 1.31 accepts both comfortably.
OPSET = 17
IR_VERSION = 8

MANAGED_REPOS = ("dtypes", "simple", "broken")

# Triton's 14 datatypes: KServe name, ONNX element type, config enum, numpy.
# numpy has no bfloat16: BF16 values are carried as their uint16 bit patterns.
DTYPES = [
    ("BOOL", TensorProto.BOOL, "TYPE_BOOL", np.bool_),
    ("UINT8", TensorProto.UINT8, "TYPE_UINT8", np.uint8),
    ("UINT16", TensorProto.UINT16, "TYPE_UINT16", np.uint16),
    ("UINT32", TensorProto.UINT32, "TYPE_UINT32", np.uint32),
    ("UINT64", TensorProto.UINT64, "TYPE_UINT64", np.uint64),
    ("INT8", TensorProto.INT8, "TYPE_INT8", np.int8),
    ("INT16", TensorProto.INT16, "TYPE_INT16", np.int16),
    ("INT32", TensorProto.INT32, "TYPE_INT32", np.int32),
    ("INT64", TensorProto.INT64, "TYPE_INT64", np.int64),
    ("FP16", TensorProto.FLOAT16, "TYPE_FP16", np.float16),
    ("FP32", TensorProto.FLOAT, "TYPE_FP32", np.float32),
    ("FP64", TensorProto.DOUBLE, "TYPE_FP64", np.float64),
    ("BYTES", TensorProto.STRING, "TYPE_STRING", np.object_),
    ("BF16", TensorProto.BFLOAT16, "TYPE_BF16", np.uint16),
]
DTYPE_NAMES = [d[0] for d in DTYPES]

# The rapidocr wheel that ships the PP-OCRv4 models (see DESIGN.md section 5).
RAPIDOCR_WHEEL = "rapidocr_onnxruntime-1.4.4-*.whl"
RAPIDOCR_PIN = "rapidocr-onnxruntime==1.4.4"
OCR_DET_MEMBER = "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx"
OCR_DET_SHA256 = "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9"
OCR_DET_OUTPUT = "sigmoid_0.tmp_0"


def identity_model_name(dtype: str) -> str:
    return "identity_" + dtype.lower()


# --------------------------------------------------------------------------
# ONNX construction
# --------------------------------------------------------------------------

def _vi(name: str, elem_type: int, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, list(shape))


def _model_bytes(name, nodes, inputs, outputs, initializers=()) -> bytes:
    graph = helper.make_graph(list(nodes), name, list(inputs), list(outputs),
                              initializer=list(initializers))
    model = helper.make_model(graph, producer_name="mesh-gen_models",
                              opset_imports=[helper.make_opsetid("", OPSET)],
                              ir_version=IR_VERSION)
    onnx.checker.check_model(model, full_check=True)
    return model.SerializeToString()


def _const(name: str, value: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name=name)


def identity_onnx(elem_type: int, shape) -> bytes:
    # Identity is implemented by the ORT CPU provider for all 14 types
    # (checked against onnxruntime 1.31.1, BF16 and STRING included).
    return _model_bytes(
        "identity",
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        [_vi("INPUT0", elem_type, shape)],
        [_vi("OUTPUT0", elem_type, shape)],
    )


def add_sub_onnx(width: int = 16) -> bytes:
    shape = ["batch", width]
    return _model_bytes(
        "add_sub",
        [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
         helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])],
        [_vi("INPUT0", TensorProto.FLOAT, shape), _vi("INPUT1", TensorProto.FLOAT, shape)],
        [_vi("OUTPUT0", TensorProto.FLOAT, shape), _vi("OUTPUT1", TensorProto.FLOAT, shape)],
    )


def elementwise_onnx(op: str, constant: float, shape) -> bytes:
    """y = x <op> constant, FP32, for the small single-tensor models."""
    return _model_bytes(
        f"x_{op.lower()}_const",
        [helper.make_node(op, ["x", "c"], ["y"])],
        [_vi("x", TensorProto.FLOAT, shape)],
        [_vi("y", TensorProto.FLOAT, shape)],
        [_const("c", np.array(constant, dtype=np.float32))],
    )


MLP_IN, MLP_HIDDEN, MLP_OUT = 64, 128, 16
MLP_SEED = 20240601


def mlp_weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(MLP_SEED)
    return {
        "w1": (rng.standard_normal((MLP_IN, MLP_HIDDEN)) / np.sqrt(MLP_IN)).astype(np.float32),
        "b1": (rng.standard_normal(MLP_HIDDEN) * 0.1).astype(np.float32),
        "w2": (rng.standard_normal((MLP_HIDDEN, MLP_OUT)) / np.sqrt(MLP_HIDDEN)).astype(np.float32),
        "b2": (rng.standard_normal(MLP_OUT) * 0.1).astype(np.float32),
    }


def mlp_reference(x: np.ndarray, w: dict[str, np.ndarray]) -> np.ndarray:
    h = np.maximum(x @ w["w1"] + w["b1"], 0.0)
    return (h @ w["w2"] + w["b2"]).astype(np.float32)


def mlp_onnx() -> bytes:
    w = mlp_weights()
    return _model_bytes(
        "mlp",
        [helper.make_node("MatMul", ["x", "w1"], ["h0"]),
         helper.make_node("Add", ["h0", "b1"], ["h1"]),
         helper.make_node("Relu", ["h1"], ["h"]),
         helper.make_node("Gemm", ["h", "w2", "b2"], ["y"])],
        [_vi("x", TensorProto.FLOAT, ["batch", MLP_IN])],
        [_vi("y", TensorProto.FLOAT, ["batch", MLP_OUT])],
        [_const(k, v) for k, v in w.items()],
    )


# --------------------------------------------------------------------------
# config.pbtxt rendering, in the style Triton's own repositories use
# --------------------------------------------------------------------------

@dataclass
class Tensor:
    name: str
    data_type: str  # TYPE_*
    dims: list


def _dims(dims) -> str:
    return "[ " + ", ".join(str(d) for d in dims) + " ]"


def _io_block(kind: str, tensors: list[Tensor]) -> str:
    items = []
    for t in tensors:
        items.append(
            "  {\n"
            f'    name: "{t.name}"\n'
            f"    data_type: {t.data_type}\n"
            f"    dims: {_dims(t.dims)}\n"
            "  }"
        )
    return f"{kind} [\n" + ",\n".join(items) + "\n]\n"


def render_config(name: str, *, comment: str, max_batch_size: int | None,
                  inputs: list[Tensor], outputs: list[Tensor],
                  platform: str | None = "onnxruntime_onnx",
                  backend: str | None = None, extra_top: str = "",
                  extra_bottom: str = "") -> str:
    lines = [f"# {c}" if c else "#" for c in comment.strip().splitlines()]
    text = "\n".join(lines) + "\n"
    text += f'name: "{name}"\n'
    if platform:
        text += f'platform: "{platform}"\n'
    if backend:
        text += f'backend: "{backend}"\n'
    text += extra_top
    if max_batch_size is not None:
        text += f"max_batch_size: {max_batch_size}\n"
    if inputs:
        text += _io_block("input", inputs)
    if outputs:
        text += _io_block("output", outputs)
    text += extra_bottom
    return text


# --------------------------------------------------------------------------
# What gets generated
# --------------------------------------------------------------------------

@dataclass
class Check:
    """One onnxruntime self-check: load `path` and compare against numpy."""
    path: str                      # relative to the output root
    feeds: dict = field(default_factory=dict)
    expect: Callable[[dict], dict] | None = None  # feeds -> {output: array}
    must_fail: bool = False
    bf16: bool = False             # feeds/outputs carry BF16 bit patterns


@dataclass
class Plan:
    files: dict = field(default_factory=dict)   # relative path -> bytes
    checks: list = field(default_factory=list)

    def add(self, rel: str, data) -> None:
        if isinstance(data, str):
            data = data.encode("utf-8")
        if rel in self.files and self.files[rel] != data:
            raise RuntimeError(f"conflicting content for {rel}")
        self.files[rel] = data


GENERATED = "Generated by scripts/gen_models.py; edits are overwritten."


def _sample_for(dtype: str, shape) -> np.ndarray:
    n = int(np.prod(shape))
    if dtype == "BOOL":
        return (np.arange(n) % 3 == 0).reshape(shape)
    if dtype == "BYTES":
        vals = [b"", b"a\x00b", "\u00e9".encode(), b"\xff\xfe"] * n
        return np.array(vals[:n], dtype=object).reshape(shape)
    if dtype == "BF16":
        return (np.arange(n, dtype=np.uint16) + 0x3F80).reshape(shape)
    np_t = dict((d[0], d[3]) for d in DTYPES)[dtype]
    return np.arange(n).astype(np_t).reshape(shape)


def plan_dtypes(plan: Plan) -> None:
    for dtype, elem, cfg_type, _ in DTYPES:
        name = identity_model_name(dtype)
        plan.add(f"dtypes/{name}/1/model.onnx", identity_onnx(elem, ["batch", "d0"]))
        plan.add(f"dtypes/{name}/config.pbtxt", render_config(
            name,
            comment=f"Identity model for {cfg_type} (KServe datatype {dtype}).\n"
                    f"OUTPUT0 = INPUT0, batched up to 8, one variable dim.\n{GENERATED}",
            platform=None, backend="onnxruntime", max_batch_size=8,
            inputs=[Tensor("INPUT0", cfg_type, [-1])],
            outputs=[Tensor("OUTPUT0", cfg_type, [-1])],
            extra_bottom="instance_group [\n  {\n    count: 1\n    kind: KIND_CPU\n  }\n]\n",
        ))
        x = _sample_for(dtype, (2, 3))
        if dtype == "BYTES":
            # The onnxruntime Python binding turns bytes into str(); feed
            # text so the check compares like with like.
            x = np.array([["", "a\x00b", "\u00e9"], ["x", "yy", "zzz"]], dtype=object)
        plan.checks.append(Check(f"dtypes/{name}/1/model.onnx", {"INPUT0": x},
                                 lambda f: {"OUTPUT0": f["INPUT0"]}, bf16=dtype == "BF16"))

    name = "identity_fp32_nobatch"
    plan.add(f"dtypes/{name}/1/model.onnx", identity_onnx(TensorProto.FLOAT, ["d0", "d1"]))
    plan.add(f"dtypes/{name}/config.pbtxt", render_config(
        name,
        comment=f"Unbatched FP32 identity: max_batch_size 0, any 2-D shape.\n{GENERATED}",
        max_batch_size=0,
        inputs=[Tensor("INPUT0", "TYPE_FP32", [-1, -1])],
        outputs=[Tensor("OUTPUT0", "TYPE_FP32", [-1, -1])],
    ))
    plan.checks.append(Check(f"dtypes/{name}/1/model.onnx",
                             {"INPUT0": np.arange(15, dtype=np.float32).reshape(3, 5)},
                             lambda f: {"OUTPUT0": f["INPUT0"]}))


def _add_sub_config(name: str, comment: str, *, extra_top: str = "",
                    inputs: list[Tensor] | None = None, max_batch_size: int = 8) -> str:
    fp = "TYPE_FP32"
    return render_config(
        name, comment=comment, max_batch_size=max_batch_size, extra_top=extra_top,
        inputs=inputs if inputs is not None else
        [Tensor("INPUT0", fp, [16]), Tensor("INPUT1", fp, [16])],
        outputs=[Tensor("OUTPUT0", fp, [16]), Tensor("OUTPUT1", fp, [16])],
    )


def _add_sub_check(rel: str) -> Check:
    rng = np.random.default_rng(7)
    a = rng.standard_normal((3, 16)).astype(np.float32)
    b = rng.standard_normal((3, 16)).astype(np.float32)
    return Check(rel, {"INPUT0": a, "INPUT1": b},
                 lambda f: {"OUTPUT0": f["INPUT0"] + f["INPUT1"],
                            "OUTPUT1": f["INPUT0"] - f["INPUT1"]})


def _fp32_check(rel: str, shape, fn) -> Check:
    x = (np.arange(int(np.prod(shape)), dtype=np.float32) - 3.5).reshape(shape)
    return Check(rel, {"x": x}, lambda f: {"y": fn(f["x"]).astype(np.float32)})


VERSIONED = {
    # model name -> (version_policy line or "", versions served)
    "versioned_latest": ("", [3]),
    "versioned_all": ("version_policy: { all { } }\n", [1, 2, 3]),
    "versioned_specific": ("version_policy: { specific { versions: [1, 3] } }\n", [1, 3]),
    "versioned_latest2": ("version_policy: { latest { num_versions: 2 } }\n", [2, 3]),
}


def plan_simple(plan: Plan) -> None:
    fp = "TYPE_FP32"
    plan.add("simple/README.md",
             "A stray file at the top of a model repository; servers ignore it.\n")

    # add_sub: Triton's classic example model.
    plan.add("simple/add_sub/1/model.onnx", add_sub_onnx())
    plan.add("simple/add_sub/config.pbtxt", _add_sub_config(
        "add_sub",
        f"Triton's classic example: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1.\n"
        f"Note the colon-less lists (input [ ... ]) that real Triton files use.\n{GENERATED}"))
    plan.add("simple/add_sub/not_a_version/README.txt",
             "Not a version directory (its name is not an integer); must be ignored.\n")
    plan.add("simple/add_sub/notes/model.onnx", b"not a model, and not a version\n")
    plan.checks.append(_add_sub_check("simple/add_sub/1/model.onnx"))

    # mlp: used by the benchmarks.
    plan.add("simple/mlp/1/model.onnx", mlp_onnx())
    plan.add("simple/mlp/config.pbtxt", mlp_config())
    w = mlp_weights()
    x = np.random.default_rng(1).standard_normal((5, MLP_IN)).astype(np.float32)
    plan.checks.append(Check("simple/mlp/1/model.onnx", {"x": x},
                             lambda f: {"y": mlp_reference(f["x"], w)}))

    # auto_batched: no config.pbtxt; first dim dynamic -> max_batch_size 4, dims [3].
    plan.add("simple/auto_batched/1/model.onnx", elementwise_onnx("Mul", 2.0, ["N", 3]))
    plan.checks.append(_fp32_check("simple/auto_batched/1/model.onnx", (4, 3), lambda x: x * 2))

    # auto_fixed: no config.pbtxt; fixed [2,3] -> max_batch_size 0, dims [2,3].
    plan.add("simple/auto_fixed/1/model.onnx", elementwise_onnx("Add", 1.0, [2, 3]))
    plan.checks.append(_fp32_check("simple/auto_fixed/1/model.onnx", (2, 3), lambda x: x + 1))

    # partial_cfg: config without max_batch_size, inputs or outputs.
    plan.add("simple/partial_cfg/1/model.onnx", elementwise_onnx("Mul", 3.0, ["N", 5]))
    plan.add("simple/partial_cfg/config.pbtxt",
             "# Only the name and the platform: max_batch_size, input and output\n"
             "# come from the model itself (auto-complete).\n"
             f"# {GENERATED}\n"
             'name: "partial_cfg"\n'
             'platform: "onnxruntime_onnx"\n'
             'backend: "onnxruntime"\n')
    plan.checks.append(_fp32_check("simple/partial_cfg/1/model.onnx", (2, 5), lambda x: x * 3))

    # Version policies: version v computes y = x + v.
    for name, (policy, served) in VERSIONED.items():
        for v in (1, 2, 3):
            rel = f"simple/{name}/{v}/model.onnx"
            plan.add(rel, elementwise_onnx("Add", float(v), ["N", 4]))
            plan.checks.append(_fp32_check(rel, (2, 4), lambda x, v=v: x + v))
        plan.add(f"simple/{name}/config.pbtxt", render_config(
            name,
            comment=f"Version v computes y = x + v. Versions on disk: 1, 2, 3; "
                    f"served: {', '.join(map(str, served))}.\n{GENERATED}",
            max_batch_size=4, extra_top=policy,
            inputs=[Tensor("x", fp, [4])], outputs=[Tensor("y", fp, [4])]))

    # custom_filename: the model lives in 1/weights.onnx (y = 10 x). A decoy
    # 1/model.onnx computing -x catches servers that ignore the setting.
    plan.add("simple/custom_filename/1/weights.onnx", elementwise_onnx("Mul", 10.0, ["N", 4]))
    plan.add("simple/custom_filename/1/model.onnx", elementwise_onnx("Mul", -1.0, ["N", 4]))
    plan.checks.append(_fp32_check("simple/custom_filename/1/weights.onnx", (3, 4), lambda x: x * 10))
    plan.checks.append(_fp32_check("simple/custom_filename/1/model.onnx", (3, 4), lambda x: -x))
    plan.add("simple/custom_filename/config.pbtxt", render_config(
        "custom_filename",
        comment=f"The model file is 1/weights.onnx (y = 10 x); 1/model.onnx is a decoy (y = -x).\n"
                f"The strings below hold '#' and brackets: a pbtxt reader must not treat them\n"
                f"as comments or list syntax. input [ in a comment is not syntax either.\n{GENERATED}",
        max_batch_size=4,
        extra_top='default_model_filename: "weights.onnx"  # not model.onnx\n',
        inputs=[Tensor("x", fp, [4])], outputs=[Tensor("y", fp, [4])],
        extra_bottom=(
            "parameters {\n"
            '  key: "note"\n'
            '  value: { string_value: "a # inside a string [is] not a comment" }\n'
            "}\n"
            "parameters [\n"
            '  { key: "quoted" value { string_value: "say \\"hi\\" input [ x ]" } }\n'
            "]\n"
        )))


# Expected values of the custom_filename parameters, for tests.
CUSTOM_FILENAME_PARAMETERS = {
    "note": "a # inside a string [is] not a comment",
    "quoted": 'say "hi" input [ x ]',
}


def mlp_config(name: str = "mlp") -> str:
    fp = "TYPE_FP32"
    return render_config(
        name,
        comment=f"Two-layer MLP, x[N,{MLP_IN}] -> y[N,{MLP_OUT}] (seeded random weights, "
                f"hidden {MLP_HIDDEN}).\nUsed by the benchmarks.\n{GENERATED}",
        max_batch_size=32,
        inputs=[Tensor("x", fp, [MLP_IN])], outputs=[Tensor("y", fp, [MLP_OUT])],
        extra_bottom=(
            "instance_group [\n  {\n    count: 1\n    kind: KIND_CPU\n  }\n]\n"
            "dynamic_batching {\n  max_queue_delay_microseconds: 100\n}\n"))


# Where each broken model's problem sits, for tests.
BAD_FIELD_NAME = "foo_bar"
BAD_FIELD_LINE = 5  # 1-based line of `foo_bar: 1` in broken/bad_field/config.pbtxt
BAD_DTYPE_NAME = "TYPE_FLOAT99"
WRONG_NAME_CONFIG_NAME = "renamed_model"


def plan_broken(plan: Plan) -> None:
    fp = "TYPE_FP32"
    onnx_add_sub = add_sub_onnx()
    why = "Broken on purpose: this model must fail to load while the others serve."

    # bad_field: an unknown field on a line of its own (BAD_FIELD_LINE).
    plan.add("broken/bad_field/1/model.onnx", onnx_add_sub)
    text = _add_sub_config("bad_field", f"{why}\n{GENERATED}",
                           extra_top=f"{BAD_FIELD_NAME}: 1\n")
    assert text.splitlines()[BAD_FIELD_LINE - 1] == f"{BAD_FIELD_NAME}: 1", text
    plan.add("broken/bad_field/config.pbtxt", text)

    # bad_dtype: an enum value that does not exist.
    plan.add("broken/bad_dtype/1/model.onnx", onnx_add_sub)
    plan.add("broken/bad_dtype/config.pbtxt", _add_sub_config(
        "bad_dtype", f"{why}\n{GENERATED}",
        inputs=[Tensor("INPUT0", BAD_DTYPE_NAME, [16]), Tensor("INPUT1", fp, [16])]))

    # wrong_name: the config names another model.
    plan.add("broken/wrong_name/1/model.onnx", onnx_add_sub)
    plan.add("broken/wrong_name/config.pbtxt",
             _add_sub_config(WRONG_NAME_CONFIG_NAME, f"{why}\n{GENERATED}"))

    # corrupt_onnx: a valid config, a model file of random bytes.
    garbage = np.random.default_rng(1234).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    plan.add("broken/corrupt_onnx/1/model.onnx", garbage)
    plan.add("broken/corrupt_onnx/config.pbtxt",
             _add_sub_config("corrupt_onnx", f"{why}\n{GENERATED}"))
    plan.checks.append(Check("broken/corrupt_onnx/1/model.onnx", must_fail=True))

    # mbs_mismatch: the config batches, the model's first dim is fixed at 2.
    plan.add("broken/mbs_mismatch/1/model.onnx", elementwise_onnx("Mul", 2.0, [2, 3]))
    plan.add("broken/mbs_mismatch/config.pbtxt", render_config(
        "mbs_mismatch",
        comment=f"{why}\nmax_batch_size 8 needs a dynamic first dim; the model's x is [2,3].\n{GENERATED}",
        max_batch_size=8,
        inputs=[Tensor("x", fp, [3])], outputs=[Tensor("y", fp, [3])]))
    plan.checks.append(_fp32_check("broken/mbs_mismatch/1/model.onnx", (2, 3), lambda x: x * 2))

    # dup_input: INPUT0 twice.
    plan.add("broken/dup_input/1/model.onnx", onnx_add_sub)
    plan.add("broken/dup_input/config.pbtxt", _add_sub_config(
        "dup_input", f"{why}\n{GENERATED}",
        inputs=[Tensor("INPUT0", fp, [16]), Tensor("INPUT0", fp, [16])]))

    # good: an add_sub copy that must serve.
    plan.add("broken/good/1/model.onnx", onnx_add_sub)
    plan.add("broken/good/config.pbtxt", _add_sub_config(
        "good", f"The one model in this repository that must load.\n{GENERATED}"))
    plan.checks.append(_add_sub_check("broken/good/1/model.onnx"))


BROKEN_MODELS = ["bad_field", "bad_dtype", "wrong_name", "corrupt_onnx", "mbs_mismatch", "dup_input"]


def ocr_det_config() -> str:
    return render_config(
        "ocr_det",
        comment="PP-OCRv4 text detector from rapidocr-onnxruntime 1.4.4\n"
                "(rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx).\n"
                "x[N,3,H,W] (normalised RGB, H and W multiples of 32) -> probability map [N,1,H,W].\n"
                "The model's batch dim is dynamic, so Triton-style batching applies.\n"
                "model.onnx is extracted by: python scripts/gen_models.py --example configs/example-repo",
        max_batch_size=4,
        inputs=[Tensor("x", "TYPE_FP32", [3, -1, -1])],
        outputs=[Tensor(OCR_DET_OUTPUT, "TYPE_FP32", [1, -1, -1])],
        extra_bottom="instance_group [\n  {\n    count: 1\n    kind: KIND_CPU\n  }\n]\n")


# --------------------------------------------------------------------------
# The example repository
# --------------------------------------------------------------------------

def find_rapidocr_wheel(explicit: str | None) -> Path:
    if explicit:
        p = Path(explicit)
        if not p.is_file():
            raise FileNotFoundError(f"--wheel {explicit}: no such file")
        return p
    candidates = []
    for base in (REPO_ROOT / ".venv" / "dl", Path(sys.prefix) / "dl"):
        candidates += sorted(glob.glob(str(base / RAPIDOCR_WHEEL)))
    if candidates:
        return Path(candidates[0])
    # Last resort: ask pip for exactly this one wheel.
    dest = Path(tempfile.mkdtemp(prefix="rapidocr-wheel-"))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(dest), RAPIDOCR_PIN]
    res = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(glob.glob(str(dest / RAPIDOCR_WHEEL)))
    if res.returncode != 0 or not found:
        raise FileNotFoundError(
            f"rapidocr wheel not found in .venv/dl and `{' '.join(cmd)}` failed:\n{res.stderr.strip()}")
    return Path(found[0])


def plan_example(plan: Plan, wheel: Path) -> None:
    plan.add("mlp/1/model.onnx", mlp_onnx())
    plan.add("mlp/config.pbtxt", mlp_config())
    w = mlp_weights()
    x = np.random.default_rng(2).standard_normal((3, MLP_IN)).astype(np.float32)
    plan.checks.append(Check("mlp/1/model.onnx", {"x": x},
                             lambda f: {"y": mlp_reference(f["x"], w)}))

    with zipfile.ZipFile(wheel) as zf:
        det = zf.read(OCR_DET_MEMBER)
    digest = hashlib.sha256(det).hexdigest()
    if digest != OCR_DET_SHA256:
        raise RuntimeError(f"{wheel.name}:{OCR_DET_MEMBER} has sha256 {digest}, "
                           f"expected {OCR_DET_SHA256}")
    plan.add("ocr_det/1/model.onnx", det)
    plan.add("ocr_det/config.pbtxt", ocr_det_config())
    img = np.random.default_rng(3).random((2, 3, 64, 96), dtype=np.float32)
    plan.checks.append(Check("ocr_det/1/model.onnx", {"x": img}, expect=None))
    ocr_models.plan_ocr(plan, wheel, Check)


# --------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------

def _write_if_changed(path: Path, data: bytes) -> bool:
    if path.is_file() and path.read_bytes() == data:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return True


def write_plan(root: Path, plan: Plan, managed: tuple[str, ...] = ()) -> tuple[int, int]:
    """Write files; inside `managed` top-level dirs, delete anything not planned."""
    written = 0
    for rel, data in sorted(plan.files.items()):
        written += _write_if_changed(root / rel, data)
    removed = 0
    wanted = {root / rel for rel in plan.files}
    for top in managed:
        base = root / top
        if not base.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(base, topdown=False):
            d = Path(dirpath)
            for fn in filenames:
                if d / fn not in wanted:
                    (d / fn).unlink()
                    removed += 1
            for dn in dirnames:
                sub = d / dn
                if sub.is_symlink():
                    sub.unlink()
                    removed += 1
                elif sub.is_dir() and not any(sub.iterdir()):
                    sub.rmdir()
    return written, removed


# --------------------------------------------------------------------------
# onnxruntime self-check
# --------------------------------------------------------------------------

def _run_bf16(sess, feeds):
    import onnxruntime as ort
    binding = sess.io_binding()
    for name, bits in feeds.items():
        binding.bind_ortvalue_input(
            name, ort.OrtValue.ortvalue_from_numpy_with_onnx_type(np.ascontiguousarray(bits), TensorProto.BFLOAT16))
    outs = {}
    for o in sess.get_outputs():
        # numpy cannot hold bfloat16: bind a uint16 buffer typed as BF16.
        shape = next(iter(feeds.values())).shape
        outs[o.name] = np.zeros(shape, dtype=np.uint16)
        binding.bind_ortvalue_output(
            o.name, ort.OrtValue.ortvalue_from_numpy_with_onnx_type(outs[o.name], TensorProto.BFLOAT16))
    sess.run_with_iobinding(binding)
    return outs


def self_check(root: Path, checks: list[Check]) -> list[str]:
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 4  # the corrupt model should fail quietly
    problems = []
    for c in checks:
        path = root / c.path
        try:
            sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001 - onnxruntime raises several types
            if not c.must_fail:
                problems.append(f"{c.path}: failed to load: {e}")
            continue
        if c.must_fail:
            problems.append(f"{c.path}: loaded, but it must fail to load")
            continue
        try:
            if c.bf16:
                got = _run_bf16(sess, c.feeds)
            else:
                names = [o.name for o in sess.get_outputs()]
                got = dict(zip(names, sess.run(names, c.feeds)))
        except Exception as e:  # noqa: BLE001
            problems.append(f"{c.path}: failed to run: {e}")
            continue
        if c.expect is None:
            for name, val in got.items():
                if not np.all(np.isfinite(val)):
                    problems.append(f"{c.path}: output {name} is not finite")
            continue
        for name, want in c.expect(c.feeds).items():
            have = got.get(name)
            if have is None:
                problems.append(f"{c.path}: missing output {name}")
            elif want.dtype == object:
                if have.shape != want.shape or [str(v) for v in have.flat] != [str(v) for v in want.flat]:
                    problems.append(f"{c.path}: {name} differs: {have!r} != {want!r}")
            elif have.shape != want.shape or not np.allclose(have, want, rtol=1e-5, atol=1e-5):
                problems.append(f"{c.path}: {name} differs from numpy")
    return problems


# --------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO_ROOT / "models-gen"),
                    help="root for the dtypes/, simple/ and broken/ repositories "
                         "(default: %(default)s)")
    ap.add_argument("--example", metavar="DIR",
                    help="also write the example repository (mlp, the OCR pipeline) here, "
                         "e.g. configs/example-repo")
    ap.add_argument("--wheel", help="path to the rapidocr_onnxruntime 1.4.4 wheel "
                                    "(default: look in .venv/dl, then pip download)")
    ap.add_argument("--no-check", action="store_true",
                    help="skip the onnxruntime self-check")
    args = ap.parse_args(argv)

    t0 = time.monotonic()
    out = Path(args.out).resolve()
    plan = Plan()
    plan_dtypes(plan)
    plan_simple(plan)
    plan_broken(plan)
    written, removed = write_plan(out, plan, MANAGED_REPOS)
    print(f"{out}: {len(plan.files)} files ({written} written, {removed} stale removed)")
    jobs = [(out, plan)]

    if args.example:
        ex_root = Path(args.example).resolve()
        ex_plan = Plan()
        try:
            wheel = find_rapidocr_wheel(args.wheel)
        except FileNotFoundError as e:
            print(f"error: {e}", file=sys.stderr)
            return 3
        plan_example(ex_plan, wheel)
        written, _ = write_plan(ex_root, ex_plan)
        print(f"{ex_root}: {len(ex_plan.files)} files ({written} written; OCR models from {wheel.name})")
        jobs.append((ex_root, ex_plan))

    if not args.no_check:
        problems = []
        n = 0
        for root, p in jobs:
            problems += self_check(root, p.checks)
            n += len(p.checks)
        if problems:
            print("onnxruntime self-check FAILED:", file=sys.stderr)
            for line in problems:
                print("  " + line, file=sys.stderr)
            return 1
        print(f"onnxruntime self-check: {n} models OK")
    print(f"done in {time.monotonic() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
