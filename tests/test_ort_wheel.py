"""scripts/ort-wheel.sh, which set-up asks which ONNX Runtime wheel to install: the GPU wheel with
its CUDA 13 and cuDNN libraries where the NVIDIA driver runs CUDA 13 (580 or newer), the CPU wheel
elsewhere, MESH_ONNXRUNTIME to choose. A fake nvidia-smi on PATH plays each host."""
import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "ort-wheel.sh"
CPU = "onnxruntime==1.31.1"
GPU = "onnxruntime-gpu[cuda,cudnn]==1.31.1"


def wheel(tmp_path, driver=None, choice=None):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    if driver is not None:
        smi.write_text(f"#!/bin/sh\necho '{driver}'\n")
        smi.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    if choice is not None:
        env["MESH_ONNXRUNTIME"] = choice
    p = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=30)
    return p.returncode, p.stdout.strip(), p.stderr


@pytest.mark.parametrize("driver,want,why", [
    (None, CPU, ""),
    ("580.82.07", GPU, "NVIDIA driver 580.82.07"),
    ("590.10", GPU, "CUDA 13"),
    ("550.54.15", CPU, "older than CUDA 13 needs (580)"),
    ("NVIDIA-SMI has failed", CPU, "cannot read the NVIDIA driver's version"),
])
def test_the_driver_decides_the_wheel(tmp_path, driver, want, why):
    if driver is None and os.path.exists("/usr/bin/nvidia-smi"):
        pytest.skip("this host has a real nvidia-smi in /usr/bin")
    rc, out, err = wheel(tmp_path, driver)
    assert (rc, out) == (0, want), err
    assert why in err


def test_mesh_onnxruntime_chooses_and_a_bad_choice_is_named(tmp_path):
    assert wheel(tmp_path, "550.54.15", "gpu")[:2] == (0, GPU)
    assert wheel(tmp_path, "580.82.07", "cpu")[:2] == (0, CPU)
    rc, out, err = wheel(tmp_path, None, "cuda")
    assert rc == 2 and out == "" and "MESH_ONNXRUNTIME must be cpu, gpu or auto, not 'cuda'" in err
