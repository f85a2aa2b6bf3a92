"""Triton's SageMaker frontend on mesh-node (`--allow-sagemaker`, tritonserver 2.51
src/sagemaker_server.cc): GET /ping, POST /invocations, and the multi-model routes under /models,
over real HTTP against target/release/mesh-node.

The two SageMaker cases of Triton's qa/L0_trace/opentelemetry_unittest.py are reproduced with the
collector stand-in (tests/otlp_collector.py): POST /invocations, and POST /models (load `simple` from
a path) then POST /models/simple/invoke, each with a client `traceparent`, must give the same
trace as /v2/models/simple/infer: InferRequest -> simple -> compute, Triton's HTTP stamps, the
client's span as the root's parent. The rest checks the routes' codes and bodies as
sagemaker_server.cc answers them, and the mesh's rules: loads only in explicit model control,
behind the HTTP port's restricted APIs, from a real model directory with nothing linked from
outside it, within --http-max-input-size."""
import json
import os
import subprocess

import numpy as np
import pytest
import tritonclient.http as httpclient

from mesh_util import MeshServer, free_ports, http_request, stop_process, wait_live
# The collector fixtures are test_trace_otel's (a fresh stand-in for each test, one port a module).
from test_trace_otel import (HEADERS, SIMPLE, check_trace, collector, collector_port, inputs,  # noqa: F401
                             model, otel_args, IO_INT32, int32_add_sub_onnx)

pytestmark = [pytest.mark.server]

BINARY_MIME = "application/vnd.sagemaker-triton.binary+json;json-header-size="
SIMPLE_CONFIG = 'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n' + IO_INT32.format(d=16)


def simple_dir(path, name="simple"):
    """A model directory laid out as Triton's test lays /opt/ml/models/<hash>/model: config.pbtxt at
    its root, named `name`."""
    (path / "1").mkdir(parents=True)
    (path / "config.pbtxt").write_text(f'name: "{name}"\n' + SIMPLE_CONFIG)
    (path / "1" / "model.onnx").write_bytes(int32_add_sub_onnx())
    return path


def start_server(mesh_bin, server_env, tmp, args, env=None, name="sm"):
    repo = tmp / "repo"
    if not repo.exists():
        model(repo, "simple", SIMPLE_CONFIG, {"model.onnx": int32_add_sub_onnx()})
    port = free_ports(1)[0]
    full_env = dict(server_env, **(env or {}))
    srv = MeshServer(mesh_bin, [repo], ["--allow-sagemaker=true", "--sagemaker-port", str(port), *args],
                     tmp / f"{name}.log", full_env)
    srv.sm_port = port
    return srv.start(["simple"])


def call(srv, method, path, body=None, headers=None):
    """One request to the SageMaker port (http.client: a real HTTP exchange)."""
    return http_request(srv.sm_port, method, path, body, headers)


@pytest.fixture(scope="module")
def sm(mesh_bin, server_env, tmp_path_factory, collector_port):
    """Triton's L0_trace SageMaker set-up: explicit model control, `simple` loaded, its name in
    SAGEMAKER_TRITON_DEFAULT_MODEL_NAME, OpenTelemetry tracing of every request."""
    args = ["--model-control-mode=explicit", "--load-model=simple",
            *otel_args(collector_port, "opentelemetry,bsp_schedule_delay=1000")]
    srv = start_server(mesh_bin, server_env, tmp_path_factory.mktemp("sm"), args,
                       env={"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "simple"})
    yield srv
    srv.stop()


def json_body():
    body, _ = httpclient.InferenceServerClient.generate_request_body(inputs(httpclient, binary=False))
    return body


def check_outputs(response):
    """OUTPUT0 = INPUT0 + INPUT1 and OUTPUT1 = INPUT0 - INPUT1; binary outputs are framed by the
    SageMaker Content-Type (tritonclient asks for binary outputs when it names none)."""
    kind = response.header("content-type")
    header_length = int(kind[len(BINARY_MIME):]) if kind.startswith(BINARY_MIME) else None
    assert header_length is not None or kind == "application/json", kind
    assert response.header("inference-header-content-length") is None
    result = httpclient.InferenceServerClient.parse_response_body(response.body, header_length=header_length)
    x = np.arange(16, dtype=np.int32).reshape(1, 16)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x + x)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), x - x)


def test_sagemaker_invocation_trace_simple_model_context_propagation(sm, collector):
    headers = dict(HEADERS, **{"Content-Type": "application/json"})
    r = call(sm, "POST", "/invocations", json_body(), headers)
    assert r.status == 200, r
    check_outputs(r)
    check_trace(collector, SIMPLE, "http", HEADERS)


def test_sagemaker_invoke_trace_simple_model_context_propagation(sm, collector, tmp_path):
    url = simple_dir(tmp_path / "opt/ml/models/123456789abcdefghi/model")
    load = json.dumps({"model_name": "simple", "url": str(url)})
    r = call(sm, "POST", "/models", load, {"Content-Type": "application/json"})
    assert r.status == 200, r
    headers = dict(HEADERS, **{"Content-Type": "application/json"})
    r = call(sm, "POST", "/models/simple/invoke", json_body(), headers)
    assert r.status == 200, r
    check_outputs(r)
    check_trace(collector, SIMPLE, "http", HEADERS)
    # Unloaded as SageMaker unloads it; loaded again from the repository for the other tests.
    assert call(sm, "DELETE", "/models/simple").status == 200
    assert sm.post("/v2/repository/models/simple/load").status == 200


def test_ping_answers_readiness_and_unknown_paths_are_400(sm):
    r = call(sm, "GET", "/ping")
    assert (r.status, r.body) == (200, b"")
    r = call(sm, "POST", "/ping")
    assert (r.status, r.json()) == (405, {"error": "Method Not Allowed"})
    assert call(sm, "GET", "/invocations").status == 405
    for path in ("/v2/health/ready", "/ping/", "/models/a/b"):
        r = call(sm, "GET", path)
        assert (r.status, r.body) == (400, b""), path
    # The KServe port is unchanged beside it.
    assert sm.get("/v2/health/ready").status == 200


def test_binary_bodies_are_framed_by_the_content_type(sm):
    ins = inputs(httpclient, binary=True)
    outs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
            httpclient.InferRequestedOutput("OUTPUT1", binary_data=True)]
    body, json_size = httpclient.InferenceServerClient.generate_request_body(ins, outputs=outs)
    r = call(sm, "POST", "/invocations", body, {"Content-Type": f"{BINARY_MIME}{json_size}"})
    assert r.status == 200, r
    assert r.header("content-type").startswith(BINARY_MIME)
    check_outputs(r)
    r = call(sm, "POST", "/invocations", body, {"Content-Type": f"{BINARY_MIME}{len(body) + 1}"})
    assert r.status == 400
    assert r.json()["error"] == f"inference header size should be in range (0, {len(body)}), got: {len(body) + 1}"
    # JSON outputs are answered as JSON.
    outs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=False),
            httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)]
    json_only, _ = httpclient.InferenceServerClient.generate_request_body(inputs(httpclient, False), outputs=outs)
    r = call(sm, "POST", "/invocations", json_only)
    assert (r.status, r.header("content-type")) == (200, "application/json")
    check_outputs(r)
    # Without the binary type the whole body is JSON, as tritonserver reads it.
    r = call(sm, "POST", "/invocations", body, {"Content-Type": "application/json"})
    assert r.status == 400 and "error" in r.json()


def test_the_multi_model_routes_list_get_conflict_and_unload(sm, tmp_path):
    url = simple_dir(tmp_path / "mme" / "model", name="any_name")
    load = json.dumps({"model_name": "h1", "url": str(url)})
    r = call(sm, "POST", "/models/h1/invoke", json_body())
    assert (r.status, r.body) == (404, b"")
    r = call(sm, "POST", "/models", load)
    assert (r.status, r.body) == (200, b""), r
    assert call(sm, "POST", "/models", load).status == 409
    assert call(sm, "GET", "/models/h1").json() == {"modelName": "h1", "modelUrl": str(url)}
    assert {"modelName": "h1", "modelUrl": str(url)} in call(sm, "GET", "/models").json()["models"]
    # Served under the name it was loaded as, whatever its config says.
    r = call(sm, "POST", "/models/h1/invoke", json_body())
    assert r.status == 200, r
    check_outputs(r)
    # An unknown model behind the target-model header: a multi-model error is a 400.
    r = call(sm, "POST", "/models/h1/invoke", json_body(), {"X-Amzn-SageMaker-Target-Model": "no_such_model"})
    assert r.status == 400 and "error" in r.json()
    assert call(sm, "DELETE", "/models/sm_non_loaded_model").status == 404
    assert call(sm, "DELETE", "/models/h1").status == 200
    assert call(sm, "GET", "/models/h1").status == 404
    r = call(sm, "POST", "/models/h1/invoke", json_body())
    assert r.status == 404


def test_a_load_reads_only_a_real_model_directory(sm, tmp_path):
    def load(name, url):
        return call(sm, "POST", "/models", json.dumps({"model_name": name, "url": str(url)}))

    r = load("h2", tmp_path / "missing")
    assert r.status == 400 and "failed to load 'h2'" in r.json()["error"]
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"not for clients")
    assert load("h2", secret).status == 400
    leaky = simple_dir(tmp_path / "leaky")
    os.symlink(secret, leaky / "1" / "extra.bin")
    r = load("h2", leaky)
    assert r.status == 400 and "links outside the model directory" in r.json()["error"], r
    # A repository of two models without one named as the target is ambiguous.
    repo = tmp_path / "two"
    simple_dir(repo / "a", "a")
    simple_dir(repo / "b", "b")
    r = load("h2", repo)
    assert r.status == 400 and "none is named 'h2'" in r.json()["error"]
    r = load("..", repo)
    assert r.status == 400 and "invalid model name" in r.json()["error"]
    # The repository's model named as the target is the one loaded.
    r = load("b", repo)
    assert r.status == 200, r
    assert call(sm, "DELETE", "/models/b").status == 200
    assert call(sm, "GET", "/models").json() == {"models": []}


def test_loads_need_explicit_control_and_the_restricted_header(mesh_bin, server_env, tmp_path):
    url = simple_dir(tmp_path / "m" / "model")
    srv = start_server(mesh_bin, server_env, tmp_path,
                       ["--http-restricted-api", "model-repository:admin=s3cret", "--http-max-input-size", "4096"])
    try:
        load = json.dumps({"model_name": "h", "url": str(url)})
        r = call(srv, "POST", "/models", load)
        assert r.status == 403
        assert r.json() == {"error": "This API is restricted, expecting header 'admin'"}
        assert call(srv, "GET", "/models").status == 403
        assert call(srv, "DELETE", "/models/h").status == 403
        r = call(srv, "POST", "/models", load, {"admin": "s3cret"})
        assert r.status == 400
        assert r.json()["error"] == "explicit model load / unload is not allowed if polling is enabled"
        # Not explicit: the unnamed default model, and bodies within --http-max-input-size.
        r = call(srv, "POST", "/invocations", json_body())
        assert r.status == 404
        assert "unspecified_SAGEMAKER_TRITON_DEFAULT_MODEL_NAME" in r.json()["error"]
        r = call(srv, "POST", "/invocations", b"{" + b" " * 8192 + b"}")
        assert r.status == 413
    finally:
        srv.stop()


def test_the_frontend_is_off_by_default_and_ports_are_checked(mesh_bin, server_env, tmp_path):
    (tmp_path / "repo").mkdir()
    http, grpc, metrics, sagemaker = free_ports(4)
    base = [str(mesh_bin), "--model-repository", str(tmp_path / "repo"), "--http-port", str(http),
            "--grpc-port", str(grpc), "--metrics-port", str(metrics), "--sagemaker-port", str(sagemaker)]
    log = tmp_path / "off.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(base, stdout=out, stderr=subprocess.STDOUT, env=server_env)
    try:
        wait_live(proc, http, log)
        with pytest.raises(ConnectionRefusedError):
            http_request(sagemaker, "GET", "/ping", timeout=2)
    finally:
        stop_process(proc)
    ranged = base + ["--allow-sagemaker", "true", "--sagemaker-safe-port-range", f"{sagemaker + 1}-{sagemaker + 2}"]
    done = subprocess.run(ranged, capture_output=True, text=True, env=server_env, timeout=60)
    assert done.returncode != 0
    assert (f"The server cannot listen to HTTP requests at port {http}, allowed port range is "
            f"[{sagemaker + 1}, {sagemaker + 2}]") in done.stdout + done.stderr
    same = base[:-1] + [str(http), "--allow-sagemaker", "true"]
    done = subprocess.run(same, capture_output=True, text=True, env=server_env, timeout=60)
    assert done.returncode != 0
    assert "at the same address and port" in done.stdout + done.stderr
