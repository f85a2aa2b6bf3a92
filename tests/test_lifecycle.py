"""Process lifecycle: graceful shutdown on SIGTERM/SIGINT with idle
keep-alive connections open, and --strict-readiness."""

import http.client
import signal
import socket
import subprocess

import pytest
import tritonclient.grpc as grpcclient

import gen_models
from mesh_util import HOST

pytestmark = [pytest.mark.server, pytest.mark.lifecycle]

EXIT_TIMEOUT = 30    # --exit-timeout-secs given to the server
EXIT_WAIT = 15       # well below EXIT_TIMEOUT: an idle connection must not hold the exit


def _refused(port):
    try:
        socket.create_connection((HOST, port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    except OSError:
        return True
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_graceful_shutdown_with_idle_keepalive(fresh_server, add_sub_repo, sig):
    srv = fresh_server([add_sub_repo], ["--exit-timeout-secs", str(EXIT_TIMEOUT)])

    # an HTTP/1.1 keep-alive connection, used once and left idle
    conn = http.client.HTTPConnection(HOST, srv.http_port, timeout=10)
    conn.request("GET", "/v2/health/live")
    r = conn.getresponse()
    r.read()
    assert r.status == 200
    assert (r.getheader("Connection") or "").lower() != "close"
    # a gRPC (HTTP/2) channel, used once and left idle
    gc = grpcclient.InferenceServerClient(srv.grpc_url)
    assert gc.is_server_live()
    # a raw idle TCP connection that never sent a byte
    silent = socket.create_connection((HOST, srv.http_port), timeout=10)

    srv.signal(sig)
    try:
        rc = srv.proc.wait(timeout=EXIT_WAIT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"mesh-node still running {EXIT_WAIT}s after {sig.name} with idle connections open "
                    f"(exit timeout {EXIT_TIMEOUT}s)")
    finally:
        gc.close()
    assert rc == 0, f"exit status {rc} after {sig.name}"

    # the idle connections were closed by the server
    for sock in (conn.sock, silent):
        sock.settimeout(5)
        try:
            assert sock.recv(1) == b""
        except ConnectionResetError:
            pass
    conn.close()
    silent.close()

    # and nothing listens any more
    for port in (srv.http_port, srv.grpc_port, srv.metrics_port):
        assert _refused(port), f"port {port} still accepts connections after exit"


def test_shutdown_after_traffic(fresh_server, add_sub_repo):
    """SIGTERM right after inference requests: still a clean exit."""
    import numpy as np
    import tritonclient.http as httpclient
    srv = fresh_server([add_sub_repo], ["--exit-timeout-secs", str(EXIT_TIMEOUT)])
    c = httpclient.InferenceServerClient(srv.http_url)
    try:
        for _ in range(5):
            ins = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
            ins[0].set_data_from_numpy(np.ones((1, 16), np.float32))
            ins[1].set_data_from_numpy(np.ones((1, 16), np.float32))
            assert (c.infer("add_sub", ins).as_numpy("OUTPUT0") == 2).all()
        srv.signal(signal.SIGTERM)
        rc = srv.proc.wait(timeout=EXIT_WAIT)
    finally:
        c.close()
    assert rc == 0


def test_strict_readiness_true_with_broken_model(fresh_server, models_dir):
    srv = fresh_server([models_dir / "broken"], ["--strict-readiness", "true", "--exit-on-error", "false"],
                       wait_models=["good"])
    srv.settle(gen_models.BROKEN_MODELS)
    assert srv.get("/v2/health/live").status == 200
    r = srv.get("/v2/health/ready")
    assert r.status != 200, "strict readiness: a failed model must make the server not ready"
    assert r.status in (400, 503), r
    # the healthy model still serves
    assert srv.get("/v2/models/good/ready").status == 200
    gc = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        assert gc.is_server_live()
        assert not gc.is_server_ready()
    finally:
        gc.close()


def test_strict_readiness_true_all_good(fresh_server, add_sub_repo):
    srv = fresh_server([add_sub_repo], ["--strict-readiness", "true"])
    assert srv.get("/v2/health/ready").status == 200


def _expect_exit_nonzero(fresh_server, repos, wait_models, args=()):
    """The server must stop by itself with a non-zero status, whether or not
    it got as far as answering HTTP first."""
    from mesh_util import ServerStartError
    try:
        srv = fresh_server(repos, list(args), wait_models=wait_models)
    except ServerStartError as e:
        assert "exited with" in str(e), e
        assert "exited with 0 " not in str(e), e
        return
    try:
        rc = srv.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("mesh-node kept running")
    assert rc != 0


def test_exit_on_error_true_stops_server(fresh_server, models_dir):
    """--exit-on-error true (tritonserver's default): a model that fails to load
    at start-up stops the server."""
    _expect_exit_nonzero(fresh_server, [models_dir / "broken"], ["good"], ["--exit-on-error", "true"])


def test_exit_on_error_default_keeps_serving(fresh_server, models_dir):
    """The mesh's default differs from tritonserver's on purpose: a model that
    fails to load is reported, and every other model keeps serving."""
    srv = fresh_server([models_dir / "broken"], wait_models=["good"])
    srv.settle(gen_models.BROKEN_MODELS)
    assert srv.proc.poll() is None
    assert srv.get("/v2/models/good/ready").status == 200
    assert srv.get("/v2/models/corrupt_onnx/ready").status != 200


def test_missing_repository_fails_fast(fresh_server, tmp_path):
    """A --model-repository that does not exist: the server refuses to start
    (exits non-zero) rather than serving nothing."""
    _expect_exit_nonzero(fresh_server, [tmp_path / "does-not-exist"], [])
