"""The book's examples (README.md and docs/src) as the tests run them: every block a user would copy
is marked on the line before it, and a marked example is found by its name.

The marks (HTML comments, invisible in the rendered book):
- `<!-- example: NAME -->`: a test runs the block; NAME is unique across the book and appears in
  the test that runs it (as `example("NAME")`, or `example: NAME` in a Rust test);
- `<!-- excerpt: PATH -->`: lines taken from the file PATH (which a test compiles or runs); every
  line of the block is in it;
- `<!-- not run: REASON -->`: shown, not run, and why (e.g. the test command itself).
"""
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "docs" / "src"
# Languages whose blocks are commands or programs a user would copy.
COPYABLE = {"sh", "bash", "console", "shell", "python", "rust", "c", "cpp", "ini", "pbtxt"}
MARK = re.compile(r"^<!-- (example|excerpt|not run): (.+?) -->$")
FENCE = re.compile(r"^```(\S*)\s*$")


@dataclass
class Block:
    """One fenced block of a page: where it is, its language, its text and its mark (if any)."""
    page: Path
    line: int
    language: str
    text: str
    mark: tuple[str, str] | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    """The README and every page of the book."""
    return [ROOT / "README.md", *sorted(BOOK.rglob("*.md"))]


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of `page`, each with the mark on the nearest non-blank line before it."""
    lines = page.read_text().split("\n")
    found, i = [], 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].rstrip() == "```"), None)
        if end is None:
            raise AssertionError(f"{page.relative_to(ROOT)}:{i + 1}: a block that never ends")
        before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        mark = MARK.match(before)
        text = "\n".join(lines[i + 1:end]) + "\n"
        found.append(Block(page, i + 1, fence.group(1), text, mark.groups() if mark else None))
        i = end + 1
    return found


def all_blocks() -> list[Block]:
    return [b for page in pages() for b in blocks(page)]


def example(name: str) -> Block:
    """The block marked `<!-- example: NAME -->`; fails the test when there is none."""
    marked = [b for b in all_blocks() if b.mark == ("example", name)]
    assert len(marked) == 1, f"the book marks {len(marked)} blocks as example {name!r}, not one"
    return marked[0]


def run_text(text: str, cwd: Path, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs Python text as a script in `cwd` with this interpreter and `env`; the run must succeed."""
    script = cwd / "example.py"
    script.write_text(text)
    res = subprocess.run([sys.executable, str(script)], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                         env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    return res


def run_python(name: str, tmp_path: Path, env: dict, models: Path) -> subprocess.CompletedProcess:
    """Runs the Python example `name` with `env`, its `"target/models/simple"` pointed at `models`;
    the run must succeed."""
    text = example(name).text.replace('"target/models/simple"', repr(str(models)))
    return run_text(text, tmp_path, env, timeout=120)
