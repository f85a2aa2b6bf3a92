"""The book's Performance page is a view of the benchmark data, not prose to keep in step by hand:
its headline table, its charts and its Results files page are exactly what benches/plots.py writes
from benches/results/, and every figure of the table is in the data file its row links to, on a row
of the same machine and date (read here with this file's own parser, not the script's). No server
involved."""
import csv
import importlib.util
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

from conftest import REPO_ROOT

BOOK = REPO_ROOT / "docs" / "src"
RESULTS = REPO_ROOT / "benches" / "results"
PLOTS = REPO_ROOT / "benches" / "plots.py"

_spec = importlib.util.spec_from_file_location("check_links", REPO_ROOT / "scripts" / "check_links.py")
check_links = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_links)


def test_the_committed_page_charts_and_results_page_are_what_the_script_writes(tmp_path):
    res = subprocess.run([sys.executable, str(PLOTS), "--out", str(tmp_path)], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    committed = sorted(["performance.md"] + [p.relative_to(BOOK).as_posix()
                                             for p in (BOOK / "performance").iterdir()
                                             if p.suffix == ".svg" or p.name == "results.md"])
    assert written == committed, "run python3 benches/plots.py (and remove charts it no longer writes)"
    for rel in written:
        assert (tmp_path / rel).read_bytes() == (BOOK / rel).read_bytes(), \
            f"docs/src/{rel} is not what benches/plots.py writes: run python3 benches/plots.py"
        if rel.endswith(".svg"):
            ET.parse(tmp_path / rel)  # well-formed
            assert f"]({rel})" in (BOOK / "performance.md").read_text(), f"the page does not show {rel}"


def data_file(anchor: str) -> str:
    """The data file a link into the Results files page names: the heading the anchor points at."""
    results = (BOOK / "performance" / "results.md").read_text()
    for title in re.findall(r"^## (.*)$", results, re.M):
        if check_links.slug(title) == anchor:
            m = re.fullmatch(r"`benches/results/([\w.-]+)`", title)
            assert m, title
            return m.group(1)
    raise AssertionError(f"results.md has no heading #{anchor}")


def figure(cell: str) -> float:
    m = re.match(r"^(\d[\d ]*(?:\.\d+)?) ", cell)
    assert m, cell
    return float(m.group(1).replace(" ", ""))


def headline_rows(page: str) -> list:
    table = page.split("<!-- The table below")[1].split("<!-- The table above")[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in table.splitlines() if line.startswith("| ")]
    assert rows[0][:5] == ["against", "what", "mesh", "reference", "mesh / reference"], rows[0]
    return rows[1:]


def problems_of(page: str) -> list:
    """Each figure of the headline table that its data file lacks, and each ratio that is not the
    ratio of the row's figures."""
    problems = []
    rows = headline_rows(page)
    assert len(rows) >= 10, "the headline table has lost its rows"
    for against, what, mesh, ref, ratio, where, data in rows:
        machine, date = where.rsplit(", ", 1)
        link = re.fullmatch(r"\[([\w.-]+)\]\(performance/results\.md#([\w-]+)\)", data)
        assert link, data
        name = data_file(link.group(2))
        assert name == link.group(1), (name, data)
        with open(RESULTS / name, newline="", encoding="utf-8") as f:
            values = {(r["machine"], r["date"], float(r["value"])) for r in csv.DictReader(f)}
        for cell in (mesh, ref):
            if (machine, date, figure(cell)) not in values:
                problems.append(f"{what}: {cell} ({machine}, {date}) is not in {name}")
        want = figure(mesh) / figure(ref)
        shown = float(re.match(r"^([\d.]+)×", ratio).group(1))
        places = len(ratio.split("×")[0].partition(".")[2])
        if abs(shown - want) > 0.5 * 10 ** -places + 1e-9:
            problems.append(f"{what}: ratio {ratio}, the figures give {want:.3f}")
    return problems


def test_every_figure_of_the_headline_table_is_in_the_data_file_its_row_links_to():
    assert problems_of((BOOK / "performance.md").read_text()) == []


def test_the_check_finds_a_figure_that_is_not_in_its_data_file():
    page = (BOOK / "performance.md").read_text()
    assert "| 2 640 infer/s | 2 099 infer/s | 1.26× |" in page
    tampered = page.replace("| 2 640 infer/s | 2 099 infer/s | 1.26× |", "| 2 641 infer/s | 2 099 infer/s | 1.26× |")
    assert [p for p in problems_of(tampered) if "2 641" in p]
    tampered = page.replace("| 2 640 infer/s | 2 099 infer/s | 1.26× |", "| 2 640 infer/s | 2 099 infer/s | 1.62× |")
    assert [p for p in problems_of(tampered) if "1.62×" in p]


def test_every_data_file_is_one_measurement_a_row_with_its_date_and_machine():
    for path in sorted(RESULTS.glob("*.csv")):
        if path.name == "headline.csv":
            continue
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            cols = reader.fieldnames
            assert cols[:3] == ["date", "machine", "bench"] and cols[-2:] == ["metric", "value"], (path.name, cols)
            rows = list(reader)
        assert rows, path.name
        for r in rows:
            assert re.fullmatch(r"\d{4}-\d\d-\d\d", r["date"]) and r["machine"] and r["metric"], (path.name, r)
            float(r["value"])
        keys = [tuple(r[c] for c in cols[:-1]) for r in rows]
        assert len(keys) == len(set(keys)), f"{path.name}: two rows measure the same thing"
