"""A node whose ONNX Runtime library is not found (issue 27): it starts and serves its Python models;
an ONNX model fails to load with a message that names the missing library, and the other models keep
serving. A library the operator names (ORT_DYLIB_PATH) that cannot be loaded still stops the start."""
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from mesh_util import HOST, free_ports, stop_process, wait_live

pytestmark = [pytest.mark.server]

PY_MODELS = Path(__file__).parent / "python_models"


def lonely_node(mesh_bin, server_env, tmp_path, repo: Path, env_extra=None):
    """mesh-node copied where no project venv is near it (the library is looked for beside it), and
    started from there without ORT_DYLIB_PATH."""
    home = tmp_path / "bare"
    home.mkdir()
    binary = home / "mesh-node"
    shutil.copy2(mesh_bin, binary)
    env = {k: v for k, v in server_env.items() if k != "ORT_DYLIB_PATH"}
    env.update(env_extra or {})
    http, grpc, metrics = free_ports(3)
    log = tmp_path / "node.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [str(binary), "--model-repository", str(repo), "--http-port", str(http), "--grpc-port", str(grpc),
             "--metrics-port", str(metrics), "--backend-config", f"python,interpreter={sys.executable}"],
            cwd=home, env=env, stdout=out, stderr=subprocess.STDOUT)
    return proc, http, log


def test_a_python_repository_serves_without_onnx_runtime(mesh_bin, server_env, tmp_path, models_dir):
    repo = tmp_path / "repo"
    shutil.copytree(PY_MODELS / "add_sub_py", repo / "add_sub_py")
    shutil.copytree(models_dir / "simple" / "mlp", repo / "mlp")
    proc, port, log = lonely_node(mesh_bin, server_env, tmp_path, repo)
    try:
        wait_live(proc, port, log)
        client = httpclient.InferenceServerClient(f"{HOST}:{port}")
        for _ in range(200):
            index = {m["name"]: m for m in client.get_model_repository_index()}
            if index.get("add_sub_py", {}).get("state") == "READY" and index.get("mlp", {}).get("state") == "UNAVAILABLE":
                break
            import time
            time.sleep(0.1)
        assert index["add_sub_py"]["state"] == "READY", index
        assert index["mlp"]["state"] == "UNAVAILABLE", index
        assert "needs ONNX Runtime" in index["mlp"]["reason"], index["mlp"]
        a = np.arange(4, dtype=np.float32)
        inputs = [httpclient.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
        for i in inputs:
            i.set_data_from_numpy(a)
        out = client.infer("add_sub_py", inputs)
        np.testing.assert_array_equal(out.as_numpy("OUTPUT0"), a + a)
        client.close()
    finally:
        stop_process(proc)
    assert "serving without ONNX Runtime" in log.read_text()


def test_a_named_library_that_cannot_load_stops_the_start(mesh_bin, server_env, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    proc, _, log = lonely_node(mesh_bin, server_env, tmp_path, repo,
                               {"ORT_DYLIB_PATH": str(tmp_path / "no-such-libonnxruntime.so")})
    assert proc.wait(20) != 0
    assert "does not exist" in log.read_text()
