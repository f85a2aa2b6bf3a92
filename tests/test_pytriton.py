"""PyTriton on the mesh (issue 27): a PyTriton 0.7.0 script, unchanged, run with
`python -m mesh_pytriton` (python/mesh_pytriton) starts mesh-node instead of PyTriton's bundled
tritonserver, with PyTriton's own flags (access-token restrictions over HTTP and gRPC included).
Its @batch function with dynamic batching, @sample function with BYTES, decoupled generator and
failing function answer PyTriton's ModelClient, FuturesModelClient and DecoupledModelClient, and
tritonclient. Needs .venv-pytriton (scripts/setup-pytriton.sh)."""
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import REPO_ROOT, side_venv_python
from mesh_util import HOST, free_ports, wait_live

pytestmark = [pytest.mark.server]

HERE = Path(__file__).parent / "pytriton"


@pytest.fixture(scope="module")
def pytriton_python() -> Path:
    return side_venv_python(".venv-pytriton", "MESH_PYTRITON_PYTHON", "MESH_REQUIRE_PYTRITON",
                            "scripts/setup-pytriton.sh")


@pytest.fixture(scope="module")
def served(pytriton_python, mesh_bin, server_env, tmp_path_factory):
    ports = free_ports(3)
    log = tmp_path_factory.mktemp("pytriton") / "serve.log"
    env = {k: v for k, v in server_env.items() if not k.startswith("PYTHON")}
    env.update(MESH_NODE_BIN=str(mesh_bin), PYTHONUNBUFFERED="1")
    with open(log, "ab") as out:
        proc = subprocess.Popen([str(pytriton_python), "-m", "mesh_pytriton", str(HERE / "serve.py"), *map(str, ports)],
                                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT, start_new_session=True)
    try:
        wait_live(proc, ports[0], log, timeout=120, path="/v2/models/count/ready")
        yield ports, log, pytriton_python
    finally:
        os.killpg(proc.pid, 2)  # SIGINT, as a user's Ctrl-C: PyTriton stops mesh-node
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()


def access_token(http_port: int) -> str:
    """The token PyTriton gave mesh-node (`--http-restricted-api ...:triton-access-token=TOKEN`)."""
    for d in Path("/proc").iterdir():
        try:
            args = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"mesh-node") for a in args[:1]) and str(http_port).encode() in args:
            for a in args:
                if b"triton-access-token=" in a:
                    return a.split(b"triton-access-token=", 1)[1].decode()
    raise AssertionError("no mesh-node with an access token on that port")


def test_the_script_runs_on_mesh_node_with_pytritons_restrictions(served):
    ports, log, _ = served
    text = log.read_text()
    assert "tritonserver flag --backend-directory accepted without effect" in text, text[-3000:]
    # PyTriton restricts its control endpoints with an access token, over HTTP and gRPC.
    c = httpclient.InferenceServerClient(f"{HOST}:{ports[0]}")
    with pytest.raises(Exception, match="expecting header 'triton-access-token'"):
        c.get_model_repository_index()
    token = access_token(ports[0])
    names = {m["name"] for m in c.get_model_repository_index(headers={"triton-access-token": token})}
    assert {"double", "upper", "fails", "count"} <= names
    import tritonclient.grpc as grpcclient
    g = grpcclient.InferenceServerClient(f"{HOST}:{ports[1]}")
    with pytest.raises(Exception, match="triton-grpc-protocol-triton-access-token"):
        g.get_model_repository_index()
    assert g.get_model_repository_index(headers={"triton-grpc-protocol-triton-access-token": token})
    c.close()
    g.close()


def check_pytritons_clients(python, http_port, grpc_port, context):
    """Runs client.py (PyTriton's three clients) against the ports and checks every answer of
    serve.py's functions; `context()` gives the logs to show on failure."""
    run = subprocess.run([str(python), str(HERE / "client.py"), str(http_port), str(grpc_port)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr + context()
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["double_http"] == [[2, 4], [6, 8]]
    assert out["upper_grpc"] == ["MESH"], out
    assert out["double_futures"] == [[[2 * i] * 3] for i in range(8)]
    assert "the function refused its input" in out["fails"], out["fails"]
    assert out["count"] == [[[0]], [[1]], [[2]]], out["count"]


def test_pytritons_clients_over_http_and_grpc(served):
    ports, log, python = served
    check_pytritons_clients(python, ports[0], ports[1], lambda: log.read_text()[-3000:])


def test_tritonclient_and_dynamic_batching(served):
    """tritonclient, 64 requests from 16 threads: PyTriton's dynamic batcher config is honoured
    (fewer executions than requests), and a request naming no outputs gets all of them."""
    from concurrent.futures import ThreadPoolExecutor
    ports, _, _ = served
    headers = {"triton-access-token": access_token(ports[0])}
    stats = httpclient.InferenceServerClient(f"{HOST}:{ports[0]}")
    before = stats.get_inference_statistics("double", headers=headers)["model_stats"][0]
    x = np.arange(4, dtype=np.float32).reshape(1, 4)

    def one(_):
        c = httpclient.InferenceServerClient(f"{HOST}:{ports[0]}")
        inp = httpclient.InferInput("x", [1, 4], "FP32")
        inp.set_data_from_numpy(x)
        try:
            return c.infer("double", [inp]).as_numpy("y")
        finally:
            c.close()

    with ThreadPoolExecutor(16) as pool:
        for y in pool.map(one, range(64)):
            np.testing.assert_array_equal(y, x * 2)
    after = stats.get_inference_statistics("double", headers=headers)["model_stats"][0]
    inferences = int(after["inference_count"]) - int(before["inference_count"])
    executions = int(after["execution_count"]) - int(before["execution_count"])
    assert inferences == 64 and executions < 64, (inferences, executions)
    stats.close()
