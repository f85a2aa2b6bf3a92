"""The layer check (scripts/check_layers.py) finds the circles it promises to: among a Rust crate's
files, among flat Python modules (one hidden in a function or under TYPE_CHECKING too), and within
a Python package with relative imports; a package's __init__ gathering its modules is no circle.
No server involved."""
import importlib.util
import sys

from conftest import REPO_ROOT

SPEC = importlib.util.spec_from_file_location("check_layers", REPO_ROOT / "scripts" / "check_layers.py")
layers = importlib.util.module_from_spec(SPEC)
sys.modules["check_layers"] = layers
SPEC.loader.exec_module(layers)


def write(root, files: dict):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_circle_among_a_crates_files_is_found_and_a_submodule_is_not_one(tmp_path):
    write(tmp_path / "k" / "src", {
        "lib.rs": "mod a; mod b; mod c;\n",
        "a.rs": "use crate::b::B;\n",
        "b.rs": "use crate::{c::C, a::A};\n",
        "c.rs": "pub struct C;\n",
        "a/inner.rs": "use super::A;\n",  # a's own submodule may use it
    })
    problems = []
    assert layers.check_crate(tmp_path / "k" / "src", False, problems, "k") == 5
    assert problems == ["k: import circle: a -> b -> a"]


def test_circles_among_python_modules_are_found_wherever_the_import_is(tmp_path):
    flat = tmp_path / "flat"
    write(flat, {
        "utils.py": "import metrics\n",
        "metrics.py": "def f():\n    import utils\n",  # hidden in a function
        "plain.py": "import utils\nimport numpy\n",
    })
    packages = tmp_path / "python"
    write(packages, {
        "pkg/__init__.py": "from pkg._server import Server\nfrom pkg._model import Model\n",
        "pkg/_server.py": "from pkg._model import Model\n",
        "pkg/_model.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ._server import Server\n",
        "pkg/_types.py": "from . import _library\n",
        "pkg/_library.py": "import os\n",
        "other/__init__.py": "from other._a import A\n",
        "other/_a.py": "from other import B\n",  # a name of the package's __init__: a circle
    })
    problems = []
    for where, modules in layers.python_modules([flat], packages):
        layers.check_python(modules, where, problems)
    assert problems == [
        "flat: import circle: metrics -> utils -> metrics",
        "python/other: import circle: other -> other._a -> other",
        "python/pkg: import circle: pkg._model -> pkg._server -> pkg._model",
    ]


def test_the_workspace_is_read_from_cargo_toml():
    crates = {c.relative_to(REPO_ROOT).as_posix() for c in layers.workspace_crates()}
    assert {"crates/mesh", "crates/node", "crates/router", "crates/ops"} <= crates
    assert all((REPO_ROOT / c / "Cargo.toml").is_file() for c in crates)
