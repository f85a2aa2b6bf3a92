"""The GPU suite's fixtures and hooks: every test skips with one reason on a machine without a GPU
(so CPU-only CI passes and its summary names what it skipped). scripts/check-gpu.sh runs the suite."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from gpu_util import NO_GPU, Nvml, onnx_add_sub, python_gpu_model, torchscript_mlp

GPU_DIR = Path(__file__).resolve().parent
PY_MODELS = GPU_DIR.parent / "python_models"
_SKIPPED: list[str] = []


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU (tests/gpu; skipped with one reason without one)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if GPU_DIR in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.gpu)
            if NO_GPU:
                item.add_marker(pytest.mark.skip(reason=NO_GPU))
                _SKIPPED.append(item.name)


def pytest_terminal_summary(terminalreporter):
    if _SKIPPED:
        terminalreporter.write_line(f"GPU suite: {len(_SKIPPED)} tests skipped ({NO_GPU}): {', '.join(_SKIPPED)}")


@pytest.fixture(scope="session")
def nvml():
    return Nvml()


@pytest.fixture(scope="session")
def gpu_repo(tmp_path_factory) -> Path:
    """add_sub (ONNX, KIND_GPU), gpu_tensors_py (KIND_GPU), torch_mlp (TorchScript, KIND_GPU) and
    gpu_hold (Python, holds 2 GiB of GPU memory; loaded by the tests that need it)."""
    if NO_GPU:
        pytest.skip(NO_GPU)
    repo = tmp_path_factory.mktemp("gpu-repo")
    onnx_add_sub(repo / "add_sub", "KIND_GPU")
    shutil.copytree(PY_MODELS / "gpu_tensors_py", repo / "gpu_tensors_py")
    cfg = repo / "gpu_tensors_py" / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace("KIND_CPU", "KIND_GPU"))
    torchscript_mlp(repo / "torch_mlp")
    python_gpu_model(repo / "gpu_hold", 2 << 30)
    return repo
