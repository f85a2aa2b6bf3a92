"""The mesh's libtritonserver.so against programs written for Triton's in-process C API: the README's
C example and a streaming program (tests/capi/, compiled here with the system's C compiler), and
Triton's own perf_analyzer 2.51 driving the library with --service-kind=triton_c_api."""
import ctypes
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT, side_venv_python

HEADER = REPO_ROOT / "crates" / "capi" / "include" / "tritonserver.h"
SOURCES = REPO_ROOT / "tests" / "capi"


def compile_program(name: str, lib: Path, out_dir: Path) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler (cc): scripts/setup.sh lists it among the prerequisites")
    exe = out_dir / name
    cmd = [cc, "-Wall", "-Werror", "-Wno-unused-parameter", str(SOURCES / f"{name}.c"), "-I", str(HEADER.parent),
           "-L", str(lib.parent), "-ltritonserver", f"-Wl,-rpath,{lib.parent}", "-lpthread", "-o", str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr}"
    return exe


def repo_with(tmp_path: Path, *models: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    for m in models:
        shutil.copytree(m, repo / m.name)
    return repo


def test_the_library_exports_every_function_of_its_header(capi_lib):
    names = re.findall(r"TRITONSERVER_DECLSPEC [^;]*?\b(TRITONSERVER_\w+)\(", HEADER.read_text())
    assert len(names) == 172, "tritonserver.h 1.34 declares 172 functions"
    extensions = re.findall(r"TRITONSERVER_DECLSPEC [^;]*?\b(MESH_\w+)\(", HEADER.read_text())
    assert "MESH_ResponseQueuePop" in extensions
    lib = ctypes.CDLL(str(capi_lib))
    missing = [n for n in names + extensions if not hasattr(lib, n)]
    assert not missing, f"declared in tritonserver.h but not exported: {missing}"


def test_the_readme_c_example_infers_and_gets_tritons_errors(capi_lib, models_dir, server_env, tmp_path):
    exe = compile_program("add_sub", capi_lib, tmp_path)
    repo = repo_with(tmp_path, models_dir / "simple" / "add_sub")
    res = subprocess.run([str(exe), str(repo)], capture_output=True, text=True, timeout=120, env=server_env)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert "add_sub ready: yes" in lines
    assert "response from add_sub version 1, id first, 2 outputs" in lines
    assert "OUTPUT0 FP32 [1, 16]: " + " ".join(str(i + 1) for i in range(16)) in lines
    assert "OUTPUT1 FP32 [1, 16]: " + " ".join(str(i - 1) for i in range(16)) in lines
    refused = {l.split(":", 1)[0][len("refused "):]: l.split(": ", 2)[1] for l in lines if l.startswith("refused ")}
    assert refused == {
        "a wrong datatype": "Invalid argument",
        "a wrong shape": "Invalid argument",
        "too few bytes": "Invalid argument",
        "a deleted request": "Invalid argument",
        "an unknown model": "Not found",
        "an unsupported function": "Unsupported",
        "a call after stop": "Unavailable",
        "a deleted server": "Invalid argument",
    }, res.stdout
    assert "expects FP32" in res.stdout and "TRITONSERVER_ServerPollModelRepository" in res.stdout
    assert "input 'INPUT0' of model 'add_sub': FP32 tensor of shape [1, 16] needs 64 bytes, got 60" in res.stdout
    assert lines[-1] == "done"
    # --log-info false (TRITONSERVER_ServerOptionsSetLogInfo) silences the INFO lines.
    assert " INFO " not in res.stderr, res.stderr


def test_decoupled_answers_and_many_requests_in_flight_are_each_answered_once(capi_lib, server_env, tmp_path):
    exe = compile_program("stream", capi_lib, tmp_path)
    repo = repo_with(tmp_path, REPO_ROOT / "tests" / "python_models" / "repeat_py")
    res = subprocess.run([str(exe), str(repo), sys.executable], capture_output=True, text=True, timeout=180,
                         env=server_env)
    assert res.returncode == 0, res.stdout + res.stderr
    # 64 requests of 3 elements, twice (each request reused after its release): an answer per
    # element, one final flag (alone, as the model sends it) and one release per request and round.
    assert "decoupled: yes" in res.stdout
    assert "answers 384, finals 128 (128 without a response), releases 128, wrong 0" in res.stdout, res.stdout


@pytest.fixture(scope="module")
def perf_analyzer() -> Path:
    python = side_venv_python(".venv-pytriton", "MESH_PYTRITON_PYTHON", "MESH_REQUIRE_PYTRITON",
                              "scripts/setup-pytriton.sh")
    pa = python.parent / "perf_analyzer"
    if not pa.exists():
        pytest.fail(f"{pa} not found: run scripts/setup-pytriton.sh")
    return pa


def test_perf_analyzer_drives_the_library_through_the_c_api(perf_analyzer, capi_lib, models_dir, server_env,
                                                            tmp_path):
    # perf_analyzer loads DIR/lib/libtritonserver.so and starts a server with the C API's defaults
    # (polling control: every model of the repository loads).
    server_dir = tmp_path / "tritonserver"
    (server_dir / "lib").mkdir(parents=True)
    (server_dir / "lib" / "libtritonserver.so").symlink_to(capi_lib)
    repo = repo_with(tmp_path, models_dir / "simple" / "add_sub", models_dir / "simple" / "mlp")
    res = subprocess.run([str(perf_analyzer), "-m", "mlp", "--service-kind=triton_c_api",
                          f"--triton-server-directory={server_dir}", f"--model-repository={repo}",
                          "--measurement-interval", "1000", "--concurrency-range", "1", "-b", "2",
                          "--stability-percentage", "50", "--max-trials", "5"],
                         capture_output=True, text=True, timeout=300, env=server_env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "Service Kind: TRITON_C_API" in res.stdout
    served = re.search(r"Successful request count: (\d+)", res.stdout)
    assert served and int(served.group(1)) > 0, res.stdout
    # The server's own statistics, read through TRITONSERVER_ServerModelStatistics, count batch 2.
    assert re.search(r"Inference count: (\d+)", res.stdout).group(1) == str(2 * int(served.group(1))), res.stdout
