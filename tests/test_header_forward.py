"""tritonserver's `--http-header-forward-pattern` and `--grpc-header-forward-pattern` (issue 16):
headers (gRPC metadata) whose name matches reach the model as string request parameters; others
do not; a bad pattern stops the server with a message."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

pytestmark = [pytest.mark.server]

PY_MODELS = Path(__file__).parent / "python_models"


@pytest.fixture(scope="module")
def node(server_factory, tmp_path_factory):
    repo = tmp_path_factory.mktemp("forward") / "repo"
    shutil.copytree(PY_MODELS / "strings_py", repo / "strings_py")
    args = ["--backend-config", f"python,interpreter={sys.executable}",
            "--http-header-forward-pattern", "^x-fwd-", "--grpc-header-forward-pattern", "^x-fwd-"]
    return server_factory([repo], args, name="forward", wait_models=["strings_py"])


def params_seen(result):
    return json.loads(result.as_numpy("INFO")[0])["parameters"]


def text(mod):
    t = mod.InferInput("TEXT", [1], "BYTES")
    t.set_data_from_numpy(np.array([b"x"], dtype=np.object_))
    return t


def test_http_headers(node):
    c = httpclient.InferenceServerClient(node.http_url)
    r = c.infer("strings_py", [text(httpclient)], headers={"X-Fwd-User": "alice", "X-Other": "no"},
                parameters={"own": "kept"})
    seen = params_seen(r)
    assert seen.get("x-fwd-user") == "alice" and "x-other" not in seen and seen.get("own") == "kept", seen
    c.close()


def test_grpc_metadata_unary_and_stream(node):
    import queue
    c = grpcclient.InferenceServerClient(node.grpc_url)
    r = c.infer("strings_py", [text(grpcclient)], headers={"x-fwd-tenant": "t1", "x-other": "no"})
    seen = params_seen(r)
    assert seen.get("x-fwd-tenant") == "t1" and "x-other" not in seen, seen
    answers = queue.Queue()
    c.start_stream(callback=lambda result, error: answers.put((result, error)), headers={"x-fwd-stream": "s"})
    c.async_stream_infer("strings_py", [text(grpcclient)])
    result, error = answers.get(timeout=30)
    assert error is None and params_seen(result).get("x-fwd-stream") == "s"
    c.stop_stream()
    c.close()


def test_a_bad_pattern_stops_the_server(mesh_bin, tmp_path):
    p = subprocess.run([str(mesh_bin), "--model-repository", str(tmp_path), "--http-header-forward-pattern", "(",
                        "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "--http-header-forward-pattern '(' is not a valid regular expression" in p.stdout + p.stderr


QUOTED = 'This is a "quoted" string with a backslash\\ '  # Triton's parameters test value


@pytest.mark.parametrize("mod", [httpclient, grpcclient], ids=["http", "grpc"])
def test_several_headers_with_quotes_and_backslashes_all_arrive(node, mod):
    """Triton's parameters test forwards three my_header_* headers, the last with quotes and a
    backslash; each reaches the model. Over gRPC the value is exact; over HTTP its trailing space is
    dropped, as RFC 9110 says a field value has no leading or trailing whitespace (hyper reads it so;
    Triton's HTTP server keeps it)."""
    c = mod.InferenceServerClient(node.grpc_url if mod is grpcclient else node.http_url)
    headers = {"x-fwd-1": "my_value_1", "x-fwd-2": "my_value_2", "x-fwd-3": QUOTED, "header_1": "no"}
    seen = params_seen(c.infer("strings_py", [text(mod)], headers=dict(headers)))
    want = QUOTED if mod is grpcclient else QUOTED.rstrip()
    assert {k: v for k, v in seen.items() if k.startswith("x-fwd-")} == {
        "x-fwd-1": "my_value_1", "x-fwd-2": "my_value_2", "x-fwd-3": want}, seen
    c.close()


def test_patterns_match_case_insensitively_as_tritons_do(fresh_server, tmp_path):
    """Triton's L0_parameters starts tritonserver with `--*-header-forward-pattern MY_HEADER.*` and
    expects `my_header_1` and `my_header_3` to reach the model; `(?-i)MY_HEADER.*` on gRPC forwards
    nothing, since metadata names are lower case."""
    repo = tmp_path / "repo"
    shutil.copytree(PY_MODELS / "strings_py", repo / "strings_py")
    node = fresh_server([repo], ["--backend-config", f"python,interpreter={sys.executable}",
                                   "--http-header-forward-pattern", "MY_HEADER.*",
                                   "--grpc-header-forward-pattern", "(?-i)MY_HEADER.*"],
                          name="forward-case", wait_models=["strings_py"])
    headers = {"header_1": "value_1", "my_header_1": "my_value_1", "My_Header_3": "my_value_3"}
    c = httpclient.InferenceServerClient(node.http_url)
    seen = params_seen(c.infer("strings_py", [text(httpclient)], headers=dict(headers)))
    assert {k: v for k, v in seen.items() if "header" in k} == {
        "my_header_1": "my_value_1", "my_header_3": "my_value_3"}, seen
    c.close()
    g = grpcclient.InferenceServerClient(node.grpc_url)
    seen = params_seen(g.infer("strings_py", [text(grpcclient)], headers={k.lower(): v for k, v in headers.items()}))
    assert not [k for k in seen if "header" in k], seen
    g.close()
