"""Triton's logging extension (issue 15): `GET/POST /v2/logging` and gRPC LogSettings read and
change the server's logging at run time, on a node and through the router; the change shows in the
log (info lines stop and come back, debug lines appear at verbose level 1); bad settings are 400 /
INVALID_ARGUMENT and change nothing."""
import json
import shutil
import urllib.error
import urllib.request

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from cluster_util import strip_ansi, wait_until

pytestmark = [pytest.mark.server]

DEFAULTS = {"log_file": "", "log_info": True, "log_warning": True, "log_error": True,
            "log_verbose_level": 0, "log_format": "default"}


@pytest.fixture
def server(fresh_server, models_dir, tmp_path):
    repo = tmp_path / "repo"
    for m in ("add_sub", "mlp"):
        shutil.copytree(models_dir / "simple" / m, repo / m)
    return fresh_server([repo], ["--model-control-mode", "explicit"], wait_models=[])


def log_text(srv) -> str:
    return strip_ansi(srv.log_path.read_text(errors="replace"))


def post(srv, body: bytes):
    req = urllib.request.Request(f"http://{srv.http_url}/v2/logging", data=body, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_settings_change_what_the_log_says(server):
    http = httpclient.InferenceServerClient(server.http_url)
    assert http.get_log_settings() == DEFAULTS
    assert "logging" in http.get_server_metadata()["extensions"]
    # Info lines off: loading a model logs nothing about it.
    assert http.update_log_settings({"log_info": False})["log_info"] is False
    http.load_model("add_sub")
    # Back on, with verbose 1: the next load logs at info and debug.
    settings = http.update_log_settings({"log_info": True, "log_verbose_level": 1})
    assert settings == {**DEFAULTS, "log_verbose_level": 1}
    http.load_model("mlp")
    wait_until(lambda: "model=mlp" in log_text(server) and "model ready" in log_text(server), 30,
               lambda: f"mlp's load in the log:\n{log_text(server)[-2000:]}")
    # The log is written in order, so lines about add_sub's load would be there by now.
    text = log_text(server)
    assert "model=add_sub" not in text, "info lines were written while log_info was false"
    assert "instance starting" in text, "verbose level 1 writes debug lines"
    http.close()


def test_a_log_that_is_not_a_terminal_is_plain_text(server):
    """A log written to a file (as here) or a pipe carries no ANSI colour codes (issue 27)."""
    http = httpclient.InferenceServerClient(server.http_url)
    http.load_model("mlp")
    http.close()
    raw = server.log_path.read_text(errors="replace")
    assert "model ready" in raw, raw[-2000:]
    assert "\x1b[" not in raw, "escape codes in a log file: " + repr(raw[-500:])


def test_grpc_reads_and_changes_the_same_settings(server):
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    got = grpc.get_log_settings(as_json=True)["settings"]
    assert got["log_verbose_level"] == {"uint32_param": 0} and got["log_info"] == {"bool_param": True}
    grpc.update_log_settings({"log_warning": False, "log_format": "ISO8601"})
    http = httpclient.InferenceServerClient(server.http_url)
    assert http.get_log_settings() == {**DEFAULTS, "log_warning": False, "log_format": "ISO8601"}
    with pytest.raises(InferenceServerException, match="log_format"):
        grpc.update_log_settings({"log_format": "xml"})
    grpc.close()
    http.close()


def test_bad_settings_are_refused_and_change_nothing(server):
    for body, words in [(b'{"log_verbose_level": -1}', "non-negative"),
                        (b'{"log_info": "yes"}', "boolean"),
                        (b'{"log_info": false, "log_colour": true}', "unknown log setting"),
                        (b'{"log_file": "/tmp/mesh.log"}', "log_file"),
                        (b'[1, 2]', "JSON object"),
                        (b'{not json', "not JSON")]:
        status, answer = post(server, body)
        assert status == 400 and words in answer["error"], (body, status, answer)
    status, answer = post(server, b"{}")
    assert status == 200 and answer == DEFAULTS, "nothing changed"


@pytest.mark.cluster
def test_the_router_serves_the_extension_for_itself(cluster_factory):
    c = cluster_factory()
    c.start_router([], ["--id", "triton", "--log-format", "ISO8601"])
    http = httpclient.InferenceServerClient(c.router.http_url)
    # tritonserver's --id and --log-format act on a router too.
    assert http.get_server_metadata()["name"] == "triton"
    assert http.get_log_settings()["log_format"] == "ISO8601"
    assert http.update_log_settings({"log_verbose_level": 2})["log_verbose_level"] == 2
    assert http.get_log_settings()["log_verbose_level"] == 2
    http.close()
    raw = c.router.log_path.read_text(errors="replace")
    assert "async runtime" in raw and "\x1b[" not in raw, repr(raw[-500:])
