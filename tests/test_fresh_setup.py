"""The fresh-machine promise, checked without a fresh machine (scripts/check-fresh.sh is the check
with one, and .ci/run runs it):

- the README's prerequisite line is exactly the list scripts/check-fresh.sh installs in its root;
- the build names the project's own protoc (scripts/protoc over protox), so no Debian protoc or
  include files are needed, and that shim makes a descriptor set with the well-known types that
  etcd-client's protos import;
- set-up stops at once, naming the package, when a prerequisite is missing.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def _check_fresh_prereqs() -> list[str]:
    text = (REPO_ROOT / "scripts" / "check-fresh.sh").read_text()
    m = re.search(r"^PREREQS=\(([^)]*)\)", text, re.M)
    assert m, "check-fresh.sh has no PREREQS=(...) line"
    return m.group(1).split()


def test_readme_lists_exactly_the_checked_prerequisites():
    readme = (REPO_ROOT / "README.md").read_text()
    m = re.search(r"`apt-get install --no-install-recommends ([^`]*)`", readme)
    assert m, "README names no apt-get line of prerequisites"
    assert m.group(1).split() == _check_fresh_prereqs()


def test_cargo_config_points_protoc_at_the_shim():
    cfg = (REPO_ROOT / ".cargo" / "config.toml").read_text()
    assert re.search(r'^PROTOC = \{ value = "scripts/protoc", relative = true \}', cfg, re.M)
    assert os.access(REPO_ROOT / "scripts" / "protoc", os.X_OK)
    assert "protobuf-compiler" not in (REPO_ROOT / "scripts" / "setup.sh").read_text()


def test_protoc_shim_compiles_with_well_known_types(tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "x.proto").write_text(
        'syntax = "proto3";\nimport "google/protobuf/descriptor.proto";\nimport "google/protobuf/struct.proto";\n'
        "message X { google.protobuf.FileDescriptorProto f = 1; google.protobuf.Struct s = 2; }\n")
    out = tmp_path / "set.bin"
    # As prost-build runs it, from a directory with no protoc on PATH.
    env = {k: v for k, v in os.environ.items() if k not in ("PROTOC", "PROTOC_INCLUDE")}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if not (Path(p) / "protoc").exists()) \
        or "/nonexistent"
    env["PATH"] += os.pathsep + str(Path(env.get("CARGO_HOME", Path.home() / ".cargo")) / "bin")
    r = subprocess.run([str(REPO_ROOT / "scripts" / "protoc"), "--include_imports", "--include_source_info",
                        "-o", str(out), "-I", str(tmp_path / "p"), str(tmp_path / "p" / "x.proto")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    from google.protobuf import descriptor_pb2
    fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    names = {f.name for f in fds.file}
    assert {"x.proto", "google/protobuf/descriptor.proto", "google/protobuf/struct.proto"} <= names
    # Options it does not have are refused by name, not ignored.
    r = subprocess.run([str(REPO_ROOT / "scripts" / "protoc"), "--rust_out=x", str(tmp_path / "p" / "x.proto")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and "--rust_out=x" in r.stderr


def test_setup_names_a_missing_prerequisite(tmp_path):
    env = dict(os.environ, PYTHON=str(tmp_path / "no-python3"))
    r = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "setup.sh")], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert f"setup: missing prerequisite: {tmp_path / 'no-python3'} (Debian: python3)" in r.stderr
    assert "Two commands for a fresh machine" in r.stderr


def test_check_fresh_refuses_an_unknown_prerequisite_to_leave_out():
    r = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "check-fresh.sh"), "--without", "no-such-package"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "not a prerequisite" in r.stderr and shlex.join(_check_fresh_prereqs()) in r.stderr


def test_crates_take_workspace_dependencies_with_the_workspaces_features():
    """A crate that adds features to a workspace dependency makes builds of different selections
    (`cargo build --bin mesh-node`, set-up's, the C API's) compile the shared tree again each."""
    import tomllib
    members = tomllib.loads((REPO_ROOT / "Cargo.toml").read_text())["workspace"]["members"]
    extra = []
    for member in members:
        manifest = tomllib.loads((REPO_ROOT / member / "Cargo.toml").read_text())
        for kind in ("dependencies", "build-dependencies"):
            for name, spec in manifest.get(kind, {}).items():
                if isinstance(spec, dict) and spec.get("workspace") and (spec.get("features") or "default-features" in spec):
                    extra.append(f"{member} [{kind}] {name}: {spec}")
    assert not extra, extra
