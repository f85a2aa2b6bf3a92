#!/usr/bin/env python3
"""Checks that modules import only downward: no circle among the files of any crate, and in the
router, each layer imports only those below it and no file outside the supervisor and main.rs
names an actor. Run by scripts/test-all.sh; exits 1 naming what breaks the rule."""
import pathlib
import re
import sys

CRATES = pathlib.Path(__file__).resolve().parent.parent / "crates"
# The router's top-level modules, lowest layer first; a module imports its own layer or those below.
LAYERS = [
    {"membership", "route", "place", "lead", "repository", "ensembles", "stats", "metrics"},
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


def check_crate(src: pathlib.Path, router: bool, problems: list) -> int:
    files = sorted(p for p in src.rglob("*.rs") if not is_test(p.relative_to(src)))
    modules = {module_of(p.relative_to(src)) for p in files}
    edges = {}
    for p in files:
        rel = p.relative_to(src)
        me = module_of(rel)
        targets = set()
        for imp in imports(p, me):
            parts = imp.split("::")
            for n in range(len(parts), 0, -1):
                cand = "::".join(parts[:n])
                if cand in modules:
                    targets.add(cand)
                    break
        targets.discard(me)
        edges[me] = targets
        if router:
            check_router_file(str(rel), me, targets, problems)
    state = {}

    def visit(m, stack):
        state[m] = 1
        stack.append(m)
        for t in sorted(edges.get(m, ())):
            # A module and its own submodules may use each other.
            if t.startswith(m + "::") or m.startswith(t + "::"):
                continue
            if state.get(t) == 1:
                problems.append(f"{src.parent.name}: import circle: " + " -> ".join(stack[stack.index(t):] + [t]))
            elif not state.get(t):
                visit(t, stack)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if not state.get(m):
            visit(m, [])
    return len(files)


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
    for krate in sorted(CRATES.iterdir()):
        src = krate / "src"
        if src.is_dir():
            counted.append(f"{krate.name} {check_crate(src, krate.name == 'router', problems)}")
    for p in problems:
        print(p)
    if not problems:
        print(f"modules import only downward, without a circle (files: {', '.join(counted)})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
