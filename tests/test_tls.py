"""Client-facing TLS (issue 24, item 1), with tritonclient and curl against a real mesh-node:

- gRPC with tritonserver's flags (`--grpc-use-ssl-mutual=true`, `--grpc-server-cert`,
  `--grpc-server-key`, `--grpc-root-cert`): a client with a certificate from the trusted CA infers;
  one without a certificate, or with one from another CA, is refused;
- HTTPS (`--http-tls-cert`, `--http-tls-key`): tritonclient with `ssl=True` and curl with the CA
  infer and read health; a plain-HTTP client gets no answer; with `--http-tls-client-ca`, a client
  without a trusted certificate is refused at the handshake;
- a start with `--grpc-use-ssl` and no certificate fails, naming the flags.
"""
from __future__ import annotations

import http.client
import json
import shutil
import socket
import ssl
import subprocess
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from cluster_util import ClusterCerts, copy_models
from mesh_util import HOST, MeshServer, ServerStartError

pytestmark = [pytest.mark.server]


@pytest.fixture(scope="module")
def pki(cluster_bins, tmp_path_factory):
    """A CA with a server certificate for 127.0.0.1 and a client certificate, and a second CA."""
    ca = ClusterCerts(cluster_bins["ops"], tmp_path_factory.mktemp("tls-ca"))
    res = ca.ops_run("certs", "issue", str(ca.dir), "server", "--role", "server", "--ip", HOST,
                     "--dns", "localhost")
    assert res.returncode == 0, res.stderr
    ca.issue("client", "client")
    other = ClusterCerts(cluster_bins["ops"], tmp_path_factory.mktemp("tls-other"))
    other.issue("client", "client")
    return ca, other


class TlsServer(MeshServer):
    """A mesh-node whose readiness is read over HTTPS with `context`."""

    def __init__(self, *a, context: ssl.SSLContext, **kw):
        super().__init__(*a, **kw)
        self.context = context

    def wait_up(self, wait_models, timeout):
        deadline = time.monotonic() + timeout
        while True:
            try:
                if https_get(self.http_port, "/v2/health/ready", self.context)[0] == 200:
                    break
            except (OSError, ssl.SSLError):
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise ServerStartError(f"mesh-node with TLS not up; log {self.log_path}:\n{self.log_tail(40)}")
            time.sleep(0.1)
        while True:
            try:
                socket.create_connection((HOST, self.grpc_port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)


def https_get(port, path, context):
    c = http.client.HTTPSConnection(HOST, port, context=context, timeout=5)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def start(mesh_bin, server_env, models_dir, tmp_path, args, context) -> TlsServer:
    repo = copy_models(models_dir / "simple", tmp_path / "repo", ["add_sub"])
    srv = TlsServer(mesh_bin, [repo], args, tmp_path / "node.log", server_env, context=context)
    return srv.start(["add_sub"], timeout=60)


def add_sub(module):
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    ins = [module.InferInput("INPUT0", [1, 16], "FP32"), module.InferInput("INPUT1", [1, 16], "FP32")]
    ins[0].set_data_from_numpy(a)
    ins[1].set_data_from_numpy(a)
    return ins, a + a


def test_grpc_mutual_tls_and_https_with_tritonclient_and_curl(mesh_bin, server_env, models_dir, tmp_path, pki):
    ca, other = pki
    d = ca.dir
    args = ["--grpc-use-ssl-mutual=true", "--grpc-server-cert", str(d / "server.pem"),
            "--grpc-server-key", str(d / "server.key"), "--grpc-root-cert", str(d / "ca.pem"),
            "--http-tls-cert", str(d / "server.pem"), "--http-tls-key", str(d / "server.key")]
    context = ssl.create_default_context(cafile=str(d / "ca.pem"))
    srv = start(mesh_bin, server_env, models_dir, tmp_path, args, context)
    try:
        # gRPC: the trusted client infers.
        g = grpcclient.InferenceServerClient(f"{HOST}:{srv.grpc_port}", ssl=True,
                                             root_certificates=str(d / "ca.pem"),
                                             private_key=str(d / "client.key"),
                                             certificate_chain=str(d / "client.pem"))
        ins, want = add_sub(grpcclient)
        np.testing.assert_array_equal(g.infer("add_sub", ins).as_numpy("OUTPUT0"), want)
        g.close()
        # No client certificate, or one from another CA: refused.
        for key, chain in ((None, None), (str(other.dir / "client.key"), str(other.dir / "client.pem"))):
            g = grpcclient.InferenceServerClient(f"{HOST}:{srv.grpc_port}", ssl=True,
                                                 root_certificates=str(d / "ca.pem"),
                                                 private_key=key, certificate_chain=chain)
            with pytest.raises(InferenceServerException):
                g.is_server_live(client_timeout=5)
            g.close()
        # A client that does not speak TLS gets nothing from gRPC.
        g = grpcclient.InferenceServerClient(f"{HOST}:{srv.grpc_port}")
        with pytest.raises(InferenceServerException):
            g.is_server_live(client_timeout=5)
        g.close()

        # HTTPS with tritonclient.
        import gevent.ssl
        h = httpclient.InferenceServerClient(
            f"{HOST}:{srv.http_port}", ssl=True,
            ssl_context_factory=lambda *a, **kw: gevent.ssl.create_default_context(cafile=str(d / "ca.pem")))
        ins, want = add_sub(httpclient)
        np.testing.assert_array_equal(h.infer("add_sub", ins).as_numpy("OUTPUT0"), want)
        assert h.is_model_ready("add_sub")
        h.close()
        # A plain HTTP request on the HTTPS port gets no HTTP answer.
        with pytest.raises((http.client.HTTPException, OSError)):
            c = http.client.HTTPConnection(HOST, srv.http_port, timeout=5)
            c.request("GET", "/v2/health/ready")
            c.getresponse()
        # curl with the CA.
        if shutil.which("curl"):
            out = subprocess.run(["curl", "-sS", "--cacert", str(d / "ca.pem"), "-o", "/dev/null", "-w", "%{http_code}",
                                  f"https://{HOST}:{srv.http_port}/v2/health/ready"],
                                 capture_output=True, text=True, timeout=30)
            assert out.stdout == "200", (out.stdout, out.stderr)
            bad = subprocess.run(["curl", "-sS", f"https://{HOST}:{srv.http_port}/v2/health/ready"],
                                 capture_output=True, text=True, timeout=30)
            assert bad.returncode != 0, "curl trusted a certificate of the project's own CA without --cacert"
    finally:
        srv.stop()


def test_https_with_a_client_ca_refuses_clients_without_a_trusted_certificate(mesh_bin, server_env, models_dir,
                                                                             tmp_path, pki):
    ca, other = pki
    d = ca.dir
    trusted = ssl.create_default_context(cafile=str(d / "ca.pem"))
    trusted.load_cert_chain(str(d / "client.pem"), str(d / "client.key"))
    args = ["--http-tls-cert", str(d / "server.pem"), "--http-tls-key", str(d / "server.key"),
            "--http-tls-client-ca", str(d / "ca.pem")]
    srv = start(mesh_bin, server_env, models_dir, tmp_path, args, trusted)
    try:
        status, body = https_get(srv.http_port, "/v2/models/add_sub", trusted)
        assert status == 200 and json.loads(body)["name"] == "add_sub"
        anonymous = ssl.create_default_context(cafile=str(d / "ca.pem"))
        foreign = ssl.create_default_context(cafile=str(d / "ca.pem"))
        foreign.load_cert_chain(str(other.dir / "client.pem"), str(other.dir / "client.key"))
        for ctx in (anonymous, foreign):
            with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
                https_get(srv.http_port, "/v2/health/ready", ctx)
        if shutil.which("curl"):
            ok = subprocess.run(["curl", "-sS", "--cacert", str(d / "ca.pem"), "--cert", str(d / "client.pem"),
                                 "--key", str(d / "client.key"), "-o", "/dev/null", "-w", "%{http_code}",
                                 f"https://{HOST}:{srv.http_port}/v2/health/ready"],
                                capture_output=True, text=True, timeout=30)
            assert ok.stdout == "200", (ok.stdout, ok.stderr)
            no = subprocess.run(["curl", "-sS", "--cacert", str(d / "ca.pem"),
                                 f"https://{HOST}:{srv.http_port}/v2/health/ready"],
                                capture_output=True, text=True, timeout=30)
            assert no.returncode != 0
    finally:
        srv.stop()


def test_tls_flags_without_their_files_stop_the_start(mesh_bin, server_env, tmp_path, pki):
    ca, _ = pki
    for args, words in ((["--grpc-use-ssl=true"], "--grpc-server-cert and --grpc-server-key"),
                        (["--grpc-use-ssl-mutual", "--grpc-server-cert", str(ca.dir / "server.pem"),
                          "--grpc-server-key", str(ca.dir / "server.key")], "--grpc-root-cert"),
                        (["--http-tls-cert", str(ca.dir / "server.pem")], "--http-tls-key"),
                        (["--http-tls-cert", str(tmp_path / "missing.pem"), "--http-tls-key",
                          str(ca.dir / "server.key")], "missing.pem")):
        r = subprocess.run([str(mesh_bin), "--model-repository", str(tmp_path), "--http-port", "0", "--grpc-port", "0",
                            "--metrics-port", "0", *args], capture_output=True, text=True, timeout=60, env=server_env)
        assert r.returncode != 0, (args, r.stderr[-2000:])
        assert words in r.stdout + r.stderr, (args, (r.stdout + r.stderr)[-2000:])
