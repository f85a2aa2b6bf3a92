"""`mesh-ops bench` against a real mesh-node: HTTP and gRPC runs with --json (every request
answered, sane percentiles, the server's own statistics agreeing), batches, BYTES inputs,
perf_analyzer input files, the human summary, and exit code 2 with a clear message for an unknown
model, an unreachable server and a bad input file."""
import json
import os
import subprocess
from pathlib import Path

import pytest

from cluster_util import copy_models
from mesh_util import HOST, free_ports

pytestmark = [pytest.mark.server]

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def ops_bin() -> Path:
    p = Path(os.environ.get("MESH_OPS_BIN", REPO_ROOT / "target" / "release" / "mesh-ops"))
    if not p.is_absolute():
        p = REPO_ROOT / p
    if not (p.is_file() and os.access(p, os.X_OK)):
        msg = f"mesh-ops binary not found at {p}: build it (cargo build --release -p mesh-ops) or set MESH_OPS_BIN"
        if os.environ.get("MESH_REQUIRE_SERVER") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return p


@pytest.fixture(scope="module")
def node(server_factory, models_dir, tmp_path_factory):
    """mlp (max_batch_size 32), add_sub (two FP32 [16] inputs, max_batch_size 8) and the BYTES
    identity model (one dynamic dim)."""
    repo = tmp_path_factory.mktemp("bench") / "repo"
    copy_models(models_dir / "simple", repo, ["mlp", "add_sub"])
    copy_models(models_dir / "dtypes", repo, ["identity_bytes"])
    return server_factory([repo], name="bench")


def bench(ops_bin, *args, timeout=120):
    return subprocess.run([str(ops_bin), "bench", *map(str, args), "--no-progress"],
                          capture_output=True, text=True, timeout=timeout)


def bench_json(ops_bin, *args) -> dict:
    r = bench(ops_bin, *args, "--json")
    assert r.returncode == 0, f"rc {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"
    return json.loads(r.stdout)


def target(node, protocol: str) -> list[str]:
    if protocol == "http":
        return ["--url", f"http://{node.http_url}"]
    return ["--protocol", "grpc", "--grpc-url", node.grpc_url]


def successes(node, model: str) -> int:
    stats = node.get_json(f"/v2/models/{model}/stats")["model_stats"]
    return sum(s["inference_stats"]["success"]["count"] for s in stats)


def assert_sane(out: dict, *, requests: int, concurrency: int, protocol: str):
    assert out["protocol"] == protocol
    assert out["concurrency"] == concurrency
    assert out["requests"] == requests and out["ok"] == requests, out
    assert out["errors"] == {}
    assert out["duration_s"] > 0
    assert out["throughput_rps"] == pytest.approx(requests / out["duration_s"], rel=0.01)
    lat = out["latency_us"]
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"] * 1.004, lat
    assert 0 < lat["mean"] <= lat["max"]
    assert lat["max"] < 30e6, "no request near the 30 s timeout"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bench_runs_every_request(node, ops_bin, protocol):
    before = successes(node, "mlp")
    out = bench_json(ops_bin, "mlp", *target(node, protocol), "--requests", 200, "-c", 4)
    assert_sane(out, requests=200, concurrency=4, protocol=protocol)
    assert out["model"] == "mlp"
    assert successes(node, "mlp") - before == 200, "the server saw exactly the requests counted"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bench_batches_and_bytes(node, ops_bin, protocol):
    out = bench_json(ops_bin, "add_sub", *target(node, protocol), "--requests", 40, "-c", 2, "--batch", 8)
    assert_sane(out, requests=40, concurrency=2, protocol=protocol)
    assert out["batch"] == 8
    assert out["throughput_infer_per_s"] == pytest.approx(8 * out["throughput_rps"], rel=1e-3)
    out = bench_json(ops_bin, "identity_bytes", *target(node, protocol), "--requests", 40, "--batch", 2,
                     "--shape", "INPUT0:5", "--input", "zeros")
    assert_sane(out, requests=40, concurrency=1, protocol=protocol)


def test_bench_for_a_duration_prints_a_summary(node, ops_bin):
    r = bench(ops_bin, "mlp", "--url", node.http_url, "--duration", "1s", "-c", 2)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["model", "mlp"]
    assert any(line.startswith("requests") and "(all ok)" in line for line in lines), r.stdout
    assert any(line.split()[:4] == ["latency", "p50", "p90", "p99"] for line in lines), r.stdout
    assert "req/s" in r.stdout and "errors" not in r.stdout
    assert r.stderr == "", "no progress line when stderr is not a terminal"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bench_with_an_input_file(node, ops_bin, protocol, tmp_path):
    data = {"data": [
        {"INPUT0": list(range(16)), "INPUT1": {"content": [[1.5] * 8, [2.5] * 8], "shape": [16]}},
        {"INPUT0": {"content": [0.0] * 16}, "INPUT1": [-1] * 16},
    ]}
    f = tmp_path / "input.json"
    f.write_text(json.dumps(data))
    before = successes(node, "add_sub")
    out = bench_json(ops_bin, "add_sub", *target(node, protocol), "--requests", 30, "-c", 3,
                     "--input", f, "--batch", 2)
    assert_sane(out, requests=30, concurrency=3, protocol=protocol)
    assert successes(node, "add_sub") - before == 30


def test_a_bad_input_file_names_the_input(node, ops_bin, tmp_path):
    f = tmp_path / "short.json"
    f.write_text(json.dumps({"data": [{"INPUT0": [1, 2, 3], "INPUT1": [0] * 16}]}))
    r = bench(ops_bin, "add_sub", "--url", node.http_url, "--input", f)
    assert r.returncode == 2
    assert "input 'INPUT0'" in r.stderr and "3 values" in r.stderr, r.stderr
    assert r.stdout == ""


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_unknown_model_exits_2_naming_it(node, ops_bin, protocol):
    r = bench(ops_bin, "no_such_model", *target(node, protocol), "--requests", 5)
    assert r.returncode == 2, r
    assert "model 'no_such_model'" in r.stderr, r.stderr
    assert r.stdout == ""


def test_an_unreachable_server_exits_2_naming_it(ops_bin):
    port, = free_ports(1)
    r = bench(ops_bin, "mlp", "--url", f"http://{HOST}:{port}", "--requests", 5)
    assert r.returncode == 2
    assert r.stderr.strip() == f"mesh-ops bench: cannot reach http://{HOST}:{port}: connection refused"
    r = bench(ops_bin, "mlp", "--protocol", "grpc", "--grpc-url", f"{HOST}:{port}", "--requests", 5)
    assert r.returncode == 2
    assert f"cannot reach {HOST}:{port}" in r.stderr and "connection refused" in r.stderr, r.stderr


def test_usage_errors_exit_2(node, ops_bin):
    r = bench(ops_bin, "mlp", "--url", node.http_url, "--batch", 64, "--requests", 1)
    assert r.returncode == 2 and "max_batch_size 32" in r.stderr, r.stderr
    r = bench(ops_bin, "mlp", "--requests", 5, "--duration", "1s")
    assert r.returncode == 2 and "cannot be used with" in r.stderr, r.stderr
