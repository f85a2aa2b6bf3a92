#!/usr/bin/env python3
"""Makes tch's generated C++ wrappers (torch-sys's libtch/torch_api_generated.cpp) build against an
older libtorch: each wrapper that calls an ATen op the given headers do not declare, or declare
with other arguments, gets a body that throws instead (a TorchScript model never reaches those
wrappers; the mesh calls none of them). The compiler says which (-fsyntax-only): each wrapper it
reports an error in is stubbed, until the file compiles.

    torch_sys_patch.py <torch_api_generated.cpp> <libtorch include dir>
"""
import re
import subprocess
import sys
from pathlib import Path

CALL = re.compile(r"^\s+auto outputs__ = torch::(\w+)\(")


def stub_lines(source: str, bad_lines: set[int]) -> tuple[str, list[str]]:
    """Stubs each wrapper whose body holds one of `bad_lines` (1-based)."""
    lines = source.splitlines(keepends=True)
    out, stubbed, i = [], [], 0
    while i < len(lines):
        m = CALL.match(lines[i])
        if m:
            end = i
            while lines[end].strip() != ")":
                end += 1
            if any(i + 1 <= n <= end + 1 for n in bad_lines):
                stubbed.append(m.group(1))
                out.append(f'    throw std::runtime_error("{m.group(1)} is not in this libtorch");\n')
                i = end
                continue
        out.append(lines[i])
        i += 1
    return "".join(out), stubbed


def compile_errors(path: Path, include: Path) -> set[int]:
    """The lines of the file the compiler reports errors at (empty: it compiles)."""
    include = include.resolve()
    cmd = ["c++", "-fsyntax-only", "-w", "-std=c++17", "-D_GLIBCXX_USE_CXX11_ABI=1", "-I", str(include),
           "-I", str(include / "torch" / "csrc" / "api" / "include"), path.name]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=path.parent)
    lines = {int(m.group(1)) for m in re.finditer(rf"^{re.escape(path.name)}:(\d+):\d+: error", res.stderr, re.M)}
    if res.returncode != 0 and not lines:
        sys.exit(f"torch_sys_patch: the compiler failed outside the file:\n{res.stderr[-2000:]}")
    return lines


def main():
    path, include = Path(sys.argv[1]), Path(sys.argv[2])
    if not (include / "ATen").is_dir():
        sys.exit(f"torch_sys_patch: {include} holds no ATen headers")
    stubbed = []
    for _ in range(6):
        bad = compile_errors(path, include)
        if not bad:
            break
        text, more = stub_lines(path.read_text(), bad)
        if not more:
            sys.exit(f"torch_sys_patch: errors outside the op wrappers, at lines {sorted(bad)[:10]}")
        stubbed += more
        path.write_text(text)
    else:
        sys.exit("torch_sys_patch: the file still does not compile after six rounds")
    print(f"torch_sys_patch: {len(stubbed)} wrappers throw: {', '.join(sorted(set(stubbed)))}", file=sys.stderr)


if __name__ == "__main__":
    main()
