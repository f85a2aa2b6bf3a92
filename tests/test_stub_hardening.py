"""A node's Python stubs on the local machine (issue 24, item 4), with real processes:

- a stub dies with its node: SIGKILL of the node (only the node, not its process group) while a
  model blocks in initialize(), and while a ready model runs threads of its own, leaves no stub;
- the stub's sources and sockets live in a fresh directory of mode 0700 whose name cannot be
  guessed, and its shared memory cannot be registered by a client (its name is unguessable, and
  the node's own prefix is refused).
"""
from __future__ import annotations

import json
import os
import signal
import stat
import sys
import threading
import time
from pathlib import Path

import pytest

from mesh_util import http_request
from proc_util import stubs_of

pytestmark = [pytest.mark.server]

CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
"""

BLOCKS_IN_INITIALIZE = """import time
class TritonPythonModel:
    def initialize(self, args):
        open({marker!r}, "w").write("initializing")
        time.sleep(600)
    def execute(self, requests):
        return []
"""

RUNS_ITS_OWN_THREADS = """import threading, time
def spin():
    while True:
        time.sleep(0.05)
class TritonPythonModel:
    def initialize(self, args):
        for _ in range(2):
            threading.Thread(target=spin).start()  # not daemons: they would keep a process alive
        open({marker!r}, "w").write("ready")
    def execute(self, requests):
        return []
"""


def write_model(repo: Path, name: str, code: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name))
    (repo / name / "1" / "model.py").write_text(code)


def wait_for(pred, what: str, timeout: float = 30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


def test_stubs_die_with_their_node_and_keep_their_memory_private(fresh_server, tmp_path):
    repo = tmp_path / "repo"
    blocked, threads = tmp_path / "blocked", tmp_path / "threads"
    write_model(repo, "block_init", BLOCKS_IN_INITIALIZE.format(marker=str(blocked)))
    write_model(repo, "own_threads", RUNS_ITS_OWN_THREADS.format(marker=str(threads)))
    srv = fresh_server([repo], ["--backend-config", f"python,interpreter={sys.executable}",
                                "--model-control-mode", "explicit", "--load-model", "own_threads"],
                       wait_models=["own_threads"])
    node = srv.proc.pid
    # This load never finishes: its initialize() sleeps. It is left hanging in a thread, and ends
    # without an answer when the node is killed.
    def load_forever():
        try:
            http_request(srv.http_port, "POST", "/v2/repository/models/block_init/load", body=b"{}", timeout=60)
        except OSError:
            pass

    threading.Thread(target=load_forever, daemon=True).start()
    wait_for(lambda: blocked.exists() and threads.exists(), "both models' initialize() to run")
    stubs = wait_for(lambda: len(stubs_of(node)) >= 2 and stubs_of(node), "two stubs")

    # The runtime directory: fresh, private, unguessable.
    script = next(a for a in (Path(f"/proc/{stubs[0]}/cmdline").read_bytes().split(b"\0")) if a.endswith(b".py"))
    runtime = Path(script.decode()).parent
    mode = stat.S_IMODE(runtime.stat().st_mode)
    assert mode == 0o700, oct(mode)
    assert not runtime.is_symlink()
    suffix = runtime.name.split("-")[-1]
    assert len(suffix) == 32 and int(suffix, 16) >= 0, runtime.name

    # No client can register a node's own shared memory, named or guessed.
    names = [p.name for p in Path("/dev/shm").iterdir() if p.name.startswith(f"mesh-node-{node}-")]
    for key in names + [f"mesh-node-{node}-0", "/mesh-node-1-guess"]:
        body = json.dumps({"key": key, "offset": 0, "byte_size": 16})
        r = http_request(srv.http_port, "POST", "/v2/systemsharedmemory/region/steal/register", body=body)
        assert r.status == 400, (key, r.status, r.body)
        assert b"own shared memory" in r.body or b"cannot be opened" in r.body, r.body

    # SIGKILL of the node alone (not its process group): no stub may outlive it.
    os.kill(node, signal.SIGKILL)
    srv.proc.wait(10)
    wait_for(lambda: not any(Path(f"/proc/{p}").exists() and not is_zombie(p) for p in stubs),
             f"stubs {stubs} to exit after their node was killed", timeout=15)


def is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return True


ECHO = """import triton_python_backend_utils as pb_utils
class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy() * 2)])
                for r in requests]
"""


def test_a_model_loaded_with_file_overrides_survives_its_stub_dying(fresh_server, tmp_path):
    import tempfile

    import numpy as np
    import tritonclient.http as httpclient

    repo = tmp_path / "repo"
    repo.mkdir()
    srv = fresh_server([repo], ["--backend-config", f"python,interpreter={sys.executable}",
                                "--model-control-mode", "explicit"], wait_models=[])
    node = srv.proc.pid
    client = httpclient.InferenceServerClient(srv.http_url)
    config = json.dumps({"name": "fo_py", "backend": "python", "max_batch_size": 0,
                         "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [2]}],
                         "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [2]}]})
    client.load_model("fo_py", config=config, files={"file:1/model.py": ECHO.encode()})

    def infer():
        i = httpclient.InferInput("x", [2], "FP32")
        i.set_data_from_numpy(np.array([1.5, 2.0], np.float32))
        return client.infer("fo_py", [i]).as_numpy("y").tolist()

    assert infer() == [3.0, 4.0]
    overrides = [p for p in Path(tempfile.gettempdir()).iterdir() if p.name.startswith(f"mesh-{node}-override-")]
    assert len(overrides) == 1 and stat.S_IMODE(overrides[0].stat().st_mode) == 0o700, overrides
    for pid in stubs_of(node):
        os.kill(pid, signal.SIGKILL)

    def answers():
        try:
            return infer() == [3.0, 4.0]
        except Exception:  # noqa: BLE001 - restarting
            return False

    wait_for(answers, "the model to answer again after its stub was killed", timeout=60)
    client.unload_model("fo_py")
    wait_for(lambda: not overrides[0].exists(), "the override files to go with the unload", timeout=10)
    client.close()


LEAVES_REQUESTS_OPEN = """import sys
import numpy as np
import triton_python_backend_utils as pb_utils
class TritonPythonModel:
    def execute(self, requests):
        host = sys.modules["mesh_stub_host"]
        for r in requests:
            x = float(pb_utils.get_input_tensor_by_name(r, "x").as_numpy()[0])
            sender = r.get_response_sender()
            if x == 0:  # how many requests the stub still keeps an allowance or a cancellation for
                kept = np.array([len(host.allowance) + len(host.cancelled)], np.float32)
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("y", kept)]), flags=1)
            elif x == 1:  # one answer, then execute() raises: mesh-node closes it, no final flag sent
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("y", np.ones(1, np.float32))]))
                raise RuntimeError("left open")
            else:  # one answer, then execute() returns responses, which a decoupled model must not
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("y", np.ones(1, np.float32))]))
                return [None]
        return None
"""


def test_requests_the_node_closes_without_a_final_flag_leave_nothing_in_the_stub(fresh_server, tmp_path):
    """Issue 44: a decoupled request that mesh-node closes before the model sent its final flag
    (execute() raised, or returned responses) drops the stub's per-request allowance entry; before,
    each such request left one behind for the stub's lifetime."""
    repo = tmp_path / "repo"
    write_model(repo, "open_py", LEAVES_REQUESTS_OPEN)
    config = repo / "open_py" / "config.pbtxt"
    config.write_text(config.read_text() + "model_transaction_policy { decoupled: true }\n")
    srv = fresh_server([repo], ["--backend-config", f"python,interpreter={sys.executable}"])

    def stream(x):
        r = http_request(srv.http_port, "POST", "/v2/models/open_py/generate_stream", json.dumps({"x": [x]}),
                         timeout=60)
        return r.status, [json.loads(e[len("data: "):]) for e in r.body.decode().split("\n\n") if e]

    def y(event):
        return event["y"][0] if isinstance(event["y"], list) else event["y"]

    for x in [1.0] * 6 + [2.0] * 4:
        status, events = stream(x)
        assert status == 200 and y(events[0]) == 1.0 and "error" in events[-1], (status, events)
    status, events = stream(0.0)
    assert status == 200 and len(events) == 1, events
    # Only the counting request's own entry is left.
    assert y(events[0]) == 1.0, events
