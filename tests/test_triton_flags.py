"""tritonserver 2.51's command line on mesh-node (issue 27): every flag of its `--help`, read from a
fixture, starts a serving node, and a flag with no effect says so in the log with its reason; the
flags that mean something for the mesh (`--id`, `--log-file`, `--log-format`, the legacy `--trace-*`
and `--response-cache-byte-size`, gRPC compression, the rate limiter) do what tritonserver's do."""
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from mesh_util import HOST, free_ports, stop_process, wait_live

pytestmark = [pytest.mark.server]

FIXTURE = Path(__file__).parent / "fixtures" / "tritonserver-2.51-flags.txt"

# Flags the mesh serves as tritonserver does; every other flag of the fixture must be logged as
# accepted without effect.
WITH_EFFECT = {
    "--id", "--exit-timeout-secs", "--log-verbose", "--log-info", "--log-warning", "--log-error",
    "--log-format", "--log-file", "--model-store", "--model-repository", "--exit-on-error",
    "--strict-readiness", "--model-control-mode", "--repository-poll-secs", "--load-model",
    "--allow-http", "--http-address", "--http-port", "--http-header-forward-pattern",
    "--http-restricted-api", "--allow-grpc", "--grpc-address", "--grpc-port",
    "--grpc-header-forward-pattern", "--grpc-use-ssl", "--grpc-use-ssl-mutual", "--grpc-server-cert",
    "--grpc-server-key", "--grpc-root-cert", "--grpc-infer-response-compression-level",
    "--grpc-keepalive-time", "--grpc-keepalive-timeout", "--grpc-max-connection-age",
    "--grpc-max-connection-age-grace", "--grpc-restricted-protocol", "--allow-metrics",
    "--metrics-address", "--metrics-port", "--trace-config", "--backend-config", "--cache-config",
    "--response-cache-byte-size", "--trace-file", "--trace-level", "--trace-rate", "--trace-count",
    "--trace-log-frequency", "--rate-limit", "--rate-limit-resource", "--model-config-name",
    "--model-namespacing", "--model-load-gpu-limit",
    "--disable-auto-complete-config", "--strict-model-config", "--model-load-retry-count",
    "--allow-cpu-metrics", "--metrics-interval-ms", "--reuse-http-port", "--reuse-grpc-port",
    "--metrics-config", "--model-load-thread-count", "--allow-gpu-metrics",
    "--allow-sagemaker", "--sagemaker-port", "--sagemaker-safe-port-range",
}

# A value tritonserver would take for each flag that needs more than its type suggests.
VALUES = {
    "--model-control-mode": "explicit", "--load-model": "absent_model", "--log-format": "ISO8601",
    "--http-address": HOST, "--grpc-address": HOST, "--metrics-address": HOST,
    "--grpc-use-ssl": "false", "--grpc-use-ssl-mutual": "false", "--exit-timeout-secs": "1",
    "--grpc-infer-response-compression-level": "high", "--sagemaker-safe-port-range": "8080-8090",
    "--rate-limit": "execution_count", "--rate-limit-resource": "R1:10:0", "--trace-config": "rate=100",
    "--backend-config": "python,shm-default-byte-size=1048576", "--cache-config": "local,size=1048576",
    "--metrics-config": "summary_latencies=true", "--trace-level": "TIMESTAMPS",
    "--http-restricted-api": "model-repository:k=v", "--grpc-restricted-protocol": "model-repository:k=v",
    "--cuda-memory-pool-byte-size": "0:67108864", "--cuda-virtual-address-size": "0:1073741824",
    "--model-load-gpu-limit": "0:0.5", "--host-policy": "gpu_0,numa-node=0", "--id": "triton",
    "--grpc-keepalive-time": "7200000", "--grpc-max-connection-age": "60000",
    "--metrics-interval-ms": "2000", "--min-supported-compute-capability": "6.0",
    "--pinned-memory-pool-byte-size": "268435456", "--response-cache-byte-size": "1048576",
    # On, SageMaker would listen on its fixed default port 8080 (test_sagemaker.py runs it on).
    "--allow-sagemaker": "false",
}


def fixture_flags() -> list[tuple[str, str]]:
    rows = [line.split(maxsplit=1) for line in FIXTURE.read_text().splitlines() if line.startswith("--")]
    return [(r[0], r[1] if len(r) > 1 else "") for r in rows]


def value_for(flag: str, kind: str, tmp: Path, ports: list[int]) -> list[str]:
    own = {"--http-port": ports[0], "--grpc-port": ports[1], "--metrics-port": ports[2]}
    if flag in own:
        return [flag, str(own[flag])]
    if flag in ("--model-repository", "--model-store"):
        return [flag, str(tmp / "repo")]
    if flag in ("--log-file", "--trace-file"):
        return [flag, str(tmp / flag.strip("-"))]
    if flag in VALUES:
        return [flag, VALUES[flag]]
    if not kind:
        return [flag]
    return [flag, {"<boolean>": "true", "<integer>": "1", "<float>": "1.0"}.get(kind, "x")]


def start(mesh_bin, env, tmp: Path, extra: list[str], ports=None):
    (tmp / "repo").mkdir(exist_ok=True)
    ports = ports or free_ports(3)
    log = tmp / "node.log"
    cmd = [str(mesh_bin), "--model-repository", str(tmp / "repo"), "--http-port", str(ports[0]),
           "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]), *extra]
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    return proc, ports, log


def test_the_fixture_is_tritonservers_whole_list():
    flags = [f for f, _ in fixture_flags()]
    assert len(flags) == 86 and len(set(flags)) == 86
    assert {"--backend-directory", "--model-store", "--trace-log-frequency", "--grpc-use-ssl"} <= set(flags)


@pytest.mark.parametrize("flag,kind", fixture_flags(), ids=[f for f, _ in fixture_flags()])
def test_mesh_node_starts_with_each_tritonserver_flag(flag, kind, mesh_bin, server_env, tmp_path):
    ports = free_ports(3)
    proc, ports, log = start(mesh_bin, server_env, tmp_path, value_for(flag, kind, tmp_path, ports), ports)
    try:
        wait_live(proc, ports[0], log)
    finally:
        stop_process(proc)
    text = (tmp_path / "log-file").read_text() if flag == "--log-file" else log.read_text()
    mine = [line for line in text.splitlines() if f"flag {flag} accepted without effect" in line]
    if flag in WITH_EFFECT:
        assert not mine, mine
    else:
        assert len(mine) == 1, f"{flag} must be logged once with its reason; log:\n{text[-2000:]}"
        assert len(mine[0].split("without effect:", 1)[1].strip()) > 10, mine[0]


def test_id_names_the_server_and_log_flags_shape_the_log(mesh_bin, server_env, tmp_path):
    logfile = tmp_path / "server.log"
    proc, ports, log = start(mesh_bin, server_env, tmp_path,
                             ["--id", "triton", "--log-file", str(logfile), "--log-format", "ISO8601"])
    try:
        wait_live(proc, ports[0], log)
        http = httpclient.InferenceServerClient(f"{HOST}:{ports[0]}")
        assert http.get_server_metadata()["name"] == "triton"
        grpc = grpcclient.InferenceServerClient(f"{HOST}:{ports[1]}")
        assert grpc.get_server_metadata().name == "triton"
        settings = http.get_log_settings()
        assert settings["log_file"] == str(logfile) and settings["log_format"] == "ISO8601"
        # The same file is not a change; another is refused.
        assert http.update_log_settings({"log_file": str(logfile)})["log_file"] == str(logfile)
        with pytest.raises(Exception, match="log_file cannot be changed"):
            http.update_log_settings({"log_file": str(tmp_path / "other.log")})
    finally:
        stop_process(proc)
    text = logfile.read_text()
    assert "HTTP service started" in text and "\x1b[" not in text
    assert os.stat(logfile).st_mode & 0o777 == 0o600
    assert "HTTP service started" not in log.read_text(), "with --log-file nothing is logged to stdout"


def test_a_log_file_that_is_a_symbolic_link_stops_the_start(mesh_bin, server_env, tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("")
    (tmp_path / "link.log").symlink_to(target)
    proc, _, log = start(mesh_bin, server_env, tmp_path, ["--log-file", str(tmp_path / "link.log")])
    assert proc.wait(20) != 0
    assert "cannot open --log-file" in log.read_text()
    assert target.read_text() == "", "nothing may be written through the link"


def test_legacy_trace_flags_set_the_trace_settings(mesh_bin, server_env, tmp_path):
    trace_file = tmp_path / "trace.json"
    proc, ports, log = start(mesh_bin, server_env, tmp_path,
                             ["--trace-file", str(trace_file), "--trace-level", "TIMESTAMPS",
                              "--trace-rate", "7", "--trace-count", "3", "--trace-log-frequency", "2"])
    try:
        wait_live(proc, ports[0], log)
        s = httpclient.InferenceServerClient(f"{HOST}:{ports[0]}").get_trace_settings()
        assert s["trace_level"] == ["TIMESTAMPS"] and s["trace_rate"] == "7"
        assert s["trace_count"] == "3" and s["log_frequency"] == "2" and s["trace_file"] == str(trace_file)
    finally:
        stop_process(proc)


def test_dash_leading_values_in_the_two_argument_form_start_the_node(mesh_bin, server_env, tmp_path):
    """Issue 55: tritonserver reads its flags with getopt_long, which takes the argument after a flag
    that needs a value as that value whatever it begins with, so start scripts say `--trace-count -1`;
    mesh-node starts with it unchanged. A value really missing still stops it, naming the flag."""
    proc, ports, log = start(mesh_bin, server_env, tmp_path,
                             ["--trace-count", "-1", "--trace-rate", "5", "--id", "-mesh"])
    try:
        wait_live(proc, ports[0], log, path="/v2/health/ready")
        http = httpclient.InferenceServerClient(f"{HOST}:{ports[0]}")
        settings = http.get_trace_settings()
        assert settings["trace_count"] == "-1" and settings["trace_rate"] == "5", settings
        assert http.get_server_metadata()["name"] == "-mesh"
    finally:
        stop_process(proc)
    missing = tmp_path / "missing"
    missing.mkdir()
    proc, _, log = start(mesh_bin, server_env, missing, ["--trace-count"])
    assert proc.wait(20) != 0
    assert "a value is required for '--trace-count <TRACE_COUNT>'" in log.read_text()


def test_gzip_requests_are_taken_and_answers_compressed_on_request(mesh_bin, server_env, tmp_path, models_dir):
    import shutil
    (tmp_path / "repo").mkdir()
    shutil.copytree(models_dir / "simple" / "mlp", tmp_path / "repo" / "mlp")
    proc, ports, log = start(mesh_bin, server_env, tmp_path, ["--grpc-infer-response-compression-level", "high"])
    try:
        wait_live(proc, ports[0], log)
        client = grpcclient.InferenceServerClient(f"{HOST}:{ports[1]}")
        for _ in range(100):
            if client.is_model_ready("mlp"):
                break
            time.sleep(0.1)
        x = np.ones((1, 64), np.float32)
        inp = grpcclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        plain = client.infer("mlp", [inp]).as_numpy("y")
        gz = client.infer("mlp", [inp], compression_algorithm="gzip").as_numpy("y")
        np.testing.assert_array_equal(plain, gz)
    finally:
        stop_process(proc)


def test_reuse_port_flags_let_two_nodes_share_their_ports(mesh_bin, server_env, tmp_path):
    reuse = ["--reuse-http-port", "true", "--reuse-grpc-port=1"]
    ports = free_ports(4)
    a_dir, b_dir, c_dir = (tmp_path / n for n in "abc")
    for d in (a_dir, b_dir, c_dir):
        d.mkdir()
    a, _, a_log = start(mesh_bin, server_env, a_dir, reuse, ports[:3])
    b, _, b_log = start(mesh_bin, server_env, b_dir, reuse, [ports[0], ports[1], ports[3]])
    try:
        wait_live(a, ports[0], a_log)
        wait_live(b, ports[0], b_log)
        assert a.poll() is None and b.poll() is None, "both nodes listen on the shared ports"
        assert grpcclient.InferenceServerClient(f"{HOST}:{ports[1]}").is_server_live()
        # Without the flag the port is taken, as for tritonserver.
        c, _, c_log = start(mesh_bin, server_env, c_dir, [], [ports[0], ports[1], free_ports(1)[0]])
        assert c.wait(20) != 0
        assert "cannot listen for HTTP" in c_log.read_text()
    finally:
        stop_process(a)
        stop_process(b)
