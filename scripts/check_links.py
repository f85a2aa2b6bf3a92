#!/usr/bin/env python3
"""Checks the links of the README and of the book (docs/src): a relative link must name a file
that exists, an anchor (`#...`) a heading of its target (or of a file the target includes with
`{{#include}}`), and none may point outside the repository; the book's links stay inside the book
(mdBook publishes only docs/src). The summary (docs/src/SUMMARY.md) must list every chapter. Run by
scripts/docs.sh; exits 1 naming each broken link."""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "docs" / "src"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def slug(title: str) -> str:
    """The anchor mdBook and code hosts give a heading: its text (inline code and link text
    included), lower case, without punctuation, spaces as dashes."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def without_fences(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def outside_code(text: str) -> str:
    """The text without fenced code blocks and inline code (links there are not links)."""
    return re.sub(r"`[^`\n]*`", "", without_fences(text))


INCLUDE = re.compile(r"^\{\{#include ([^\s:}]+)\}\}$", re.M)


def with_includes(path: Path) -> str:
    """The page as mdBook renders it: each line `{{#include FILE}}` replaced by that file's text (a
    page of the book may be a file kept elsewhere in the repository)."""
    def included(m):
        target = path.parent / m.group(1)
        return target.read_text() if target.is_file() else m.group(0)
    return INCLUDE.sub(included, path.read_text())


def anchors(path: Path) -> set:
    found = set()
    for line in without_fences(with_includes(path)).splitlines():
        m = re.match(r"^#{1,6} (.*)$", line)
        if m:
            found.add(slug(m.group(1)))
    return found


def check_file(path: Path, inside: Path, problems: list) -> None:
    rel = path.relative_to(ROOT)
    for target in LINK.findall(outside_code(path.read_text())):
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.is_relative_to(inside):
            where = "the repository" if inside == ROOT else inside.relative_to(ROOT).as_posix()
            problems.append(f"{rel}: '{target}' points outside {where}")
            continue
        if not dest.exists():
            problems.append(f"{rel}: '{target}': no such file")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{rel}: '{target}': {dest.relative_to(ROOT)} has no heading '#{anchor}'")


def check_summary(problems: list) -> None:
    summary = BOOK / "SUMMARY.md"
    listed = {(BOOK / t).resolve() for t in LINK.findall(summary.read_text())}
    for chapter in sorted(BOOK.rglob("*.md")):
        if chapter != summary and chapter.resolve() not in listed:
            problems.append(f"{chapter.relative_to(ROOT)}: a chapter SUMMARY.md does not list")


def main() -> int:
    problems = []
    check_file(ROOT / "README.md", ROOT, problems)
    for page in sorted(BOOK.rglob("*.md")):
        check_file(page, BOOK, problems)
    check_summary(problems)
    for p in problems:
        print(p)
    if not problems:
        print("links: every link of the README and the book leads somewhere")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
