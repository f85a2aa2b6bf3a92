"""A graceful stop waits for the models' finalize(): a Python model that saves its state slowly in
finalize() (tests/python_models/finalize_saves) saves it on SIGTERM and SIGINT, on an unload through
the repository API or by a router's placement, at the end of a cluster node's drain, and on the C
API's stop; one that outlives --exit-timeout-secs is killed and
named in the log, and its stub does not outlive the node."""
import json
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import REPO_ROOT
from proc_util import stubs_of

pytestmark = [pytest.mark.server]

MODEL = REPO_ROOT / "tests" / "python_models" / "finalize_saves"
PYTHON = ["--backend-config", f"python,interpreter={sys.executable}"]


def saving_repo(tmp_path: Path, seconds: float) -> tuple[Path, Path]:
    """A repository holding finalize_saves, whose finalize() sleeps `seconds` and then writes the
    count of requests it served to the returned file."""
    repo = tmp_path / "repo"
    shutil.copytree(MODEL, repo / "finalize_saves")
    saved = tmp_path / "saved.json"
    config = repo / "finalize_saves" / "config.pbtxt"
    text = config.read_text()
    text = text.replace('key: "SAVE_TO" value: { string_value: "" }', f'key: "SAVE_TO" value: {{ string_value: "{saved}" }}')
    text = text.replace('key: "FINALIZE_SECONDS" value: { string_value: "0" }',
                        f'key: "FINALIZE_SECONDS" value: {{ string_value: "{seconds}" }}')
    assert str(saved) in text and f'"{seconds}"' in text
    config.write_text(text)
    return repo, saved


def serve_twice(url: str) -> None:
    client = httpclient.InferenceServerClient(url)
    for i in range(2):
        x = httpclient.InferInput("IN", [1], "INT32")
        x.set_data_from_numpy(np.array([i], dtype=np.int32))
        assert client.infer("finalize_saves", [x]).as_numpy("OUT").tolist() == [i]
    client.close()


def line_of(text: str, needle: str) -> int:
    """The index of the first log line holding `needle` (fails the test when none does)."""
    for n, line in enumerate(text.splitlines()):
        if needle in line:
            return n
    pytest.fail(f"no log line holds {needle!r}:\n{text[-4000:]}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_waits_for_finalize_and_its_last_lines(fresh_server, tmp_path, sig):
    repo, saved = saving_repo(tmp_path, 1.5)
    srv = fresh_server([repo], PYTHON + ["--exit-timeout-secs", "30"])
    serve_twice(srv.http_url)
    stubs = stubs_of(srv.proc.pid)
    assert len(stubs) == 1, stubs
    started = time.monotonic()
    srv.signal(sig)
    rc = srv.proc.wait(timeout=30)
    took = time.monotonic() - started
    assert rc == 0, srv.log_tail()
    assert json.loads(saved.read_text()) == {"served": 2}, "finalize() did not save its state"
    assert took >= 1.5, f"the node exited {took:.2f} s after {sig.name}, before finalize() could end"
    text = srv.log_path.read_text()
    # Everything finalize() logged or printed comes before the node's last line.
    stopped = line_of(text, "INFO stopped")
    assert line_of(text, "finalize_saves: saved 2") < stopped
    assert line_of(text, "Cleaning up...") < stopped
    assert not [p for p in stubs if Path(f"/proc/{p}").exists()], "the stub outlived its node"


def test_an_unload_waits_for_finalize_past_five_seconds(fresh_server, tmp_path):
    # Six seconds: an unloaded instance's finalize() has --exit-timeout-secs, not a fixed five.
    repo, saved = saving_repo(tmp_path, 6)
    srv = fresh_server([repo], PYTHON + ["--model-control-mode", "explicit", "--load-model", "finalize_saves",
                                         "--exit-timeout-secs", "30"])
    serve_twice(srv.http_url)
    client = httpclient.InferenceServerClient(srv.http_url)
    client.unload_model("finalize_saves")
    deadline = time.monotonic() + 30
    while not saved.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert saved.exists(), f"finalize() never saved after the unload:\n{srv.log_tail()}"
    assert json.loads(saved.read_text()) == {"served": 2}
    # The model loads again and is saved again on the node's stop.
    saved.unlink()
    client.load_model("finalize_saves")
    serve_twice(srv.http_url)
    client.close()
    srv.signal(signal.SIGTERM)
    assert srv.proc.wait(timeout=30) == 0
    assert json.loads(saved.read_text()) == {"served": 2}
    assert srv.log_path.read_text().count("finalize_saves: saved 2") == 2


def test_a_finalize_past_the_exit_timeout_is_killed_and_named(fresh_server, tmp_path):
    repo, saved = saving_repo(tmp_path, 120)
    srv = fresh_server([repo], PYTHON + ["--exit-timeout-secs", "2"])
    serve_twice(srv.http_url)
    stubs = stubs_of(srv.proc.pid)
    assert len(stubs) == 1, stubs
    started = time.monotonic()
    srv.signal(signal.SIGTERM)
    srv.proc.wait(timeout=20)
    took = time.monotonic() - started
    assert 2 <= took < 10, f"the node exited {took:.2f} s after SIGTERM with --exit-timeout-secs 2"
    assert not saved.exists()
    text = srv.log_path.read_text()
    assert line_of(text, "finalize_saves: saving in 120") < line_of(text, "INFO stopped")
    killed = [l for l in text.splitlines() if "did not finish within --exit-timeout-secs" in l]
    assert len(killed) == 1 and "model 'finalize_saves'" in killed[0] and "ERROR" in killed[0], killed
    assert not [p for p in stubs if Path(f"/proc/{p}").exists()], "the killed stub still runs"


C_API_STOP = textwrap.dedent("""
    import ctypes, sys, time
    import numpy as np
    import tritonserver
    from tritonserver import _library as L

    repo, interpreter, how = sys.argv[1], sys.argv[2], sys.argv[3]
    server = tritonserver.Server(model_repository=repo, backend_configuration={"python": {"interpreter": interpreter}},
                                 exit_timeout=30, log_info=True).start(wait_until_ready=True)
    model = server.model("finalize_saves")
    for i in range(2):
        for response in model.infer(inputs={"IN": np.array([i], dtype=np.int32)}):
            assert np.from_dlpack(response.outputs["OUT"]).tolist() == [i]
    started = time.monotonic()
    if how == "stop":
        L.call("TRITONSERVER_ServerStop", server._handle)  # what C callers call before Delete
    server.stop()  # TRITONSERVER_ServerDelete
    print(f"stopped after {time.monotonic() - started:.2f} s", flush=True)
""")


@pytest.mark.parametrize("how", ["stop", "delete"])
def test_the_c_apis_stop_waits_for_finalize(capi_lib, server_env, tmp_path, how):
    repo, saved = saving_repo(tmp_path, 1.5)
    script = tmp_path / "stop.py"
    script.write_text(C_API_STOP)
    env = dict(server_env, MESH_TRITONSERVER_LIBRARY=str(capi_lib))
    res = subprocess.run([sys.executable, str(script), str(repo), sys.executable, how], capture_output=True,
                         text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    took = float(re.search(r"stopped after ([0-9.]+) s", res.stdout).group(1))
    assert took >= 1.5, f"the server stopped {took} s after the call, before finalize() could end"
    assert json.loads(saved.read_text()) == {"served": 2}
    assert "finalize_saves: saved 2" in res.stdout + res.stderr


@pytest.mark.cluster
def test_a_placed_model_finalizes_when_unloaded_and_when_its_node_drains_and_stops(cluster_factory, tmp_path):
    from test_cluster_placement import FAST, empty_node, ready_nodes, wait_placed, with_params

    repo, saved = saving_repo(tmp_path, 1.5)
    with_params(repo / "finalize_saves" / "config.pbtxt", min_replicas=1, max_replicas=1)
    c = cluster_factory()
    c.start_router([repo], FAST + ["--model-control-mode", "explicit", "--load-model", "finalize_saves"])
    node = empty_node(c, "e1")
    wait_placed(c, "finalize_saves", 1)
    serve_twice(c.router.http_url)
    client = httpclient.InferenceServerClient(c.router.http_url)
    client.unload_model("finalize_saves")  # the router's placement unloads it from the node
    assert ready_nodes(c, "finalize_saves") == set()
    deadline = time.monotonic() + 30
    while "finalize_saves: saved 2" not in node.log_path.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert json.loads(saved.read_text()) == {"served": 2}
    # Placed again, then the node is stopped: it drains (the router releases it), then finalizes.
    saved.unlink()
    client.load_model("finalize_saves")
    wait_placed(c, "finalize_saves", 1)
    serve_twice(c.router.http_url)
    client.close()
    node.signal(signal.SIGTERM)
    assert node.proc.wait(timeout=30) == 0
    assert json.loads(saved.read_text()) == {"served": 2}
    text = node.log_path.read_text()
    text = text[text.index("SIGTERM received"):]
    assert line_of(text, "drained: every router released") < line_of(text, "finalize_saves: saving in") < line_of(text, "INFO stopped")
