#!/usr/bin/env python3
"""Draws where the mesh stands from the benchmark results: reads the data files of benches/results/
(CSV, one measurement a row) and writes the headline table of the book's Performance page
(docs/src/performance.md, between its two markers), the page that shows every data file
(docs/src/performance/results.md) and the page's charts (docs/src/performance/*.svg).

The table's rows are benches/results/headline.csv: for each, the data file and two selectors, one for
the mesh's figure and one for its reference's (`column=value;...`, matching exactly one row of the
file). The figures, the machine and the date come from those rows; the ratio is mesh / reference.
Plain Python 3 standard library: the SVG is written by hand, and the same data always gives the
same bytes.

    python3 benches/plots.py            # rewrites the files in docs/src
    python3 benches/plots.py --out DIR  # writes performance.md and performance/ into DIR instead

tests/test_bench_plots.py runs it with --out and compares with what is committed."""
import argparse
import csv
import math
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benches" / "results"
BOOK = ROOT / "docs" / "src"
PAGE = "performance.md"
BEGIN = "<!-- The table below is written by benches/plots.py from benches/results/headline.csv. Do not edit it by hand. -->"
END = "<!-- The table above is written by benches/plots.py. -->"

MESH, TRITON, RAW, LIGHT, INK, GRID = "#3568a8", "#d9822b", "#4f9a5a", "#a9c3e3", "#222222", "#cccccc"

# Every data file in benches/results, what measured it and the round (benches/results/rounds.md)
# that tells the story; the first words of that round's heading find its anchor.
FILES = {
    "headline.csv": ("benches/plots.py",
                     "The rows of the Performance page's table: for each, the data file and the "
                     "selectors of the mesh's figure and of its reference's.", []),
    "e2e-vm.csv": ("benches/e2e.sh",
                   "The MLP in process (raw ONNX Runtime), through perf_analyzer over gRPC and HTTP, and "
                   "with the lean Rust client (`grpc_load`); its `ServerLive` rows are the transport "
                   "floor of the mesh and of Triton 2.51 in the same run. Report: `e2e-vm.md`.",
                   ["Issue 3, second session"]),
    "python-vm.csv": ("benches/python.sh",
                      "The same `model.py` files on mesh-node and on Triton 2.51's Python backend, "
                      "perf_analyzer over gRPC with both servers up and the points alternating; one BLS "
                      "call timed inside a model; the stubs' memory. Report: `python-vm.md`.",
                      ["Issue 26, seventh part"]),
    "ensemble-vm.csv": ("benches/ensemble.sh",
                        "ONNX ensembles on the mesh, and a 2-step Python ensemble on the mesh and on "
                        "Triton 2.51, perf_analyzer over gRPC. Report: `ensemble-vm.md`.",
                        ["Issue 26, sixth part"]),
    "torch-vm.csv": ("benches/torch.sh",
                     "A TorchScript MLP served by mesh-node against the same `model.pt` called by torch "
                     "in-process from as many threads. Report: `torch-vm.md`.", ["Issue 6"]),
    "batching-vm.csv": ("benches/batching.sh",
                        "Three MLPs at c=16, without and with dynamic batching, and raw ONNX Runtime at "
                        "the batch formed. Report: `batching-vm.md`.", ["Issue 26, second part"]),
    "batching-ab-vm.csv": ("benches/batching_ab.sh",
                           "Two builds, two rounds: the README's MLP with dynamic batching (`mlp`) and "
                           "without (`mlp_plain`), perf_analyzer over gRPC.", ["Issue 42, part 3"]),
    "inprocess-vm.csv": ("benches/inprocess.py",
                         "The MLP one call at a time: ONNX Runtime from Python, the mesh's C API from "
                         "C, its `tritonserver` package, mesh-node over HTTP and gRPC; perf_analyzer's "
                         "C API mode on each library. The figures of `inprocess-20261204-2020.json`.",
                         ["Issue 43: the Python package"]),
    "raw-ort-vm.csv": ("benches/raw_ort.rs",
                       "The MLP in a Rust program: ONNX Runtime's `Session::run`, the mesh's backend, a "
                       "whole node embedded.", ["Issue 43, part 1", "Issue 52: fair shares"]),
    "cluster-vm.csv": ("benches/cluster.sh",
                       "One node called directly and through mesh-router: the MLP with the lean client "
                       "and perf_analyzer, 16 MiB tensors with and without the link's shared memory. "
                       "Report: `cluster-vm.md`.", ["Issue 26, third part"]),
    "link-vm.csv": ("benches/link.rs",
                    "The cluster link alone in one process against a gRPC hop over TCP, echo. Report: "
                    "`link-vm.md`.", ["Issue 26, third part"]),
    "router-cpu-vm.csv": ("benches/router_cpu.sh",
                          "One node and one router, the lean client on the MLP; each process's CPU per "
                          "request; pinned points started under `taskset`; without and with "
                          "`--busy-poll-us 300`. Report: the second half of `router-cpu-vm.md`.",
                          ["Issue 26, fourth part"]),
    "fair-shares-vm.csv": ("benches/fair_shares.py",
                           "A fast model's latency (the victim) before and while a Python model is "
                           "flooded at c=256, fair shares against first come, first served. Report "
                           "(the pinned run): `fair-shares-vm.md`.", ["Issue 52: fair shares"]),
    "router-trace-vm.csv": ("benches/router_trace.sh",
                            "The example MLP through one router and one node, perf_analyzer over gRPC "
                            "at c=8: the build before the router traced (A), the new build with tracing "
                            "off (B) and with every request traced on router and node to a collector on "
                            "loopback (C), interleaved over rounds; medians, each process's CPU per "
                            "request. Report: `router-trace-vm.md`.", []),
    "sequences-vm.csv": ("benches/sequences_e2e.py, benches/sequences.rs",
                         "STARTs per second over gRPC as 100 000 sequences stay open, and the sequence "
                         "table alone before and after its change. Report: `sequences-e2e-vm.md`.",
                         ["Issue 52: open sequences"]),
}

_tables = {}


def load(name: str) -> list:
    """The rows of a data file, as dicts of strings."""
    if name not in _tables:
        with open(RESULTS / name, newline="", encoding="utf-8") as f:
            _tables[name] = list(csv.DictReader(f))
    return _tables[name]


def select(name: str, spec: str) -> dict:
    """The one row of `name` that matches every `column=value` of `spec` (`;`-separated)."""
    want = dict(part.split("=", 1) for part in spec.split(";"))
    rows = load(name)
    unknown = set(want) - set(rows[0])
    if unknown:
        raise SystemExit(f"{name} has no column {sorted(unknown)}")
    found = [r for r in rows if all(r[k] == v for k, v in want.items())]
    if len(found) != 1:
        raise SystemExit(f"{name}: '{spec}' matches {len(found)} rows, not one")
    return found[0]


def value(name: str, spec: str) -> float:
    return float(select(name, spec)["value"])


def grouped(text: str) -> str:
    """A figure as the house writes it: thousands apart by a space (2 640, 5.37)."""
    whole, dot, frac = text.partition(".")
    sign = "-" if whole.startswith("-") else ""
    whole = whole.lstrip("-")
    if len(whole) > 4 or (len(whole) == 4 and not frac):
        whole = f"{int(whole):,}".replace(",", " ")
    return sign + whole + dot + frac


def number(v: float, places: int) -> str:
    return grouped(f"{v:.{places}f}")


def decimals(text: str) -> int:
    return len(text.partition(".")[2])


def ratio_text(r: float) -> str:
    return f"{r:.0f}×" if r >= 10 else f"{r:.2f}×"


def slug(title: str) -> str:
    """The anchor mdBook gives a heading (as scripts/check_links.py computes it)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def file_anchor(name: str) -> str:
    return slug(f"`benches/results/{name}`")


def round_link(prefix: str) -> str:
    """A link from docs/src/performance/ to the round of benches/results/rounds.md whose heading
    starts with `prefix`."""
    headings = re.findall(r"^## (.*)$", (RESULTS / "rounds.md").read_text(encoding="utf-8"), re.M)
    found = [h for h in headings if h.startswith(prefix)]
    if len(found) != 1:
        raise SystemExit(f"rounds.md: {len(found)} headings start with '{prefix}'")
    return f"[{prefix}](rounds.md#{slug(found[0])})"


# The headline table.

def headline() -> str:
    lines = ["| against | what | mesh | reference | mesh / reference | machine, date | data |",
             "|---|---|---|---|---|---|---|"]
    with open(RESULTS / "headline.csv", newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            name, unit = row["file"], row["unit"]
            mesh, ref = select(name, row["mesh"]), select(name, row["reference"])
            for k in ("machine", "date"):
                if mesh[k] != ref[k]:
                    raise SystemExit(f"headline: {row['workload']}: the mesh's and the reference's {k} differ")
            m, r = float(mesh["value"]), float(ref["value"])
            ratio = ratio_text(m / r)
            if unit == "µs":
                places = max(decimals(mesh["value"]), decimals(ref["value"]))
                diff = number(m - r, places)
                ratio += f" ({'' if diff.startswith('-') else '+'}{diff} µs)"
            cells = [row["against"], row["workload"], f"{grouped(mesh['value'])} {unit}",
                     f"{grouped(ref['value'])} {unit}", ratio, f"{mesh['machine']}, {mesh['date']}",
                     f"[{name}](performance/results.md#{file_anchor(name)})"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def page(template: str) -> str:
    before, sep, rest = template.partition(BEGIN)
    _, sep2, after = rest.partition(END)
    if not sep or not sep2:
        raise SystemExit(f"docs/src/{PAGE} lacks the markers of its table")
    return f"{before}{BEGIN}\n\n{headline()}\n{END}{after}"


def results_page() -> str:
    names = sorted(p.name for p in RESULTS.glob("*.csv"))
    missing = [n for n in names if n not in FILES]
    if missing:
        raise SystemExit(f"benches/plots.py does not describe {missing}: add them to FILES")
    out = ["# Results files", "",
           "<!-- Written by benches/plots.py from benches/results/. Do not edit by hand. -->", "",
           "The data behind the table and the charts of [Performance](../performance.md): one CSV file "
           "per benchmark in `benches/results/`, one measurement a row (its date, the machine, the "
           "benchmark, what was measured, the metric and its value). Each was taken from the run's "
           "report and its round in [Rounds of measurement](rounds.md).", ""]
    for name in ["headline.csv"] + [n for n in names if n != "headline.csv"]:
        bench, what, rounds = FILES[name]
        dates = sorted({r["date"] for r in load(name)}) if name != "headline.csv" else []
        benches = ", ".join(f"`{b}`" for b in bench.split(", "))
        line = f"{benches}" + (f", {' and '.join(dates)}" if dates else "") + f". {what}"
        if rounds:
            line += " Round" + ("s" if len(rounds) > 1 else "") + ": " + ", ".join(map(round_link, rounds)) + "."
        out += [f"## `benches/results/{name}`", "", line, "", "```text",
                f"{{{{#include ../../../benches/results/{name}}}}}", "```", ""]
    return "\n".join(out)


# SVG, by hand.

def esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def f1(v: float) -> str:
    return f"{v:.1f}"


class Svg:
    def __init__(self, width: int, height: int, title: str):
        self.width, self.height, self.title = width, height, title
        self.parts = [f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>']

    def text(self, x, y, s, anchor="start", size=12, weight="normal", fill=INK):
        self.parts.append(f'<text x="{f1(x)}" y="{f1(y)}" text-anchor="{anchor}" font-size="{size}" '
                          f'font-weight="{weight}" fill="{fill}">{esc(s)}</text>')

    def rect(self, x, y, w, h, fill):
        self.parts.append(f'<rect x="{f1(x)}" y="{f1(y)}" width="{f1(w)}" height="{f1(h)}" fill="{fill}"/>')

    def line(self, x1, y1, x2, y2, stroke=GRID, dash=False, width=1):
        extra = ' stroke-dasharray="4 3"' if dash else ""
        self.parts.append(f'<line x1="{f1(x1)}" y1="{f1(y1)}" x2="{f1(x2)}" y2="{f1(y2)}" '
                          f'stroke="{stroke}" stroke-width="{width}"{extra}/>')

    def head(self, title, note):
        self.text(12, 22, title, size=14, weight="bold")
        self.text(12, self.height - 10, note, size=11, fill="#555555")

    def legend(self, x, y, items):
        for label, color in items:
            self.rect(x, y - 9, 10, 10, color)
            self.text(x + 14, y, label, size=11)
            x += 22 + 6.5 * len(label)

    def render(self) -> str:
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" height="{self.height}" '
                f'viewBox="0 0 {self.width} {self.height}" font-family="sans-serif">\n'
                f"<title>{esc(self.title)}</title>\n" + "\n".join(self.parts) + "\n</svg>\n")


def hbars(svg, rows, top, left, width, scale, bar=16, gap=8):
    """Horizontal bars: rows of (label, value, color, value label); `scale` maps a value to x."""
    y = top
    for label, v, color, shown in rows:
        svg.text(left - 8, y + bar - 4, label, anchor="end")
        end = scale(v)
        svg.rect(left, y, end - left, bar, color)
        svg.text(end + 5, y + bar - 4, shown, size=11)
        y += bar + gap
    return y


def dates_of(*names) -> str:
    return ", ".join(sorted({r["date"] for n in names for r in load(n)}))


def chart_triton() -> tuple:
    """mesh / Triton 2.51 throughput per Python workload, perf_analyzer, both in one run."""
    points = [("python-vm.csv", "add_sub", c, f"Python add_sub, c={c}") for c in (1, 4, 8)]
    points += [("python-vm.csv", "bls_x2", c, f"BLS model (2 calls), c={c}") for c in (1, 4, 8)]
    points += [("ensemble-vm.csv", "ens_py2", c, f"2-step Python ensemble, c={c}") for c in (1, 8)]
    rows = []
    for name, case, c, label in points:
        sel = f"case={case};concurrency={c};metric=infer_per_s;path="
        r = value(name, sel + "mesh") / value(name, sel + "Triton 2.51")
        rows.append((label, r, MESH, f"{r:.2f}×"))
    top, left, width, hi = 44, 230, 400, 2.0
    height = top + len(rows) * 24 + 64
    svg = Svg(720, height, "mesh / Triton 2.51 throughput")
    svg.head("Throughput, mesh / Triton 2.51 (perf_analyzer over gRPC, both in one run)",
             f"2-vCPU VM, {dates_of('python-vm.csv', 'ensemble-vm.csv')}; python-vm.csv, ensemble-vm.csv. "
             "Right of 1: the mesh serves more.")
    scale = lambda v: left + width * v / hi  # noqa: E731
    bottom = top + len(rows) * 24 - 4
    for t in (0, 0.5, 1.0, 1.5, 2.0):
        svg.line(scale(t), top - 4, scale(t), bottom, dash=False)
        svg.text(scale(t), bottom + 16, f"{t:g}×", anchor="middle", size=11)
    hbars(svg, rows, top, left, width, scale)
    svg.line(scale(1), top - 8, scale(1), bottom + 2, stroke=TRITON, dash=True, width=2)
    svg.text(scale(1) + 4, top - 10, "Triton 2.51", size=11, fill=TRITON)
    return "triton-throughput.svg", svg.render()


def chart_latency() -> tuple:
    """One request at a time, p50, log scale: raw ONNX Runtime, the mesh's paths, Triton's library."""
    name = "inprocess-vm.csv"
    points = [("mlp", "raw ONNX Runtime from Python (1 thread)", "MLP: ONNX Runtime from Python", RAW),
              ("mlp", "mesh C API from C", "MLP: mesh C API, from C", MESH),
              ("mlp", "mesh tritonserver package from Python", "MLP: mesh Python package", MESH),
              ("mlp", "mesh-node over HTTP (tritonclient)", "MLP: mesh-node over HTTP", MESH),
              ("mlp", "mesh-node over gRPC (tritonclient)", "MLP: mesh-node over gRPC", MESH),
              ("add_sub_py perf_analyzer C API mode", "Triton 2.51 library", "Python add_sub: Triton 2.51 C API", TRITON),
              ("add_sub_py perf_analyzer C API mode", "mesh library", "Python add_sub: mesh C API", MESH)]
    rows = []
    for case, path, label, color in points:
        row = select(name, f"case={case};path={path};metric=p50_us")
        rows.append((label, float(row["value"]), color, f"{grouped(row['value'])} µs"))
    top, left, width = 62, 250, 380
    lo, hi = 1.0, 1000.0
    scale = lambda v: left + width * (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))  # noqa: E731
    height = top + len(rows) * 24 + 64
    svg = Svg(720, height, "p50 latency by path, log scale")
    svg.head("One request at a time: p50 in µs, log scale (one run)",
             f"2-vCPU VM, {dates_of(name)}; {name}. Client and server share the 2 vCPUs.")
    svg.legend(left, 44, [("raw ONNX Runtime", RAW), ("mesh", MESH), ("Triton 2.51", TRITON)])
    bottom = top + len(rows) * 24 - 4
    for t in (1, 10, 100, 1000):
        svg.line(scale(t), top - 4, scale(t), bottom)
        svg.text(scale(t), bottom + 16, f"{t} µs", anchor="middle", size=11)
    hbars(svg, rows, top, left, width, scale)
    return "latency-p50.svg", svg.render()


def chart_fair_shares() -> tuple:
    """The victim's p99, quiet and flooded, fair shares against first come, first served."""
    name = "fair-shares-vm.csv"
    groups = [("node pinned to CPU 0", "fair shares", "fair shares, node on its own core"),
              ("node pinned to CPU 0", "first come", "first come, node on its own core"),
              ("all on the 2 vCPUs", "fair shares", "fair shares, all on 2 vCPUs"),
              ("all on the 2 vCPUs", "first come", "first come, all on 2 vCPUs")]
    top, left, width, hi = 62, 245, 300, 8000.0
    scale = lambda v: left + width * v / hi  # noqa: E731
    height = top + len(groups) * 48 + 56
    svg = Svg(760, height, "fair shares: the other model's p99, quiet and flooded")
    svg.head("Another model's p99 (µs), quiet and while one model is flooded at c=256",
             f"2-vCPU VM, {dates_of(name)}; {name}. First come: the p99 of the few requests let in.")
    svg.legend(left, 44, [("quiet", LIGHT), ("flooded", MESH)])
    bottom = top + len(groups) * 48 - 8
    for t in range(0, 8001, 2000):
        svg.line(scale(t), top - 4, scale(t), bottom)
        svg.text(scale(t), bottom + 16, grouped(str(t)), anchor="middle", size=11)
    y = top
    for setup, path, label in groups:
        sel = f"setup={setup};path={path};"
        quiet = select(name, sel + "phase=quiet;metric=p99_us")["value"]
        flooded = select(name, sel + "phase=flooded;metric=p99_us")["value"]
        failed = select(name, sel + "phase=flooded;metric=failed")["value"]
        asked = select(name, sel + "phase=flooded;metric=requests")["value"]
        svg.text(left - 8, y + 24, label, anchor="end")
        for i, (v, color) in enumerate(((quiet, LIGHT), (flooded, MESH))):
            svg.rect(left, y + i * 18, scale(float(v)) - left, 16, color)
            svg.text(scale(float(v)) + 5, y + i * 18 + 12, grouped(v), size=11)
        svg.text(left + width + 50, y + 24, f"{grouped(failed)} of {grouped(asked)} refused", size=11,
                 fill=INK if failed == "0" else "#b03030")
        y += 48
    return "fair-shares.svg", svg.render()


def chart_sequences() -> tuple:
    """STARTs per second over gRPC for each block of 10 000, as the sequences stay open."""
    name = "sequences-vm.csv"
    rows = sorted((int(r["open_sequences"]), float(r["value"]), r["value"]) for r in load(name)
                  if r["bench"] == "sequences_e2e.py" and r["metric"] == "starts_per_s")
    top, left, plot_h, hi = 50, 70, 200, 12000.0
    bar, gap = 44, 16
    height = top + plot_h + 66
    svg = Svg(720, height, "STARTs per second as sequences stay open")
    first, last = rows[0][1], rows[-1][1]
    svg.head("STARTs/s over gRPC at c=16, each START opening one more sequence",
             f"2-vCPU VM, {dates_of(name)}; {name}. Last block / first block: {last / first:.2f}.")
    base = top + plot_h
    scale = lambda v: base - plot_h * v / hi  # noqa: E731
    for t in range(0, 12001, 2000):
        svg.line(left - 4, scale(t), left + len(rows) * (bar + gap), scale(t))
        svg.text(left - 8, scale(t) + 4, grouped(str(t)), anchor="end", size=11)
    x = left + gap / 2
    for n, v, shown in rows:
        svg.rect(x, scale(v), bar, base - scale(v), MESH)
        svg.text(x + bar / 2, scale(v) - 4, grouped(shown), anchor="middle", size=10)
        svg.text(x + bar / 2, base + 16, f"{n // 1000}k", anchor="middle", size=11)
        x += bar + gap
    svg.text(left + len(rows) * (bar + gap) / 2, base + 34, "sequences open", anchor="middle", size=11)
    return "open-sequences.svg", svg.render()


CHARTS = (chart_triton, chart_latency, chart_fair_shares, chart_sequences)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=BOOK,
                    help="where performance.md and performance/ go (default: docs/src)")
    args = ap.parse_args(argv)
    template = (BOOK / PAGE).read_text(encoding="utf-8")
    outputs = {PAGE: page(template), "performance/results.md": results_page()}
    for chart in CHARTS:
        name, svg = chart()
        outputs[f"performance/{name}"] = svg
    for rel, text in outputs.items():
        path = args.out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        print(f"plots: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
