"""The book's examples run as a user copies them: every block of README.md and docs/src a user would
copy is marked (tests/book.py), and each block marked as an example runs here, or in the test that
names it, against the servers the book starts, on the ports it names (8000-8003 by default).

Where a block cannot run word for word on one machine, the test changes only what it names: a host
name that is another machine (`router.example`, `router-host`) becomes localhost, a second server
on this host gets ports of its own, placeholders (`/models`, `/path/to/mesh`, a serial) become real
paths and values."""
import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

import book
import proc_util
from conftest import REPO_ROOT, side_venv_python
from mesh_util import http_request

pytestmark = [pytest.mark.server]

RELEASE = REPO_ROOT / "target" / "release"
# The ports the examples' servers take: a router's or node's defaults, the second router and the
# nodes of serve-cluster.sh, and its etcd (TCP); the cluster ports (UDP).
TCP_PORTS = (8000, 8001, 8002, 8010, 8011, 8012, 8100, 8101, 8102, 8200, 8201, 8202, 2379, 2380)
UDP_PORTS = (8003, 8013)
# What the OCR examples read: a page the tests render (test_ocr's renderer), read back exactly.
PAGE = (["The quick brown fox", "jumps over 13 lazy dogs"], 32)
# Commands of a block that keep running (servers): started in the background, in order.
SERVES = re.compile(r"(serve-example\.sh|serve-cluster\.sh|^mesh-router |^mesh-node |mesh_pytriton )")


# --- every block is marked, and every example is run -------------------------------------------

def test_every_block_a_user_would_copy_is_marked():
    unmarked = [b.where for b in book.all_blocks() if b.language in book.COPYABLE and b.mark is None]
    assert not unmarked, ("blocks a user would copy must be marked <!-- example: NAME -->, "
                          f"<!-- excerpt: PATH --> or <!-- not run: REASON --> (tests/book.py): {unmarked}")


def test_every_block_names_its_language():
    """A picture or an output is `text`; a block without a language could hide one to copy."""
    unnamed = [b.where for b in book.all_blocks() if not b.language]
    assert not unnamed, f"blocks without a language: {unnamed}"


def test_every_example_has_one_name_and_a_test_that_runs_it():
    names = [b.mark[1] for b in book.all_blocks() if b.mark and b.mark[0] == "example"]
    assert len(names) == len(set(names)), f"example names used twice: {sorted(names)}"
    sources = [p.read_text() for p in (REPO_ROOT / "tests").glob("test_*.py")]
    sources += [p.read_text() for p in REPO_ROOT.glob("crates/*/tests/*.rs")]
    for name in names:
        assert any(f'"{name}"' in s or f"example: {name}" in s for s in sources), \
            f"no test runs the book's example {name!r}"


def test_an_excerpt_is_lines_of_its_file():
    for b in book.all_blocks():
        if not (b.mark and b.mark[0] == "excerpt"):
            continue
        source = " ".join((REPO_ROOT / b.mark[1]).read_text().split())
        for line in b.text.splitlines():
            code = " ".join(re.sub(r"/\*.*?\*/|//.*$|#.*$", "", line).split())
            assert code in source, f"{b.where}: {code!r} is not in {b.mark[1]}"


def test_a_block_without_a_mark_is_found(tmp_path, monkeypatch):
    page = tmp_path / "a.md"
    page.write_text("text\n\n<!-- example: one -->\n```sh\necho 1\n```\n\n```python\nprint(2)\n```\n")
    monkeypatch.setattr(book, "ROOT", tmp_path)
    found = book.blocks(page)
    assert [(b.language, b.mark) for b in found] == [("sh", ("example", "one")), ("python", None)]


# --- running blocks ------------------------------------------------------------------------------

def commands(text: str) -> list[str]:
    """A block's commands: its lines with continuations joined, blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def env_with(*paths: Path, **extra) -> dict:
    env = dict(os.environ, **extra)
    env["PATH"] = os.pathsep.join([*map(str, paths), env["PATH"]])
    return env


def sh(command: str, cwd: Path, env: dict, timeout: float = 300) -> str:
    """Runs shell text as a user's terminal would (stopping at the first failure); returns stdout."""
    res = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", command], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=timeout)
    assert res.returncode == 0, f"{command!r} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
    return res.stdout


class Served:
    """The servers a block started, each in a process group of its own, its output in a log."""

    def __init__(self, logs: Path):
        self.logs = logs
        self.procs: list[subprocess.Popen] = []

    def start(self, command: str, cwd: Path, env: dict) -> subprocess.Popen:
        log = open(self.logs / f"served-{len(self.procs)}.log", "wb")
        proc = subprocess.Popen(["bash", "-c", command], cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs.append(proc)
        return proc

    def output(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-4000:] for p in sorted(self.logs.glob("served-*.log")))

    def stop(self):
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C, as the scripts expect
        deadline = time.time() + 40
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for proc in self.procs:  # whatever a script left behind in its group
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def run_block(text: str, cwd: Path, env: dict, served: Served, ready) -> str:
    """Runs a block's commands in order: a server starts in the background and `ready(command)`
    waits for it; the others run to completion. Returns what the others printed."""
    out = []
    for command in commands(text):
        if SERVES.search(command):
            served.start(command, cwd, env)
            ready(command)
        else:
            out.append(sh(command, cwd, env))
    return "".join(out)


def wait_for(what: str, check, served: Served, timeout: float = 300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        for proc in served.procs:
            assert proc.poll() is None, f"{what}: a server exited ({proc.returncode}):\n{served.output()}"
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout} s:\n{served.output()}")


def live_on(port: int):
    return lambda: http_request(port, "GET", "/v2/health/live", timeout=2).status == 200


def ready_on(port: int, *models: str):
    def check():
        if http_request(port, "GET", "/v2/health/ready", timeout=2).status != 200:
            return False
        return all(http_request(port, "GET", f"/v2/models/{m}/ready", timeout=2).status == 200 for m in models)
    return check


def cluster_view(port: int) -> dict:
    return json.loads(http_request(port, "GET", "/mesh/v1/cluster", timeout=2).body)


def nodes_up(port: int, names: set, model: str):
    def check():
        view = cluster_view(port)
        up = {n["name"] for n in view["nodes"] if n["state"] == "up"}
        placed = {n for m in view["models"] if m["name"] == model and m["state"] == "READY" for n in m["nodes"]}
        return names <= up and names <= placed
    return check


def port_taken(port: int, kind=socket.SOCK_STREAM) -> bool:
    with socket.socket(socket.AF_INET, kind) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False


def ports_taken() -> list:
    return [p for p in TCP_PORTS if port_taken(p)] + [f"{p}/udp" for p in UDP_PORTS if port_taken(p, socket.SOCK_DGRAM)]


@pytest.fixture
def default_ports():
    """The examples use the default ports (and serve-cluster.sh's): free before, free again after."""
    taken = ports_taken()
    assert not taken, f"ports {taken} are taken: the book's examples run on the ports they name"
    yield
    deadline = time.time() + 10
    while ports_taken() and time.time() < deadline:
        time.sleep(0.2)
    assert not ports_taken(), f"ports {ports_taken()} are still taken after the example's servers stopped"


@pytest.fixture
def served(tmp_path, default_ports):
    s = Served(tmp_path)
    yield s
    s.stop()


@pytest.fixture
def page_png(tmp_path) -> Path:
    from test_ocr import render
    (tmp_path / "page.png").write_bytes(render(*PAGE))
    return tmp_path


def add_sub(port: int, a: float) -> np.ndarray:
    client = httpclient.InferenceServerClient(f"localhost:{port}")
    try:
        x = np.full((1, 16), a, np.float32)
        inputs = [httpclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
        for i in inputs:
            i.set_data_from_numpy(x)
        return client.infer("add_sub", inputs).as_numpy("OUTPUT0")
    finally:
        client.close()


# --- model configuration ---------------------------------------------------------------------------

def test_the_onnx_thread_parameter_loads_and_serves(server_factory, models_dir, tmp_path):
    model = tmp_path / "repo" / "add_sub"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.onnx").symlink_to(models_dir / "simple" / "add_sub" / "1" / "model.onnx")
    config = (models_dir / "simple" / "add_sub" / "config.pbtxt").read_text()
    (model / "config.pbtxt").write_text(config + "\n" + book.example("onnx-threads").text)
    srv = server_factory([tmp_path / "repo"], [], name="onnx-threads", wait_models=["add_sub"])
    cfg = srv.get_json("/v2/models/add_sub/config")
    assert cfg["parameters"]["intra_op_thread_count"] == {"string_value": "1"}, cfg
    assert (add_sub(srv.http_port, 1.5) == 3.0).all()


# --- getting started: the serve command, then curl and tritonclient --------------------------------

def test_the_serve_command_then_the_first_requests(served, page_png):
    """`./scripts/serve-example.sh` (the README's first command, which sets up first), then every
    example of "Talk to it" in the README and the getting-started chapter."""
    served.start("./scripts/serve-example.sh", REPO_ROOT, dict(os.environ))
    wait_for("serve-example.sh", ready_on(8000, "mlp", "ocr_det", "ocr_bls", "ocr"), served, timeout=600)
    for name in ("readme-curl", "first-curl"):
        out = sh(book.example(name).text, page_png, dict(os.environ))
        assert out.splitlines()[0] == "200", out
        assert "nv_inference_request_success{" in out, out
        assert '"max_batch_size"' in out, out
        assert name == "readme-curl" or '"outputs"' in out, out
    for name in ("readme-tritonclient", "first-ocr"):
        out = book.run_text(book.example(name).text, page_png, dict(os.environ)).stdout
        assert [" ".join(t.split()) for t in eval(out.strip())] == PAGE[0], out
    assert book.run_text(book.example("first-grpc").text, page_png, dict(os.environ)).stdout.strip() == \
        "(1, 1, 640, 640)"


# --- the cluster ----------------------------------------------------------------------------------

def test_a_cluster_on_this_machine(served):
    """`./scripts/serve-cluster.sh`, then `mesh-ops status` and `mesh-ops models` as the chapter
    shows them: two nodes up, the example's models on both."""
    def ready(command):
        wait_for(command, nodes_up(8000, {"node-a", "node-b"}, "mlp"), served, timeout=600)
    out = run_block(book.example("cluster-local").text, REPO_ROOT, dict(os.environ), served, ready)
    assert re.search(r"^node-a\s+\S+\s+up\s", out, re.M) and re.search(r"^node-b\s+\S+\s+up\s", out, re.M), out
    assert re.search(r"^mlp\s.*node-a.*node-b|^mlp\s.*node-b.*node-a", out, re.M), out


def test_a_cluster_by_hand(served, tmp_path, models_dir):
    """The chapter's commands by hand: a CA, a router and a node certificate, the router and a node
    that joins it; the node (on this same host) gets ports of its own and dials localhost."""
    repo = tmp_path / "models"
    repo.mkdir()
    (repo / "add_sub").symlink_to(models_dir / "simple" / "add_sub")
    text = book.example("cluster-by-hand").text.replace("/models", str(repo))
    text = text.replace("router.example:8003", "localhost:8003")
    text = re.sub(r"(mesh-node .*?)(\n|$)", r"\1 --http-port 8100 --grpc-port 8101 --metrics-port 8102\2",
                  re.sub(r"\\\n\s*", " ", text))

    def ready(command):
        if command.startswith("mesh-router"):
            wait_for(command, live_on(8000), served, timeout=60)
        else:
            wait_for(command, nodes_up(8000, {"node-a"}, "add_sub"), served, timeout=120)
    run_block(text, tmp_path, env_with(RELEASE), served, ready)
    assert (add_sub(8000, 2.0) == 4.0).all()


def test_several_routers_on_this_machine(served):
    """`./scripts/serve-cluster.sh --ha`: kill either router, and the other keeps serving."""
    def ready(command):
        wait_for(command, nodes_up(8010, {"node-a", "node-b"}, "mlp"), served, timeout=600)
        wait_for(command, nodes_up(8000, {"node-a", "node-b"}, "mlp"), served, timeout=60)
    run_block(book.example("cluster-ha").text, REPO_ROOT, dict(os.environ), served, ready)
    group = served.procs[0].pid  # the script's process group: another router on this machine is not ours
    first = [pid for pid, args in proc_util.processes()
             if "mesh-router" in args[0] and "router-2" not in args and os.getpgid(pid) == group]
    assert len(first) == 1, first
    os.kill(first[0], signal.SIGKILL)
    x = np.full((1, 64), 0.5, np.float32)
    client = httpclient.InferenceServerClient("localhost:8010")
    try:
        inp = httpclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        assert client.infer("mlp", [inp]).as_numpy("y").shape[0] == 1
    finally:
        client.close()


# --- certificates -----------------------------------------------------------------------------------

def test_revoking_and_short_lived_certificates(tmp_path):
    env = env_with(RELEASE)
    sh("mesh-ops certs init certs && mesh-ops certs issue certs node-a --role node "
       "&& mesh-ops certs issue certs node-b --role node", tmp_path, env)
    issued = [line.split("\t") for line in (tmp_path / "certs" / "issued.tsv").read_text().splitlines()
              if not line.startswith("#")]
    serial_b = next(s for s, name, *_ in issued if name == "node-b")
    text = book.example("revoke").text.replace("3F1C9A...", serial_b)
    out = sh(text, tmp_path, env)
    assert serial_b in out and "node-a" in out and "key-compromise" in out, out
    issued = [line.split("\t") for line in (tmp_path / "certs" / "issued.tsv").read_text().splitlines()
              if not line.startswith("#")]
    last_a = [int(after) for s, name, role, after in issued if name == "node-a"][-1]
    assert abs(last_a - (time.time() + 24 * 3600)) < 600, "the short-lived certificate lasts 24 hours"


# --- embedding in C -----------------------------------------------------------------------------------

def test_the_c_example_compiles_and_runs(tmp_path, capi_lib):
    for top in ("tests", "crates", "target", ".venv"):  # the checkout the commands run in
        (tmp_path / top).symlink_to(REPO_ROOT / top)
    out = sh(book.example("c-add-sub").text, tmp_path, dict(os.environ))
    assert "add_sub ready: yes" in out and "refused a wrong datatype: Invalid argument" in out, out


# --- PyTriton ------------------------------------------------------------------------------------------

@pytest.fixture
def pytriton_venv() -> Path:
    return side_venv_python(".venv-pytriton", "MESH_PYTRITON_PYTHON", "MESH_REQUIRE_PYTRITON",
                            "scripts/setup-pytriton.sh").parent


def double(port: int) -> np.ndarray:
    client = httpclient.InferenceServerClient(f"localhost:{port}")
    try:
        x = np.array([[1.0, 2.0, 3.0]], np.float32)
        inp = httpclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        return client.infer("double", [inp]).as_numpy("y")
    finally:
        client.close()


def test_a_pytriton_script_runs_on_mesh_node(served, tmp_path, pytriton_venv):
    (tmp_path / "my_script.py").write_text(book.example("pytriton-script").text)
    text = book.example("pytriton-run").text.replace("/path/to/mesh", str(REPO_ROOT))
    run_block(text, tmp_path, env_with(pytriton_venv), served,
              lambda command: wait_for(command, ready_on(8000, "double"), served, timeout=120))
    assert double(8000).tolist() == [[2.0, 4.0, 6.0]]


def test_pytriton_scripts_join_a_cluster(served, tmp_path, pytriton_venv):
    """The chapter's cluster example: the script's node joins a router (here on this host, on ports
    of its own, with certificates made as the cluster chapter makes them)."""
    (tmp_path / "my_script.py").write_text(book.example("pytriton-script").text)
    env = env_with(RELEASE, pytriton_venv)
    sh("mesh-ops certs init . && mesh-ops certs issue . router --role router && "
       "mesh-ops certs issue . py-a --role node", tmp_path, env)
    served.start("mesh-router --cluster-ca ca.pem --cluster-cert router.pem --cluster-key router.key "
                 "--http-port 8010 --grpc-port 8011 --metrics-port 8012", tmp_path, env)
    wait_for("mesh-router", live_on(8010), served, timeout=60)
    text = book.example("pytriton-cluster").text.replace("router-host:8003", "localhost:8003")
    served.start(re.sub(r"\\\n\s*", " ", text).strip(), tmp_path, env)
    wait_for("the script's node", ready_on(8010, "double"), served, timeout=120)
    assert double(8010).tolist() == [[2.0, 4.0, 6.0]]
