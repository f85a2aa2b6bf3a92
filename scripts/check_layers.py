#!/usr/bin/env python3
"""Checks that modules import only downward: no circle among the files of any crate of the workspace
(its members in Cargo.toml) nor among the modules of the Python code (the stub's modules in
crates/node/python, the packages in python/), and in the router, each layer imports only those below
it and no file outside the supervisor and main.rs names an actor. Run by scripts/test-all.sh; exits 1
naming what breaks the rule."""
import ast
import pathlib
import re
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Python code that ships: a directory of flat modules, or a directory of packages.
PYTHON_FLAT = [ROOT / "crates" / "node" / "python"]
PYTHON_PACKAGES = ROOT / "python"
# The router's top-level modules, lowest layer first; a module imports its own layer or those below.
LAYERS = [
    {"membership", "route", "place", "lead", "repository", "ensembles", "stats", "metrics", "rollout"},
    {"messages"},
    {"shared"},
    {"actors"},
    {"dispatch", "api"},
    {"cli", "main"},
]
ACTOR_USERS = {"actors/supervisor.rs", "actors/mod.rs", "main.rs"}


def is_test(rel: pathlib.Path) -> bool:
    name = rel.stem
    return "sim" in rel.parts or name == "tests" or name.endswith("_tests") or "tests" in rel.parts[:-1]


def module_of(rel: pathlib.Path) -> str:
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "mod":
        parts.pop()
    if parts in (["lib"], ["main"]):
        return parts[0]
    return "::".join(parts)


def imports(path: pathlib.Path, me: str) -> set:
    """The paths a file names under `crate::` (or its crate's name) and `super::`, as crate paths."""
    text = path.read_text()
    # A file's own test module may reach anywhere; only the code that ships is checked.
    text = re.split(r"#\[cfg\(test\)\]\s*mod tests\s*\{", text)[0]
    # `prefix::{a, b::c}` names prefix::a and prefix::b::c.
    text = re.sub(
        r"\b(crate|super|mesh_\w+)::\{([^{}]*)\}",
        lambda m: " ".join(f"{m.group(1)}::{item.strip()}" for item in m.group(2).split(",") if item.strip()),
        text,
    )
    parent = me.split("::")[:-1] if me not in ("lib", "main") else []
    found = set()
    for m in re.finditer(r"\b(crate|super|mesh_\w+)::((?:\w+::)*\w+)", text):
        root, rest = m.group(1), m.group(2).split("::")
        found.add("::".join(parent + rest if root == "super" else rest))
    return found


def find_circles(edges: dict, where: str, problems: list, related=lambda a, b: False) -> None:
    """Adds each circle of `edges` (module -> modules it imports) to `problems`."""
    state = {}

    def visit(m, stack):
        state[m] = 1
        stack.append(m)
        for t in sorted(edges.get(m, ())):
            if related(m, t):
                continue
            if state.get(t) == 1:
                problems.append(f"{where}: import circle: " + " -> ".join(stack[stack.index(t):] + [t]))
            elif not state.get(t):
                visit(t, stack)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if not state.get(m):
            visit(m, [])


def innermost(name: str, sep: str, known) -> str | None:
    """The longest of the `known` modules that the path `name` (parts joined by `sep`) starts
    with: the module an import names, or None when it is none of ours."""
    parts = name.split(sep)
    for n in range(len(parts), 0, -1):
        if sep.join(parts[:n]) in known:
            return sep.join(parts[:n])
    return None


def check_crate(src: pathlib.Path, router: bool, problems: list, where: str = "") -> int:
    files = sorted(p for p in src.rglob("*.rs") if not is_test(p.relative_to(src)))
    modules = {module_of(p.relative_to(src)) for p in files}
    edges = {}
    for p in files:
        rel = p.relative_to(src)
        me = module_of(rel)
        targets = {t for imp in imports(p, me) if (t := innermost(imp, "::", modules))}
        targets.discard(me)
        edges[me] = targets
        if router:
            check_router_file(str(rel), me, targets, problems)
    # A module and its own submodules may use each other.
    find_circles(edges, where or src.parent.name, problems,
                 lambda m, t: t.startswith(m + "::") or m.startswith(t + "::"))
    return len(files)


def python_imports(path: pathlib.Path, package: str | None, modules=frozenset()) -> set:
    """The modules a Python file imports, as dotted names: every import statement, those inside
    functions and under `if TYPE_CHECKING:` too (a circle of types is a circle all the same).
    Relative imports are resolved within `package`; `from p import n` names the module `p.n` when
    it is one of `modules`, else `p` (n is a name p defines)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level and package:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return found


def check_python(files: dict, where: str, problems: list) -> int:
    """`files`: module name -> (path, its package or None). Adds the circles among them."""
    edges = {}
    for me, (path, package) in files.items():
        # A package's __init__ is the package's name.
        targets = {t for name in python_imports(path, package, frozenset(files)) if (t := innermost(name, ".", files))}
        targets.discard(me)
        edges[me] = targets
    # A package's __init__ gathers its modules' names: it imports them, and they are below it (a
    # module that imports a name from its package's __init__ closes a circle).
    find_circles(edges, where, problems)
    return len(files)


def python_modules(flat_dirs=PYTHON_FLAT, packages=PYTHON_PACKAGES) -> list:
    """(where, {module: (path, package)}) for each place Python code ships from."""
    found = []
    for flat in flat_dirs:
        found.append((flat.name, {p.stem: (p, None) for p in sorted(flat.glob("*.py"))}))
    for init in sorted(packages.glob("*/__init__.py")):
        top = init.parent
        modules = {}
        for p in sorted(top.rglob("*.py")):
            rel = p.relative_to(packages).with_suffix("")
            package = ".".join(rel.parts[:-1])
            name = package if rel.name == "__init__" else ".".join(rel.parts)
            modules[name] = (p, name if rel.name == "__init__" else package)
        found.append((f"{packages.name}/{top.name}", modules))
    return found


def workspace_crates() -> list:
    """The workspace's member crates, as Cargo.toml lists them."""
    members = tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["members"]
    return [ROOT / m for m in members]


def layer(top: str) -> int:
    return next((i for i, names in enumerate(LAYERS) if top in names), -1)


def check_router_file(rel: str, me: str, targets: set, problems: list) -> None:
    top = me.split("::")[0]
    if top == "lib":
        return
    if layer(top) < 0:
        problems.append(f"router/{rel}: module '{top}' is in no layer of scripts/check_layers.py")
        return
    for t in sorted(targets):
        ttop = t.split("::")[0]
        if ttop == "lib":
            continue
        if layer(ttop) > layer(top):
            problems.append(f"router/{rel} imports {t}, a higher layer")
        if ttop == "actors" and rel not in ACTOR_USERS:
            if top != "actors":
                problems.append(f"router/{rel} names the actor module {t}; only the supervisor and main.rs do")
            elif me.split("::")[:2] != t.split("::")[:2]:
                problems.append(f"router/{rel} names another actor, {t}: actors talk through mailboxes")


def main() -> int:
    problems = []
    counted = []
    for krate in workspace_crates():
        src = krate / "src"
        if not src.is_dir():
            problems.append(f"{krate.relative_to(ROOT)}: a workspace member without src/")
            continue
        where = krate.relative_to(ROOT).as_posix()
        counted.append(f"{where} {check_crate(src, where == 'crates/router', problems, where)}")
    for where, modules in python_modules():
        counted.append(f"{where} {check_python(modules, where, problems)}")
    for p in problems:
        print(p)
    if not problems:
        print(f"modules import only downward, without a circle (files: {', '.join(counted)})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
