"""The pieces scripts/gen_models.py builds repositories from: small ONNX graphs (identity,
add_sub, element-wise, the benchmark MLP with its numpy reference) and config.pbtxt text in the
style of Triton's own repositories. Only numpy and onnx are needed."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# opset 17 with IR version 8 is the pairing onnx itself records for opset 17;
# onnxruntime 1.31 accepts both comfortably.
OPSET = 17
IR_VERSION = 8


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
