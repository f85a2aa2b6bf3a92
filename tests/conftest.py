"""Fixtures for the mesh integration suite.

The suite starts the real `mesh-node` binary (env MESH_NODE_BIN, default
target/release/mesh-node) against model repositories that
scripts/gen_models.py writes once per session into a temporary directory, and
talks to it with tritonclient (HTTP and gRPC) and raw HTTP.

Environment:
  MESH_NODE_BIN            server binary (default <repo>/target/release/mesh-node)
  MESH_ROUTER_BIN          cluster router (default <repo>/target/release/mesh-router)
  MESH_OPS_BIN             operator tool (default <repo>/target/release/mesh-ops)
  MESH_REQUIRE_SERVER=1    fail, rather than skip, server tests when the binary is missing
  ORT_DYLIB_PATH           passed on to the server; computed from the onnxruntime
                           wheel of this interpreter when unset
  MESH_TEST_STARTUP_SECS   how long a server may take to come up (default 60)

Server logs go to tests/.work/logs/<name>.log (gitignored); the tail of the
relevant logs is attached to the report of a failing test.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
sys.path.insert(0, str(REPO_ROOT / "scripts"))

import gen_models  # noqa: E402
from mesh_util import MeshServer  # noqa: E402
from cluster_util import ClusterCerts, ClusterFactory  # noqa: E402

WORK_DIR = TESTS_DIR / ".work"
LOG_DIR = WORK_DIR / "logs"

_ALL_SERVERS: list[MeshServer] = []
# fixture name -> the name of the session server it uses (for failure logs)
_FIXTURE_SERVER = {"main_server": "main", "http_client": "main", "grpc_client": "main",
                   "broken_server": "broken", "metrics_server": "metrics",
                   "example_server": "example"}


def pytest_configure(config):
    config.addinivalue_line("markers", "server: needs the mesh-node binary (skipped when it is missing)")
    config.addinivalue_line("markers", "lifecycle: starts, signals and stops its own mesh-node")
    config.addinivalue_line("markers", "grpc: talks gRPC to the server")
    config.addinivalue_line("markers", "http: talks HTTP to the server")
    config.addinivalue_line("markers", "offline: needs no server (model generation checks)")
    config.addinivalue_line("markers", "cluster: starts mesh-router and joined mesh-nodes")
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU (tests/gpu; skipped with one reason without one)")


# --------------------------------------------------------------------------
# The GPU suite (tests/gpu): every test skips with one reason on a machine without a GPU, and the
# run's summary names them; MESH_REQUIRE_GPU=1 (scripts/check-gpu.sh) makes that a failure instead.
# --------------------------------------------------------------------------

GPU_DIR = TESTS_DIR / "gpu"
_GPU_SKIPPED: list[str] = []


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if GPU_DIR in Path(str(item.fspath)).parents]
    if not gpu_items:
        return
    from gpu.gpu_util import NO_GPU
    for item in gpu_items:
        item.add_marker(pytest.mark.gpu)
        if NO_GPU:
            if os.environ.get("MESH_REQUIRE_GPU") == "1":
                pytest.exit(f"MESH_REQUIRE_GPU=1, but {NO_GPU}", returncode=3)
            item.add_marker(pytest.mark.skip(reason=NO_GPU))
            _GPU_SKIPPED.append(item.name)


def pytest_terminal_summary(terminalreporter):
    if _GPU_SKIPPED:
        from gpu.gpu_util import NO_GPU
        terminalreporter.write_line(
            f"GPU suite: {len(_GPU_SKIPPED)} tests skipped ({NO_GPU}): {', '.join(_GPU_SKIPPED)}")


# --------------------------------------------------------------------------
# Paths and environment
# --------------------------------------------------------------------------

def _ort_dylib() -> str | None:
    try:
        import onnxruntime
    except ImportError:
        return None
    capi = Path(onnxruntime.__file__).resolve().parent / "capi"
    exact = capi / f"libonnxruntime.so.{onnxruntime.__version__}"
    if exact.is_file():
        return str(exact)
    found = sorted(glob.glob(str(capi / "libonnxruntime.so.*")))
    return found[-1] if found else None


def _binary(env_var: str, name: str, crate: str) -> Path:
    p = Path(os.environ.get(env_var, REPO_ROOT / "target" / "release" / name))
    if not p.is_absolute():
        p = REPO_ROOT / p
    if not (p.is_file() and os.access(p, os.X_OK)):
        msg = (f"{name} binary not found at {p}: build it (cargo build --release -p {crate}) "
               f"or set {env_var}")
        if os.environ.get("MESH_REQUIRE_SERVER") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return p


def side_venv_python(venv: str, path_env: str, require_env: str, setup: str) -> Path:
    """The interpreter of a project venv kept beside .venv (`venv`, made by `setup`), or the one
    `path_env` names: a test that needs it fails when `require_env` is 1, else it is skipped."""
    p = Path(os.environ.get(path_env, REPO_ROOT / venv / "bin" / "python"))
    if not p.exists():
        if os.environ.get(require_env) == "1":
            pytest.fail(f"{p} not found: run {setup}")
        pytest.skip(f"no interpreter at {p} ({setup} makes one)")
    return p


@pytest.fixture(scope="session")
def mesh_bin() -> Path:
    return _binary("MESH_NODE_BIN", "mesh-node", "mesh-node")


@pytest.fixture(scope="session")
def cluster_bins(mesh_bin) -> dict[str, Path]:
    """mesh-node, mesh-router and mesh-ops."""
    return {"node": mesh_bin, "router": _binary("MESH_ROUTER_BIN", "mesh-router", "mesh-router"),
            "ops": _binary("MESH_OPS_BIN", "mesh-ops", "mesh-ops")}


@pytest.fixture(scope="session")
def capi_lib() -> Path:
    """The mesh's libtritonserver.so (Triton's in-process C API)."""
    return _binary("MESH_CAPI_LIB", "libtritonserver.so", "mesh-capi")


@pytest.fixture(scope="session")
def server_env() -> dict[str, str]:
    env = dict(os.environ)
    if not env.get("ORT_DYLIB_PATH"):
        dylib = _ort_dylib()
        if dylib:
            env["ORT_DYLIB_PATH"] = dylib
    env.setdefault("RUST_BACKTRACE", "1")
    return env


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> Path:
    """dtypes/, simple/ and broken/ repositories, generated and self-checked once."""
    out = tmp_path_factory.mktemp("models")
    res = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "gen_models.py"), "--out", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, f"gen_models.py failed:\n{res.stdout}\n{res.stderr}"
    return out


@pytest.fixture(scope="session")
def example_dir(tmp_path_factory) -> Path:
    """The example repository (mlp and the OCR pipeline), generated into a temp dir."""
    out = tmp_path_factory.mktemp("example")
    res = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "gen_models.py"),
                          "--out", str(out / "_unused"), "--example", str(out / "repo")],
                         capture_output=True, text=True, timeout=300)
    if res.returncode == 3:
        pytest.skip(f"rapidocr wheel unavailable: {res.stderr.strip()}")
    assert res.returncode == 0, f"gen_models.py --example failed:\n{res.stdout}\n{res.stderr}"
    return out / "repo"


def model_names(repo: Path) -> list[str]:
    return sorted(p.name for p in Path(repo).iterdir() if p.is_dir())


def servable_models(repos) -> list[str]:
    names = []
    for r in repos:
        names += [n for n in model_names(r) if n not in gen_models.BROKEN_MODELS]
    return names


# --------------------------------------------------------------------------
# Server factories
# --------------------------------------------------------------------------

class _Factory:
    def __init__(self, binary, env, tag):
        self.binary, self.env, self.tag = binary, env, tag
        self.servers: list[MeshServer] = []

    def __call__(self, repos, args=(), *, name=None, wait_models=None) -> MeshServer:
        repos = [Path(r) for r in repos]
        name = name or f"{self.tag}-{len(self.servers)}"
        if wait_models is None:
            wait_models = servable_models(repos)
        srv = MeshServer(self.binary, repos, list(args), LOG_DIR / f"{name}.log", self.env)
        srv.name = name
        try:
            srv.log_path.unlink()
        except FileNotFoundError:
            pass
        self.servers.append(srv)
        _ALL_SERVERS.append(srv)
        timeout = float(os.environ.get("MESH_TEST_STARTUP_SECS", "60"))
        return srv.start(wait_models, timeout=timeout)

    def close(self):
        for s in self.servers:
            s.stop()


@pytest.fixture(scope="session")
def server_factory(mesh_bin, server_env):
    """Start servers that live until the end of the session (or until stopped)."""
    f = _Factory(mesh_bin, server_env, "session")
    yield f
    f.close()


@pytest.fixture
def fresh_server(mesh_bin, server_env, request):
    """Start servers that are stopped (SIGKILL if need be) when the test ends."""
    tag = request.node.name.replace("/", "_").replace("[", "-").replace("]", "")
    f = _Factory(mesh_bin, server_env, tag)
    yield f
    f.close()


# --------------------------------------------------------------------------
# Clusters: mesh-router and the mesh-nodes that join it
# --------------------------------------------------------------------------

@pytest.fixture(scope="session")
def cluster_certs(cluster_bins, tmp_path_factory) -> ClusterCerts:
    """The cluster CA (`mesh-ops certs init`); members' certificates are issued on demand."""
    return ClusterCerts(cluster_bins["ops"], tmp_path_factory.mktemp("cluster-ca"))


@pytest.fixture
def cluster_factory(cluster_bins, server_env, cluster_certs, request):
    """Clusters whose processes are stopped (SIGKILL if need be) when the test ends."""
    tag = "cl-" + request.node.name.replace("/", "_").replace("[", "-").replace("]", "")
    f = ClusterFactory(cluster_bins, server_env, cluster_certs, tag, LOG_DIR, _ALL_SERVERS)
    yield f
    f.close()


@pytest.fixture(scope="module")
def module_cluster_factory(cluster_bins, server_env, cluster_certs, request):
    """Clusters shared by the tests of one module, stopped when the module ends."""
    f = ClusterFactory(cluster_bins, server_env, cluster_certs, "cl-" + request.module.__name__, LOG_DIR,
                       _ALL_SERVERS)
    yield f
    f.close()


# Largest HTTP request body the main server accepts (--http-max-input-size).
MAIN_MAX_INPUT_SIZE = 1 << 20


@pytest.fixture(scope="session")
def main_server(server_factory, models_dir) -> MeshServer:
    """dtypes + simple repositories; every model in them must load."""
    return server_factory(
        [models_dir / "dtypes", models_dir / "simple"],
        ["--http-max-input-size", str(MAIN_MAX_INPUT_SIZE), "--log-verbose", "1",
         "--exit-timeout-secs", "10"],
        name="main")


# The ensemble of the example repository; it is waited for only until it settles (ready or not).
EXAMPLE_ENSEMBLES = ["ocr"]


@pytest.fixture(scope="session")
def example_server(server_factory, example_dir) -> MeshServer:
    """The example repository, its Python models run by this interpreter (the project venv)."""
    wait = [m for m in model_names(example_dir) if m not in EXAMPLE_ENSEMBLES]
    srv = server_factory([example_dir], ["--backend-config", f"python,interpreter={sys.executable}"],
                         name="example", wait_models=wait)
    srv.settle(EXAMPLE_ENSEMBLES)
    return srv


@pytest.fixture(scope="session")
def broken_server(server_factory, models_dir) -> MeshServer:
    """broken + dtypes repositories, non-strict readiness; only `good` and the
    identity models load. As with tritonserver, --exit-on-error false keeps a
    server whose models failed to load running."""
    srv = server_factory([models_dir / "broken", models_dir / "dtypes"],
                         ["--strict-readiness", "false", "--exit-on-error", "false"], name="broken")
    srv.settle(gen_models.BROKEN_MODELS)
    return srv


@pytest.fixture(scope="session")
def http_client(main_server):
    import tritonclient.http as httpclient
    c = httpclient.InferenceServerClient(main_server.http_url, connection_timeout=30, network_timeout=60)
    yield c
    c.close()


@pytest.fixture(scope="session")
def grpc_client(main_server):
    import tritonclient.grpc as grpcclient
    c = grpcclient.InferenceServerClient(main_server.grpc_url)
    yield c
    c.close()


@pytest.fixture
def pb_utils_here(monkeypatch):
    """The mesh's triton_python_backend_utils imported into this process (freshly), with a stand-in
    stub host that keeps its log lines: (module, lines of (level, message))."""
    import importlib
    import types
    monkeypatch.syspath_prepend(str(REPO_ROOT / "crates" / "node" / "python"))
    lines = []
    host = types.ModuleType("mesh_stub_host")
    host.log = lambda level, message: lines.append((level, message))
    monkeypatch.setitem(sys.modules, "mesh_stub_host", host)
    monkeypatch.delitem(sys.modules, "triton_python_backend_utils", raising=False)
    return importlib.import_module("triton_python_backend_utils"), lines


@pytest.fixture
def add_sub_repo(models_dir, tmp_path) -> Path:
    """A private repository holding only add_sub."""
    repo = tmp_path / "repo"
    shutil.copytree(models_dir / "simple" / "add_sub", repo / "add_sub")
    return repo


# --------------------------------------------------------------------------
# Attach server logs to failing tests
# --------------------------------------------------------------------------

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item._mesh_t0 = time.monotonic()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when != "call" or not rep.failed:
        return
    t0 = getattr(item, "_mesh_t0", 0.0)
    funcargs = getattr(item, "funcargs", {})
    used = [v for v in funcargs.values() if isinstance(v, MeshServer)]
    for v in funcargs.values():  # clusters and cluster factories: every process they started
        if hasattr(v, "mesh_processes"):
            used += [p for p in v.mesh_processes() if p not in used]
    wanted = {_FIXTURE_SERVER[f] for f in getattr(item, "fixturenames", ()) if f in _FIXTURE_SERVER}
    used += [s for s in _ALL_SERVERS if getattr(s, "name", None) in wanted and s not in used]
    used += [s for s in _ALL_SERVERS if s.started_at >= t0 and s not in used]
    for s in used:
        rep.sections.append((f"{getattr(s, 'kind', 'mesh-node')} log {s.log_path} (tail)", s.log_tail(60)))
