"""The book's examples (docs/src) as the tests run them: a chapter's code block, found by what it
holds, run as a user would copy it."""
import re
import subprocess
import sys
from pathlib import Path

BOOK = Path(__file__).resolve().parent.parent / "docs" / "src"


def block(chapter: str, language: str, holds: str) -> str:
    """The first `language` block of `chapter` (a path under docs/src) whose text matches the
    regular expression `holds`; fails the test when there is none."""
    text = (BOOK / chapter).read_text()
    for found in re.findall(rf"```{language}\n(.*?)```", text, re.S):
        if re.search(holds, found):
            return found
    raise AssertionError(f"docs/src/{chapter} has no {language} block holding {holds!r}")


def run_python(chapter: str, holds: str, tmp_path: Path, env: dict, models: Path) -> subprocess.CompletedProcess:
    """Runs that Python block with `env`, its `"target/models/simple"` pointed at `models`; the
    run must succeed."""
    script = tmp_path / "example.py"
    script.write_text(block(chapter, "python", holds).replace('"target/models/simple"', repr(str(models))))
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    return res
