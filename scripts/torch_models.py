#!/usr/bin/env python3
"""Writes the TorchScript test repository: models scripted with torch.jit.script that return what
Triton's PyTorch backend rejects (dicts, nested dicts) and what it accepts (tensors, tuples,
List[str]), a dict-input model, the real silero_vad.jit from the silero-vad wheel, and models that
must fail to load or to answer, each for one reason.

    .venv/bin/python scripts/torch_models.py --out <dir>

Needs the `torch` feature's packages (scripts/setup-torch.sh installs them).
"""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor

# Models that load but whose answers are errors, and models that must not load at all.
ANSWER_ERRORS = ["wrong_dtype", "missing_key"]
LOAD_ERRORS = ["not_torchscript", "no_file", "bad_binding", "gpu_model", "no_outputs"]


class DictOut(torch.nn.Module):
    """Returns a dict: the case Triton refuses."""

    def forward(self, x: Tensor, y: Tensor) -> Dict[str, Tensor]:
        return {"sum": x + y, "diff": x - y, "unlisted": x * y}


class TupleOut(torch.nn.Module):
    def forward(self, a: Tensor, b: Tensor) -> Tuple[Tensor, Tensor]:
        return a * 2.0, (a + b).to(torch.int64)


class StringsOut(torch.nn.Module):
    """One label per row: List[str] served as BYTES."""

    def forward(self, x: Tensor) -> List[str]:
        labels: List[str] = []
        for row in x.sum(dim=1):
            labels.append("positive" if float(row) > 0.0 else "negative")
        return labels


class DictIn(torch.nn.Module):
    """Takes one Dict[str, Tensor], keyed by config input names (Triton supports this)."""

    def forward(self, inputs: Dict[str, Tensor]) -> Tensor:
        return inputs["a"] * inputs["b"] + 1.0


class StringsIn(torch.nn.Module):
    def forward(self, words: List[str]) -> Tensor:
        return torch.tensor([len(w) for w in words], dtype=torch.int64)


class NestedOut(torch.nn.Module):
    """A tuple holding a tensor and a dict of dicts: outputs map by key path and by position."""

    def forward(self, x: Tensor) -> Tuple[Tensor, Dict[str, Dict[str, Tensor]]]:
        det = {"boxes": x + 1.0, "scores": x.sum(dim=1, keepdim=True)}
        return x * 2.0, {"det": det}


class OptionalIn(torch.nn.Module):
    """A scalar argument and an optional tensor with a default."""

    def forward(self, x: Tensor, scale: float, bias: Optional[Tensor] = None) -> Dict[str, Tensor]:
        out = x * scale
        if bias is not None:
            out = out + bias
        return {"out": out}


class DictMlp(torch.nn.Module):
    """The benchmark model: a small MLP whose logits and probabilities come back in a dict."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.l1 = torch.nn.Linear(64, 256)
        self.l2 = torch.nn.Linear(256, 10)

    def forward(self, x: Tensor) -> Dict[str, Tensor]:
        logits = self.l2(torch.relu(self.l1(x)))
        return {"logits": logits, "probs": torch.softmax(logits, dim=1)}


class WrongDtype(torch.nn.Module):
    def forward(self, x: Tensor) -> Dict[str, Tensor]:
        return {"out": x.to(torch.float64)}


class MissingKey(torch.nn.Module):
    def forward(self, x: Tensor) -> Dict[str, Tensor]:
        return {"present": x}


def io(kind: str, name: str, dtype: str, dims: list[int], optional: bool = False) -> str:
    opt = " optional: true" if optional else ""
    return f'{kind} {{ name: "{name}" data_type: {dtype} dims: {dims}{opt} }}'


def config(name: str, max_batch: int, inputs: list[str], outputs: list[str], extra: str = "") -> str:
    lines = [f'name: "{name}"', 'platform: "pytorch_libtorch"', f"max_batch_size: {max_batch}"]
    lines += inputs + outputs
    if extra:
        lines.append(extra)
    return "\n".join(lines) + "\n"


def write(repo: Path, name: str, module: Optional[torch.nn.Module], cfg: str) -> None:
    d = repo / name
    (d / "1").mkdir(parents=True, exist_ok=True)
    (d / "config.pbtxt").write_text(cfg)
    if module is not None:
        torch.jit.script(module).save(str(d / "1" / "model.pt"))


def silero_file() -> Path:
    import silero_vad

    return Path(silero_vad.__file__).parent / "data" / "silero_vad.jit"


def generate(repo: Path) -> None:
    f32, i64 = "TYPE_FP32", "TYPE_INT64"
    # Batches of two form as soon as two requests are queued (a lone one waits up to 1 s), so the
    # tests' concurrent requests are batched whatever the scheduling.
    batching = ("dynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 1000000 }\n"
                "instance_group { count: 2 kind: KIND_CPU }")
    write(repo, "dict_out", DictOut(), config(
        "dict_out", 8, [io("input", "x", f32, [4]), io("input", "y", f32, [4])],
        [io("output", "diff", f32, [4]), io("output", "sum", f32, [4])], batching))
    write(repo, "tuple_out", TupleOut(), config(
        "tuple_out", 8, [io("input", "INPUT__1", f32, [3]), io("input", "INPUT__0", f32, [3])],
        [io("output", "OUTPUT__1", i64, [3]), io("output", "OUTPUT__0", f32, [3])]))
    write(repo, "strings_out", StringsOut(), config(
        "strings_out", 4, [io("input", "x", f32, [2])], [io("output", "label", "TYPE_STRING", [1])],
        "dynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 1000000 }"))
    write(repo, "dict_in", DictIn(), config(
        "dict_in", 8, [io("input", "a", f32, [2]), io("input", "b", f32, [2])], [io("output", "OUTPUT__0", f32, [2])]))
    write(repo, "strings_in", StringsIn(), config(
        "strings_in", 0, [io("input", "words", "TYPE_STRING", [-1])], [io("output", "lengths", i64, [-1])]))
    write(repo, "nested_out", NestedOut(), config(
        "nested_out", 8, [io("input", "x", f32, [3])],
        [io("output", "det.scores", f32, [1]), io("output", "logits", f32, [3]), io("output", "boxes", f32, [3])]))
    write(repo, "optional_in", OptionalIn(), config(
        "optional_in", 0, [io("input", "x", f32, [-1]), io("input", "scale", f32, [1]),
                           io("input", "bias", f32, [-1], optional=True)], [io("output", "out", f32, [-1])]))
    write(repo, "dict_mlp", DictMlp(), config(
        "dict_mlp", 8, [io("input", "x", f32, [64])],
        [io("output", "logits", f32, [10]), io("output", "probs", f32, [10])],
        'parameters { key: "INTRA_OP_THREAD_COUNT" value { string_value: "1" } }'))
    write(repo, "silero_vad", None, config(
        "silero_vad", 0, [io("input", "x", f32, [-1, -1]), io("input", "sr", i64, [1])],
        [io("output", "prob", f32, [-1, 1])]))
    shutil.copyfile(silero_file(), repo / "silero_vad" / "1" / "model.pt")

    one = [io("input", "x", f32, [4])]
    write(repo, "wrong_dtype", WrongDtype(), config("wrong_dtype", 8, one, [io("output", "out", f32, [4])]))
    write(repo, "missing_key", MissingKey(), config("missing_key", 8, one, [io("output", "absent", f32, [4])]))

    write(repo, "not_torchscript", None, config("not_torchscript", 8, one, [io("output", "out", f32, [4])]))
    (repo / "not_torchscript" / "1" / "model.pt").write_text("this is not a TorchScript archive\n")
    write(repo, "no_file", None, config("no_file", 8, one, [io("output", "out", f32, [4])]))
    write(repo, "bad_binding", DictOut(), config(
        "bad_binding", 8, [io("input", "x", f32, [4]), io("input", "z", f32, [4])], [io("output", "sum", f32, [4])]))
    write(repo, "gpu_model", DictOut(), config(
        "gpu_model", 8, [io("input", "x", f32, [4]), io("input", "y", f32, [4])], [io("output", "sum", f32, [4])],
        "instance_group { count: 1 kind: KIND_GPU gpus: [0] }"))
    write(repo, "no_outputs", DictOut(), config(
        "no_outputs", 8, [io("input", "x", f32, [4]), io("input", "y", f32, [4])], []))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="repository directory to (re)write")
    args = ap.parse_args()
    if args.out.exists():
        shutil.rmtree(args.out)
    args.out.mkdir(parents=True)
    generate(args.out)
    print(f"wrote {len(list(args.out.iterdir()))} models to {args.out}")


if __name__ == "__main__":
    main()
