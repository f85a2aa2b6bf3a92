"""scripts/torch_sys_patch.py, which lets tch's generated wrappers build against the GPU image's older
libtorch (scripts/pack-gpu.sh): with the real compiler, on a small file in tch's format, only the
wrappers that call an op the headers lack, or declare with other arguments, are made to throw, and
the file then compiles."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "torch_sys_patch.py"

HEADER = """#pragma once
#include <stdexcept>
#define PROTECT(x) try { x } catch (const std::exception &e) { }
namespace torch { inline int kept(int a) { return a; } inline int changed(int a) { return a; } }
"""

WRAPPER = """void atg_{name}(int *out__, int a) {{
  PROTECT(
    auto outputs__ = torch::{name}({args});
    out__[0] = outputs__;
  )
}}

"""


@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler")
def test_only_the_wrappers_the_headers_cannot_serve_are_stubbed(tmp_path):
    include = tmp_path / "include"
    (include / "ATen").mkdir(parents=True)
    (include / "fake.h").write_text(HEADER)
    source = tmp_path / "torch_api_generated.cpp"
    source.write_text('#include "fake.h"\n\n' + WRAPPER.format(name="kept", args="a")
                      + WRAPPER.format(name="missing", args="a") + WRAPPER.format(name="changed", args="a, a"))
    p = subprocess.run([sys.executable, str(SCRIPT), str(source), str(include)], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "2 wrappers throw: changed, missing" in p.stderr
    text = source.read_text()
    assert "auto outputs__ = torch::kept(a);" in text, "a wrapper the headers serve is left as it was"
    assert 'throw std::runtime_error("missing is not in this libtorch");' in text
    assert 'throw std::runtime_error("changed is not in this libtorch");' in text
    compiled = subprocess.run(["c++", "-fsyntax-only", "-I", str(include), source.name], cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)
    assert compiled.returncode == 0, compiled.stderr


def test_a_directory_without_aten_headers_is_refused(tmp_path):
    source = tmp_path / "x.cpp"
    source.write_text("")
    p = subprocess.run([sys.executable, str(SCRIPT), str(source), str(tmp_path)], capture_output=True, text=True,
                       timeout=30)
    assert p.returncode != 0 and "holds no ATen headers" in p.stderr
