"""Runs PyTriton scripts on the mesh: PyTriton (the real `nvidia-pytriton` library) starts mesh-node
where it would start its bundled tritonserver, with the same flags.

    python -m mesh_pytriton my_script.py [ARGS...]     # the script unchanged
    import mesh_pytriton; mesh_pytriton.install()       # or one line before `Triton(...)`

mesh-node is `MESH_NODE_BIN`, else `mesh-node` on PATH, else this checkout's
`target/release/mesh-node`. `MESH_PYTRITON_ARGS` adds mesh-node flags (for example
`--cluster-join router:8003` and the certificate flags, so the bound functions join a cluster).
Python models (PyTriton's proxy models) run in this interpreter, which has PyTriton.
"""
import atexit
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

__all__ = ["install", "mesh_node"]


def mesh_node() -> str:
    """The mesh-node binary to run."""
    named = os.environ.get("MESH_NODE_BIN")
    if named:
        return named
    on_path = shutil.which("mesh-node")
    if on_path:
        return on_path
    here = Path(__file__).resolve()
    for root in here.parents:
        candidate = root / "target" / "release" / "mesh-node"
        if candidate.is_file():
            return str(candidate)
    raise RuntimeError("mesh-node not found: set MESH_NODE_BIN, put mesh-node on PATH, or build it (scripts/setup.sh)")


def install(extra_args=None) -> Path:
    """Points PyTriton at a stand-in distribution whose `bin/tritonserver` runs mesh-node with
    PyTriton's flags, the interpreter for Python models, `MESH_PYTRITON_ARGS` and `extra_args`.
    Returns the stand-in's directory (private, removed at exit)."""
    import pytriton.triton as triton

    node = mesh_node()
    dist = Path(tempfile.mkdtemp(prefix="mesh-pytriton-"))  # mode 0700, a fresh name
    atexit.register(shutil.rmtree, dist, True)
    for folder in ("bin", "backends/python", "caches"):
        (dist / folder).mkdir(parents=True)
    args = ["--backend-config", f"python,interpreter={sys.executable}"]
    args += shlex.split(os.environ.get("MESH_PYTRITON_ARGS", "")) + list(extra_args or [])
    script = dist / "bin" / "tritonserver"
    script.write_text(f'#!/bin/sh\nexec {shlex.quote(node)} "$@" {shlex.join(args)}\n')
    script.chmod(0o700)
    triton.TRITONSERVER_DIST_DIR = dist
    return dist
