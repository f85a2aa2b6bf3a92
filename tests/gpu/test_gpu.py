"""The mesh on a real GPU (issue 42): discovery and --gpus, KIND_GPU ONNX, TorchScript and Python
models, GPU tensors in Python models and BLS, CUDA shared memory over HTTP and gRPC, the load limit
refusing and allowing, GPU memory given back when an instance stops, nv_gpu_* metrics, and a router
placing KIND_GPU models only on nodes with a GPU. Every test skips with one reason on a machine
without a GPU (conftest.py); scripts/check-gpu.sh runs them on one."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from cluster_util import wait_until
from gpu.gpu_util import NO_GPU, Nvml, infer_json, onnx_add_sub, python_args, python_gpu_model, torchscript_mlp
from mesh_util import metric, parse_metrics

pytestmark = [pytest.mark.server]
GIB = 1 << 30
HOLD = 4 * GIB  # what gpu_hold keeps on the GPU from initialize()
PY_MODELS = Path(__file__).resolve().parent.parent / "python_models"


@pytest.fixture(scope="module")
def nvml():
    return Nvml()


@pytest.fixture(scope="module")
def gpu_repo(tmp_path_factory) -> Path:
    """add_sub (ONNX, KIND_GPU), gpu_tensors_py (KIND_GPU), torch_mlp (TorchScript, KIND_GPU) and
    gpu_hold (Python, holds HOLD bytes of GPU memory; loaded by the tests that need it)."""
    if NO_GPU:
        pytest.skip(NO_GPU)
    repo = tmp_path_factory.mktemp("gpu-repo")
    onnx_add_sub(repo / "add_sub", "KIND_GPU")
    shutil.copytree(PY_MODELS / "gpu_tensors_py", repo / "gpu_tensors_py")
    cfg = repo / "gpu_tensors_py" / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace("KIND_CPU", "KIND_GPU"))
    torchscript_mlp(repo / "torch_mlp")
    python_gpu_model(repo / "gpu_hold", HOLD)
    return repo


def server_args(*models: str) -> list[str]:
    args = python_args() + ["--gpus", "0", "--model-control-mode", "explicit", "--metrics-interval-ms", "200"]
    for m in models:
        args += ["--load-model", m]
    return args


@pytest.fixture(scope="module")
def gpu_server(server_factory, gpu_repo):
    return server_factory([gpu_repo], server_args("add_sub", "gpu_tensors_py"), name="gpu",
                          wait_models=["add_sub", "gpu_tensors_py"])


def add_sub_inputs():
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.full((1, 16), 0.5, np.float32)
    return a, b


def test_discovery_and_nv_gpu_metrics(gpu_server):
    log = gpu_server.log_path.read_text()
    assert "running CPU-only" not in log, log[-2000:]
    samples = wait_until(lambda: s if metric(s := parse_metrics(gpu_server.metrics()), "nv_gpu_memory_used_bytes")
                         else None, 30, "nv_gpu_memory_used_bytes on /metrics")
    totals = metric(samples, "nv_gpu_memory_total_bytes")
    assert len(totals) == 1 and totals[0][1] > 8 * GIB, "--gpus 0: one GPU, labelled by its UUID"
    assert totals[0][0]["gpu_uuid"].startswith("GPU-")
    for family in ("nv_gpu_utilization", "nv_gpu_power_usage", "nv_gpu_power_limit", "nv_energy_consumption"):
        assert len(metric(samples, family)) == 1, family


def test_kind_gpu_onnx_runs_on_the_cuda_provider(gpu_server):
    # A KIND_GPU ONNX model loads only with the CUDA execution provider (there is no CPU fallback).
    config = gpu_server.get_json("/v2/models/add_sub/config")
    assert [g["kind"] for g in config["instance_group"]] == ["KIND_GPU"], config["instance_group"]
    a, b = add_sub_inputs()
    r = infer_json(gpu_server, "add_sub", {"INPUT0": a, "INPUT1": b})
    assert r.status == 200, r.body[:500]
    outputs = {o["name"]: np.array(o["data"], np.float32) for o in r.json()["outputs"]}
    np.testing.assert_array_equal(outputs["OUTPUT0"], (a + b).reshape(-1))
    np.testing.assert_array_equal(outputs["OUTPUT1"], (a - b).reshape(-1))


def python_call(server, mode, x):
    r = infer_json(server, "gpu_tensors_py", {"X": x}, parameters={"mode": mode})
    assert r.status == 200, r.body[:500]
    return {o["name"]: o["data"] for o in r.json()["outputs"]}


def test_a_python_model_answers_with_torch_cuda_tensors(gpu_server):
    x = np.array([1.5, -2.0, 3.25, 8.0], np.float32)
    out = python_call(gpu_server, "torch", x)
    assert out["Y"] == (2 * x).tolist()
    # [is_cpu() is False, as_numpy() raised Triton's message, from_dlpack(y) agreed, zero-copy both ways]
    assert out["ON_GPU"] == [True, True, True, True]


def test_a_python_model_answers_with_a_cupy_array(gpu_server):
    pytest.importorskip("cupy", reason="cupy is not installed for this interpreter")
    x = np.array([1.0, 2.0], np.float32)
    assert python_call(gpu_server, "cupy", x)["Y"] == (x + 1).tolist()


def test_bls_outputs_land_on_the_preferred_gpu(gpu_server):
    out = python_call(gpu_server, "bls", np.array([4.0], np.float32))
    assert out["ON_GPU"] == [True], "PreferredMemory(TRITONSERVER_MEMORY_GPU, 0): the output is on GPU 0"
    assert out["Y"] == [5.0] * 16  # add_sub: 4 + 1


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_cuda_shared_memory_in_and_out(gpu_server, protocol):
    try:
        import tritonclient.utils.cuda_shared_memory as cudashm
    except Exception as e:  # noqa: BLE001 (an import error of its CUDA bindings included)
        pytest.skip(f"tritonclient's cuda_shared_memory cannot load here: {e}")
    if protocol == "http":
        import tritonclient.http as client_mod
        client = client_mod.InferenceServerClient(gpu_server.http_url)
    else:
        import tritonclient.grpc as client_mod
        client = client_mod.InferenceServerClient(gpu_server.grpc_url)
    a, b = add_sub_inputs()
    size = a.nbytes
    regions = {name: cudashm.create_shared_memory_region(f"{protocol}_{name}", 2 * size, 0)
               for name in ("in", "out")}
    try:
        cudashm.set_shared_memory_region(regions["in"], [a, b])
        for name, handle in regions.items():
            client.register_cuda_shared_memory(f"{protocol}_{name}", cudashm.get_raw_handle(handle), 0, 2 * size)
        inputs = [client_mod.InferInput("INPUT0", [1, 16], "FP32"), client_mod.InferInput("INPUT1", [1, 16], "FP32")]
        inputs[0].set_shared_memory(f"{protocol}_in", size, 0)
        inputs[1].set_shared_memory(f"{protocol}_in", size, size)
        outputs = [client_mod.InferRequestedOutput("OUTPUT0"), client_mod.InferRequestedOutput("OUTPUT1")]
        outputs[0].set_shared_memory(f"{protocol}_out", size, 0)
        outputs[1].set_shared_memory(f"{protocol}_out", size, size)
        client.infer("add_sub", inputs, outputs=outputs)
        got = cudashm.get_contents_as_numpy(regions["out"], np.float32, [2, 16])
        np.testing.assert_array_equal(got[0:1], a + b)
        np.testing.assert_array_equal(got[1:2], a - b)
        if protocol == "http":
            names = [r["name"] for r in client.get_cuda_shared_memory_status()]
        else:
            names = list(client.get_cuda_shared_memory_status(as_json=True).get("regions", {}))
        assert f"{protocol}_in" in names and f"{protocol}_out" in names, names
    finally:
        client.unregister_cuda_shared_memory()
        for handle in regions.values():
            cudashm.destroy_shared_memory_region(handle)
        client.close()


def test_torchscript_on_the_gpu(gpu_server):
    import torch
    load = gpu_server.post("/v2/repository/models/torch_mlp/load", b"{}")
    if load.status != 200 and "without TorchScript support" in load.error_message():
        pytest.skip(f"this mesh-node was built without TorchScript: {load.error_message()}")
    assert load.status == 200, load.body[:1000]
    x = np.random.default_rng(0).standard_normal((8, 256), dtype=np.float32)
    model = torch.jit.load(str(gpu_server.repos[0] / "torch_mlp" / "1" / "model.pt"))
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    r = infer_json(gpu_server, "torch_mlp", {"INPUT__0": x})
    assert r.status == 200, r.body[:500]
    got = np.array(r.json()["outputs"][0]["data"], np.float32).reshape(8, 256)
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-3)
    stats = gpu_server.get_json("/v2/models/torch_mlp/stats")["model_stats"][0]["inference_stats"]
    # compute_infer waits for the device's kernels: it is not ~0 with the time moved to compute_output
    assert stats["compute_infer"]["ns"] > 0 and stats["compute_infer"]["count"] >= 1


def test_the_load_limit_allows_a_model_under_it_and_refuses_one_over_it(fresh_server, gpu_repo, nvml):
    # The limit leaves 2 GiB above what is in use now: room for add_sub (the node's CUDA context and
    # ONNX Runtime's), not for gpu_hold's 4 GiB. add_sub goes first, so nothing is being unloaded.
    fraction = (nvml.used() + 2 * GIB) / nvml.total()
    srv = fresh_server([gpu_repo], server_args() + ["--model-load-gpu-limit", f"0:{fraction:.6f}"], name="gpu-limit",
                       wait_models=[])
    allowed = srv.post("/v2/repository/models/add_sub/load", b"{}")
    assert allowed.status == 200, allowed.body[:500]
    r = srv.post("/v2/repository/models/gpu_hold/load", b"{}")
    assert r.status != 200, r.body[:500]
    assert "memory limit set for GPU 0 has exceeded, model loading is rejected" in r.error_message()


def test_gpu_memory_is_given_back_when_an_instance_stops(fresh_server, gpu_repo, nvml):
    srv = fresh_server([gpu_repo], server_args(), name="gpu-memory", wait_models=[])
    before = nvml.used()
    assert srv.post("/v2/repository/models/gpu_hold/load", b"{}").status == 200
    loaded = nvml.used()
    assert loaded >= before + HOLD - 64 * (1 << 20), (before, loaded)
    r = infer_json(srv, "gpu_hold", {"X": np.array([1.0, 2.0], np.float32)})
    assert r.status == 200 and r.json()["outputs"][0]["data"] == [2.0, 3.0], r.body[:300]
    assert srv.post("/v2/repository/models/gpu_hold/unload", b"{}").status == 200
    wait_until(lambda: nvml.used() <= before + 256 * (1 << 20), 30,
               lambda: f"GPU memory back near {before} bytes after the unload (now {nvml.used()})")


def test_a_gpu_output_that_cannot_be_copied_fails_only_its_request(fresh_server, gpu_repo):
    # A capsule on GPU 0 whose pointer holds no memory: the stub's copy out fails with the
    # driver's reason, and the instance (and the GPU) keep serving.
    srv = fresh_server([gpu_repo], server_args("gpu_tensors_py", "add_sub"), name="gpu-fake",
                       wait_models=["gpu_tensors_py", "add_sub"])
    r = infer_json(srv, "gpu_tensors_py", {"X": np.array([1.0], np.float32)}, parameters={"mode": "fake"})
    assert r.status != 200 and "cannot send the outputs" in r.error_message(), r.body[:500]
    out = infer_json(srv, "gpu_tensors_py", {"X": np.array([2.0], np.float32)}, parameters={"mode": "torch"})
    assert out.status == 200, out.body[:500]
    assert out.json()["outputs"][0]["data"] == [4.0]


@pytest.mark.cluster
def test_a_router_places_kind_gpu_models_only_on_gpu_nodes(cluster_factory, gpu_repo, tmp_path):
    c = cluster_factory()
    c.start_router([gpu_repo], ["--model-control-mode", "explicit"])
    for name, hidden in (("gpu-node", False), ("cpu-node", True)):
        env = c.env
        if hidden:  # this node sees no GPU
            c.env = dict(env, CUDA_VISIBLE_DEVICES="")
        try:
            c.start_node(name, [], ["--cluster-cache", str(tmp_path / name)] + python_args(), wait_models=[],
                         joined=False)
        finally:
            c.env = env
        wait_until(lambda: c.state(name) == "up", 30, f"{name} to join")
    r = c.router.post("/v2/repository/models/add_sub/load", b"{}")
    assert r.status == 200, r.body[:500]

    def placed():
        for m in c.view()["placement"]["models"]:
            if m["name"] == "add_sub":
                ready = {r["node"] for r in m["replicas"] if r["state"] == "ready"}
                return ready or None
        return None
    assert wait_until(placed, 60, "add_sub placed") == {"gpu-node"}
    a, b = add_sub_inputs()
    r = infer_json(c.router, "add_sub", {"INPUT0": a, "INPUT1": b})
    assert r.status == 200, r.body[:300]
