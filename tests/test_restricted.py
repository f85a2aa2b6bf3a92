"""Triton's restricted APIs (issue 15): `--http-restricted-api` and `--grpc-restricted-protocol` put
groups of endpoints behind a header. Without the header (or with a wrong value) a request gets
Triton's refusal (HTTP 403 "This API is restricted, expecting header '<key>'", gRPC UNAVAILABLE
"This protocol is restricted ..."); with it, the request is served; groups not listed stay open; a
bad flag stops the server at start with Triton's message. The router takes the same flags."""
import shutil
import subprocess

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from cluster_util import add_sub_inputs

pytestmark = [pytest.mark.server]

ADMIN = {"admin-key": "admin-value"}
INFER = {"infer-key": "infer-value"}
RULES = ["model-repository:admin-key=admin-value", "inference,metadata:infer-key=infer-value"]


def flags(rules=RULES) -> list[str]:
    out = []
    for r in rules:
        out += ["--http-restricted-api", r, "--grpc-restricted-protocol", r]
    return out


@pytest.fixture
def node(fresh_server, models_dir, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(models_dir / "simple" / "add_sub", repo / "add_sub")
    return fresh_server([repo], ["--model-control-mode", "explicit", "--load-model", "add_sub"] + flags(),
                        wait_models=["add_sub"])


def infer(client, mod, headers=None):
    a, b = add_sub_inputs(1)
    ins = [mod.InferInput("INPUT0", [1, 16], "FP32"), mod.InferInput("INPUT1", [1, 16], "FP32")]
    ins[0].set_data_from_numpy(a)
    ins[1].set_data_from_numpy(b)
    # A copy: tritonclient's HTTP infer adds its own entries to the dict it is given.
    r = client.infer("add_sub", ins, headers=dict(headers) if headers else None)
    assert np.array_equal(r.as_numpy("OUTPUT0"), a + b)


def test_http_groups_need_their_header(node):
    c = httpclient.InferenceServerClient(node.http_url)
    # Open groups: health and statistics.
    assert c.is_server_live() and c.get_inference_statistics("add_sub")
    with pytest.raises(InferenceServerException, match="This API is restricted, expecting header 'infer-key'"):
        infer(c, httpclient)
    with pytest.raises(InferenceServerException, match="expecting header 'infer-key'"):
        infer(c, httpclient, {"infer-key": "wrong"})
    infer(c, httpclient, INFER)
    with pytest.raises(InferenceServerException, match="expecting header 'infer-key'"):
        c.get_model_metadata("add_sub")
    assert c.get_model_metadata("add_sub", headers=INFER)["name"] == "add_sub"
    # The other group's header does not open this one.
    with pytest.raises(InferenceServerException, match="expecting header 'admin-key'"):
        c.unload_model("add_sub", headers=INFER)
    c.unload_model("add_sub", headers=ADMIN)
    c.load_model("add_sub", headers=ADMIN)
    r = node.post("/v2/repository/index", b"{}")
    assert r.status == 403 and "admin-key" in r.error_message()
    c.close()


def grpc_headers(headers: dict) -> dict:
    """gRPC metadata for a restricted protocol group, as Triton reads it (and PyTriton sends it)."""
    return {f"triton-grpc-protocol-{k}": v for k, v in headers.items()}


def test_grpc_methods_need_their_header(node):
    c = grpcclient.InferenceServerClient(node.grpc_url)
    assert c.is_server_ready()
    expect = "This protocol is restricted, expecting header 'triton-grpc-protocol-infer-key'"
    with pytest.raises(InferenceServerException, match=expect) as e:
        infer(c, grpcclient)
    assert "UNAVAILABLE" in str(e.value.status())
    # The bare key, which HTTP takes, is not what Triton reads on gRPC.
    with pytest.raises(InferenceServerException, match=expect):
        infer(c, grpcclient, INFER)
    infer(c, grpcclient, grpc_headers(INFER))
    with pytest.raises(InferenceServerException, match="expecting header 'triton-grpc-protocol-admin-key'"):
        c.get_model_repository_index()
    assert c.get_model_repository_index(headers=grpc_headers(ADMIN))
    c.close()


@pytest.mark.parametrize("rules,message", [
    (["model-repository,health:k1=v1", "metadata,health:k2=v2"], "api 'health' can not be specified in multiple config groups"),
    (["model-reposit,health:k1=v1"], "unknown restricted api 'model-reposit'"),
    (["health"], "must be <apis>:<key>=<value>"),
])
def test_bad_flags_stop_the_server_at_start_with_the_reason(mesh_bin, server_env, tmp_path, rules, message):
    args = [str(mesh_bin), "--model-repository", str(tmp_path), "--http-port", "0", "--grpc-port", "0",
            "--metrics-port", "0"]
    for r in rules:
        args += ["--http-restricted-api", r]
    run = subprocess.run(args, capture_output=True, text=True, timeout=30, env=server_env)
    assert run.returncode != 0 and message in run.stdout + run.stderr, run.stdout + run.stderr


@pytest.mark.cluster
def test_the_router_restricts_the_same_way(cluster_factory, models_dir, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(models_dir / "simple" / "add_sub", repo / "add_sub")
    c = cluster_factory()
    c.start_router([], flags(["inference:infer-key=infer-value"]))
    c.start_node("n1", [repo])
    client = httpclient.InferenceServerClient(c.router.http_url)
    with pytest.raises(InferenceServerException, match="expecting header 'infer-key'"):
        infer(client, httpclient)
    infer(client, httpclient, INFER)
    client.close()
