#!/usr/bin/env python3
"""Writes the book's flag references from the binaries' own `--help`: the table of every flag of
mesh-node (docs/src/reference/node-flags.md), mesh-router (router-flags.md) and every command of
mesh-ops (ops.md), below a marker line in each page; what is above the marker is written by hand.
Run it after changing a flag (tests/test_docs.py fails until the pages and the binaries agree):

    scripts/gen_reference.py [--bin-dir target/release]
"""
import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "src" / "reference"
MARKER = "<!-- Below: every flag, written by scripts/gen_reference.py from --help. Do not edit by hand. -->"
TRITON_FLAGS = ROOT / "tests" / "fixtures" / "tritonserver-2.51-flags.txt"
PAGES = {"mesh-node": "node-flags.md", "mesh-router": "router-flags.md", "mesh-ops": "ops.md"}


def help_text(binary: Path, command: list) -> str:
    out = subprocess.run([str(binary), *command, "--help"], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise SystemExit(f"{binary.name} {' '.join(command)} --help failed: {out.stderr}")
    return out.stdout


def flags_of(text: str) -> list:
    """(flag, value, description lines) for each option of a `--help` text (clap's long form)."""
    found = []
    lines = text.splitlines()
    try:
        start = lines.index("Options:") + 1
    except ValueError:
        return found
    current = None
    for line in lines[start:]:
        # An option's line: `  -h, --flag <V>` or `      --flag <V>`, its help after two spaces or
        # on the lines below (indented deeper).
        m = re.match(r"^(?:  -\w, |      )(--[a-z0-9][a-z0-9-]*)(?:[ =](.*?))?(?:  +(\S.*))?$", line)
        if m:
            current = [m.group(1), (m.group(2) or "").strip(), [m.group(3)] if m.group(3) else []]
            found.append(current)
        elif current is not None and line.strip():
            current[2].append(line.strip())
    return [(f, v, d) for f, v, d in found if f not in ("--help", "--version")]


def subcommands(text: str) -> list:
    lines = text.splitlines()
    if "Commands:" not in lines:
        return []
    names = []
    for line in lines[lines.index("Commands:") + 1:]:
        m = re.match(r"^  (\S+)\s", line)
        if not m:
            break
        if m.group(1) != "help":
            names.append(m.group(1))
    return names


def triton_flags() -> set:
    return {l.split()[0] for l in TRITON_FLAGS.read_text().splitlines() if l.startswith("--")}


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def table(binary: Path, command: list, triton: set) -> str:
    text = help_text(binary, command)
    rows = ["| flag | meaning |", "|---|---|"]
    for flag, value, desc in flags_of(text):
        words = " ".join(d for d in desc if d)
        if not words or words.startswith("["):
            lead = f"As tritonserver's `{flag}`." if flag in triton else "&nbsp;"
            words = f"{lead} {words}".strip()
        shown = f"`{flag} {value}`" if value else f"`{flag}`"
        rows.append(f"| {cell(shown)} | {cell(words)} |")
    out = "\n".join(rows) + "\n"
    for sub in subcommands(text):
        sub_text = help_text(binary, command + [sub])
        about = sub_text.splitlines()[0]
        out += f"\n### `{binary.name} {' '.join(command + [sub])}`\n\n{about}\n\n"
        out += table(binary, command + [sub], triton)
    return out


def generated(binary: Path) -> str:
    return MARKER + "\n\n## Every flag\n\n" + table(binary, [], triton_flags())


def write(bin_dir: Path) -> None:
    for name, page in PAGES.items():
        path = REFERENCE / page
        text = path.read_text() if path.exists() else f"# {name}\n\n"
        hand = text.split(MARKER)[0].rstrip() + "\n\n"
        path.write_text(hand + generated(bin_dir / name))
        print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin-dir", type=Path, default=ROOT / "target" / "release")
    write(parser.parse_args().bin_dir)
    sys.exit(0)
