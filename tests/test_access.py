"""Who may change what (issue 24, item 1), with real processes:

- a router refuses repository load/unload outside explicit mode (none, poll) with Triton's 503, and
  a load carrying a `file:1/model.py` override runs no code anywhere;
- a model name that is not one path component is refused with 400 over HTTP and gRPC, on a node and
  on a router, and nothing is written outside the repository;
- the router's operator API (/mesh/v1) is the restricted group `cluster`: without its header it is
  403, with it (and through `mesh-ops --header` or MESH_OPS_HEADER) it answers; without a `cluster`
  rule its changes are answered only to clients on the router's host (checked from a network
  namespace); `scale` refuses max 0.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import netns
from cluster_util import MeshRouter, copy_models, wait_until
from mesh_util import http_request

pytestmark = [pytest.mark.server]

TRITON_MODE_MESSAGE = "explicit model load / unload is not allowed if polling is enabled"
NAME_RULE = "a model name must be one path component"


def pwn_load(marker: Path) -> tuple[str, dict]:
    """A Python model whose import and initialize() would leave `marker` behind."""
    code = (f"open({str(marker)!r}, 'a').write('imported\\n')\n"
            "class TritonPythonModel:\n"
            "    def initialize(self, args):\n"
            f"        open({str(marker)!r}, 'a').write('initialized\\n')\n"
            "    def execute(self, requests):\n"
            "        return []\n")
    config = json.dumps({"name": "pwn", "backend": "python", "max_batch_size": 0,
                         "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}],
                         "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1]}]})
    return config, {"file:1/model.py": code.encode()}


def load_body(config: str, files: dict) -> bytes:
    import base64
    params = {"config": config}
    params.update({k: base64.b64encode(v).decode() for k, v in files.items()})
    return json.dumps({"parameters": params}).encode()


@pytest.mark.cluster
@pytest.mark.parametrize("mode", ["none", "poll"])
def test_a_router_outside_explicit_mode_refuses_loads_and_runs_no_code(cluster_factory, models_dir, tmp_path, mode):
    c = cluster_factory()
    repo = copy_models(models_dir / "simple", tmp_path / "repo", ["add_sub"])
    c.start_router([repo], ["--model-control-mode", mode, "--repository-poll-secs", "1"])
    c.start_node("n1", [], ["--cluster-cache", str(tmp_path / "cache"),
                            "--backend-config", f"python,interpreter={sys.executable}"], wait_models=[])
    marker = tmp_path / "pwned"
    config, files = pwn_load(marker)
    for path, body in (("/v2/repository/models/pwn/load", load_body(config, files)),
                       ("/v2/repository/models/pwn/unload", b"{}")):
        r = http_request(c.router.http_port, "POST", path, body=body)
        assert r.status == 503, (path, r.status, r.body)
        assert json.loads(r.body) == {"error": TRITON_MODE_MESSAGE}
    g = grpcclient.InferenceServerClient(c.router.grpc_url)
    with pytest.raises(InferenceServerException, match="not allowed if polling is enabled") as e:
        g.load_model("pwn", config=config, files=files)
    assert e.value.status() == "StatusCode.UNAVAILABLE"
    g.close()
    assert not marker.exists(), marker.read_text()
    assert "pwn" not in {m["name"] for m in c.view()["models"]}


def traversal_names(tmp: Path) -> list[str]:
    return [f"../../../../../../..{tmp}/esc-rel", f"{tmp}/esc-abs", "..", "a\\b"]


def check_nothing_escaped(tmp: Path) -> None:
    assert not (tmp / "esc-rel").exists() and not (tmp / "esc-abs").exists(), sorted(p.name for p in tmp.iterdir())


def refuse_traversal_names(http_port: int, grpc_url: str, tmp: Path) -> None:
    from urllib.parse import quote
    files = {"file:x": b"written?"}
    config = json.dumps({"backend": "python"})
    for name in traversal_names(tmp):
        r = http_request(http_port, "POST", f"/v2/repository/models/{quote(name, safe='')}/load",
                         body=load_body(config, files))
        assert r.status == 400, (name, r.status, r.body)
        assert NAME_RULE in json.loads(r.body)["error"], r.body
        r = http_request(http_port, "POST", f"/v2/repository/models/{quote(name, safe='')}/unload", body=b"{}")
        assert r.status == 400, (name, r.status, r.body)
    g = grpcclient.InferenceServerClient(grpc_url)
    for name in traversal_names(tmp):
        with pytest.raises(InferenceServerException, match=NAME_RULE) as e:
            g.load_model(name, config=config, files=files)
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    g.close()
    check_nothing_escaped(tmp)


def test_traversal_names_are_refused_on_a_node(fresh_server, models_dir, tmp_path):
    repo = copy_models(models_dir / "simple", tmp_path / "repo", ["add_sub"])
    srv = fresh_server([repo], ["--model-control-mode", "explicit"], wait_models=[])
    refuse_traversal_names(srv.http_port, srv.grpc_url, tmp_path)
    # A config's default_model_filename that leaves the model's directory does not load either.
    cfg = json.dumps({"name": "add_sub", "platform": "onnxruntime_onnx", "max_batch_size": 8,
                      "default_model_filename": "../../../add_sub/1/model.onnx"})
    with pytest.raises(InferenceServerException, match="default_model_filename .* must be a file inside"):
        httpclient.InferenceServerClient(srv.http_url).load_model("add_sub", config=cfg)


@pytest.mark.cluster
def test_traversal_names_are_refused_on_a_router(cluster_factory, models_dir, tmp_path):
    c = cluster_factory()
    c.start_router([copy_models(models_dir / "simple", tmp_path / "repo", ["add_sub"])],
                   ["--model-control-mode", "explicit"])
    refuse_traversal_names(c.router.http_port, c.router.grpc_url, tmp_path)


def ops(cluster_bins, *args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(cluster_bins["ops"]), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


@pytest.mark.cluster
def test_the_operator_api_is_the_restricted_cluster_group(cluster_factory, cluster_bins, models_dir, tmp_path):
    c = cluster_factory()
    secret = uuid.uuid4().hex
    c.start_router([copy_models(models_dir / "simple", tmp_path / "repo", ["add_sub"])],
                   ["--http-restricted-api", f"cluster:admin-key={secret}"])
    port = c.router.http_port
    for method, path in (("GET", "/mesh/v1/cluster"), ("POST", "/mesh/v1/models/add_sub/scale"),
                         ("POST", "/mesh/v1/nodes/n1/drain?timeout_s=1")):
        r = http_request(port, method, path, body=b'{"min": 1}' if method == "POST" else None)
        assert r.status == 403, (path, r.status, r.body)
        assert json.loads(r.body) == {"error": "This API is restricted, expecting header 'admin-key'"}
        r = http_request(port, method, path, body=b'{"min": 1}' if method == "POST" else None,
                         headers={"admin-key": "wrong"})
        assert r.status == 403
    ok = {"admin-key": secret}
    assert http_request(port, "GET", "/mesh/v1/cluster", headers=ok).status == 200
    wait_until(lambda: "add_sub" in [m["name"] for m in json.loads(
        http_request(port, "GET", "/mesh/v1/cluster", headers=ok).body)["placement"]["models"]],
        30, "the router reads its repository")
    r = http_request(port, "POST", "/mesh/v1/models/add_sub/scale", body=b'{"max": 0}', headers=ok)
    assert r.status == 400 and b"unload" in r.body, r.body
    r = http_request(port, "POST", "/mesh/v1/models/add_sub/scale", body=b'{"min": 1, "max": 2}', headers=ok)
    assert r.status == 200, r.body
    assert json.loads(r.body) == {"model": "add_sub", "min": 1, "max": 2}
    # KServe v2 stays open: only the cluster group was named.
    assert http_request(port, "GET", "/v2/health/live").status == 200

    router = ["--router", c.router.http_url]
    denied = ops(cluster_bins, "status", *router)
    assert denied.returncode != 0 and "admin-key" in denied.stderr, denied.stderr
    assert ops(cluster_bins, "status", *router, "--header", f"admin-key={secret}").returncode == 0
    by_env = ops(cluster_bins, "scale", "add_sub", "--max", "3", *router, env={"MESH_OPS_HEADER": f"admin-key={secret}"})
    assert by_env.returncode == 0, by_env.stderr
    assert secret not in ops(cluster_bins, "--help").stdout


@pytest.mark.cluster
def test_without_a_cluster_rule_only_local_clients_change_the_cluster(cluster_factory, cluster_bins, models_dir,
                                                                     tmp_path):
    why = netns.unavailable()
    if why:
        pytest.skip(why)
    c = cluster_factory()

    class WideRouter(MeshRouter):
        """HTTP on every address, so that a namespace's host reaches it by the bridge's address."""

        def command(self):
            cmd = super().command()
            cmd[cmd.index("--http-address") + 1] = "0.0.0.0"
            return cmd

    r = WideRouter(cluster_bins["router"], [copy_models(models_dir / "simple", tmp_path / "repo", ["add_sub"])],
                   c.certs.args("router", "router"), c._log("router"), c.env)
    c._track(r, "router")
    c.router = r.start([], timeout=60)
    port = r.http_port
    wait_until(lambda: "add_sub" in [m["name"] for m in c.view()["placement"]["models"]], 30,
               "the router reads its repository")
    r = http_request(port, "POST", "/mesh/v1/models/add_sub/scale", body=b'{"min": 1, "max": 2}')
    assert r.status == 200, r.body
    net = netns.Network("acc")
    try:
        host = net.add("client")
        log = tmp_path / "client.log"
        script = (
            "import http.client, json\n"
            "for method, path, body in (('POST', '/mesh/v1/models/add_sub/scale', b'{\"min\": 1, \"max\": 3}'),\n"
            "                           ('POST', '/mesh/v1/nodes/n1/drain?timeout_s=1', b''),\n"
            "                           ('GET', '/mesh/v1/cluster', None)):\n"
            f"    c = http.client.HTTPConnection('{net.subnet}.254', {port}, timeout=10)\n"
            "    c.request(method, path, body=body, headers={'Content-Type': 'application/json'})\n"
            "    r = c.getresponse()\n"
            "    print('STATUS', method, path, r.status, r.read().decode()[:200])\n"
        )
        p = host.popen([sys.executable, "-c", script], log)
        assert p.wait(30) == 0, log.read_text()
        lines = [ln for ln in log.read_text().splitlines() if ln.startswith("STATUS")]
        assert len(lines) == 3, log.read_text()
        assert lines[0].split()[3] == "403" and "--http-restricted-api" in lines[0], lines[0]
        assert lines[1].split()[3] == "403", lines[1]
        assert lines[2].split()[3] == "200", lines[2]
    finally:
        net.close()
    # The refused change did not happen (the bounds are not the namespace client's 1..3).
    view = c.view()["placement"]["models"]
    bounds = [(m["min"], m["max"]) for m in view if m["name"] == "add_sub"]
    assert len(bounds) == 1 and bounds[0] != (1, 3), bounds
