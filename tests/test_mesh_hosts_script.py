"""scripts/mesh-hosts.sh (issue 14): a router and two nodes, each in its own network namespace, the
router placing the models of a repository on the empty nodes. With --check the script sends one
inference through the router from this namespace, checks it and tears everything down; without it
the script serves until SIGTERM, then the nodes drain and every namespace is deleted. Either way no
namespace with the script's prefix and no process it started may be left. Without root (or `ip`) it
says so in one line; these tests skip the same way the namespace suite does (netns.unavailable())."""
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

import netns
from cluster_util import copy_models
from conftest import REPO_ROOT

pytestmark = [pytest.mark.server, pytest.mark.cluster]

SCRIPT = REPO_ROOT / "scripts" / "mesh-hosts.sh"
EXAMPLE = REPO_ROOT / "configs" / "example-repo"


@pytest.fixture
def can_netns():
    why = netns.unavailable()
    if why:
        pytest.skip(why)


@pytest.fixture
def script_env(cluster_bins, server_env):
    """The suite's binaries (MESH_*_BIN) and environment, for the script too."""
    return {**server_env, "MESH_NODE_BIN": str(cluster_bins["node"]),
            "MESH_ROUTER_BIN": str(cluster_bins["router"]), "MESH_OPS_BIN": str(cluster_bins["ops"])}


@pytest.fixture
def small_repo(models_dir, tmp_path):
    """add_sub (whose answer is exact) and mlp."""
    return copy_models(models_dir / "simple", tmp_path / "repo", ["add_sub", "mlp"])


def prefix_of(out: str) -> str:
    m = re.search(r"^namespaces: (\S+)\*", out, re.M)
    assert m, f"the script did not say which namespaces it made:\n{out}"
    return m.group(1)


def pids_of(out: str) -> dict[str, int]:
    """The host table: host name -> pid of the process the script started there."""
    return {m.group(1): int(m.group(2)) for m in
            re.finditer(r"^(router|node-\d+)\s+\d+\.\d+\.\d+\.\d+\s+\S+\s+(\d+)\s", out, re.M)}


def assert_nothing_left(prefix: str, pids: dict[str, int]) -> None:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    assert [n for n in listed if n.startswith(prefix)] == [], f"namespaces of {prefix} left: {listed}"
    link = subprocess.run(["ip", "link", "show", f"{prefix}t"], capture_output=True, text=True)
    assert link.returncode != 0, f"the bridge interface {prefix}t is left:\n{link.stdout}"
    for name, pid in pids.items():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        state = open(f"/proc/{pid}/stat").read().split()[2] if os.path.exists(f"/proc/{pid}/stat") else "?"
        assert state == "Z", f"{name} (pid {pid}) still runs"


def test_help_and_a_bad_node_count_need_no_root():
    res = subprocess.run([str(SCRIPT), "--help"], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    assert "--nodes" in res.stdout and "--check" in res.stdout
    res = subprocess.run([str(SCRIPT), "--nodes", "0"], capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and "--nodes" in res.stderr, res


def test_without_root_it_says_so_in_one_line(can_netns, script_env):
    """Run as nobody: one line on stderr, exit 1, nothing made."""
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux) to drop root")
    res = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(SCRIPT), "--nodes", "1"],
                         capture_output=True, text=True, timeout=60, env=script_env)
    if "Permission denied" in res.stderr and "needs root" not in res.stderr:
        pytest.skip(f"nobody cannot read the checkout here: {res.stderr.strip()[:200]}")
    assert res.returncode == 1, res
    assert res.stdout == "", res.stdout
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "root" in lines[0], res.stderr


def test_check_serves_one_checked_inference_from_this_namespace_and_cleans_up(can_netns, script_env, small_repo,
                                                                            tmp_path):
    t0 = time.monotonic()
    res = subprocess.run([str(SCRIPT), "--nodes", "2", "--check", "--model-repository", str(small_repo),
                          "--dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=300,
                         env=script_env)
    took = time.monotonic() - t0
    out = res.stdout
    print(f"\nmesh-hosts.sh --nodes 2 --check: exit {res.returncode} after {took:.1f}s")
    prefix = prefix_of(out + res.stderr)
    assert res.returncode == 0, f"{out}\n{res.stderr}"
    assert re.search(r"^ready after [\d.]+s", out, re.M), out
    pids = pids_of(out)
    assert set(pids) == {"router", "node-1", "node-2"}, out
    checked = [json.loads(line[len("CHECK "):]) for line in out.splitlines() if line.startswith("CHECK ")]
    assert len(checked) == 1, out
    c = checked[0]
    assert c["model"] == "add_sub"
    a, b = np.array(c["inputs"]["INPUT0"], np.float32), np.array(c["inputs"]["INPUT1"], np.float32)
    np.testing.assert_array_equal(np.array(c["outputs"]["OUTPUT0"], np.float32), a + b)
    np.testing.assert_array_equal(np.array(c["outputs"]["OUTPUT1"], np.float32), a - b)
    assert re.search(r"^OK: add_sub through the router at http://\d+\.\d+\.\d+\.1:8000", out, re.M), out
    assert "every namespace deleted" in out
    assert_nothing_left(prefix, pids)
    # the printed commands name this run's hosts
    assert f"mesh-ops status --router http://" in out and f"ip netns exec {prefix}node-1 " in out


def test_sigterm_stops_the_nodes_with_a_drain_and_deletes_every_namespace(can_netns, script_env, small_repo,
                                                                         tmp_path):
    """Serving mode (no --check) on the example repository when it is generated (what
    scripts/setup.sh leaves), else the small one: ready, then SIGTERM ends it cleanly."""
    repo_args = [] if (EXAMPLE / "mlp" / "1" / "model.onnx").is_file() else ["--model-repository", str(small_repo)]
    run = tmp_path / "run"
    proc = subprocess.Popen([str(SCRIPT), "--nodes", "2", "--dir", str(run), *repo_args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=script_env)
    lines: list[str] = []
    ready = threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("Ctrl-C"):  # the last line of the description: everything printed
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready.wait(240), "the script never said it was ready:\n" + "".join(lines)
        out = "".join(lines)
        prefix, pids = prefix_of(out), pids_of(out)
        assert set(pids) == {"router", "node-1", "node-2"}, out
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    reader.join(10)
    out = "".join(lines)
    ready_line = re.search(r"ready after [\d.]+s", out)
    print(f"\n{'add_sub and mlp' if repo_args else 'the example repository'}: "
          f"{ready_line.group(0) if ready_line else '?'}; torn down {took:.1f}s after SIGTERM")
    assert code == 0, out
    assert "SIGTERM: stopping" in out and "every namespace deleted" in out, out
    assert_nothing_left(prefix, pids)
    for node in ("node-1", "node-2"):
        log = (run / "logs" / f"{node}.log").read_text(errors="replace")
        assert "every router released this node" in log, f"{node} did not drain:\n{log[-2000:]}"
