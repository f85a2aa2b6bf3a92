"""The book (docs/) cannot rot: its flag references list every flag each binary accepts and only
flags they accept, its metrics reference lists every metric a node and a router export and only
metrics that exist, and the link check finds a broken link, an anchor that is not there and a link
out of the book."""
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import REPO_ROOT
from mesh_util import http_request

BOOK = REPO_ROOT / "docs" / "src"
REFERENCE = BOOK / "reference"
# Placeholders the prose uses for "any flag".
NOT_FLAGS = {"--flag"}


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen_reference = load("gen_reference")
check_links = load("check_links")


def accepted(binary: Path, command=()) -> set:
    """Every long flag `binary command...` accepts, its subcommands' included."""
    text = gen_reference.help_text(binary, list(command))
    flags = {f for f, _, _ in gen_reference.flags_of(text)}
    for sub in gen_reference.subcommands(text):
        flags |= accepted(binary, [*command, sub])
    return flags


def named(page: Path) -> set:
    """The flags a reference page lists: those in the first column of its tables (its prose and
    the flags' help may name other binaries' flags)."""
    firsts = re.findall(r"^\| ([^|]*)\|", page.read_text(), re.M)
    return set(re.findall(r"--[a-z][a-z0-9-]*[a-z0-9]", " ".join(firsts))) - NOT_FLAGS


@pytest.mark.parametrize("binary, page", [("mesh-node", "node-flags.md"), ("mesh-router", "router-flags.md"),
                                          ("mesh-ops", "ops.md")])
def test_each_binarys_reference_lists_exactly_the_flags_it_accepts(cluster_bins, binary, page):
    path = cluster_bins[{"mesh-node": "node", "mesh-router": "router", "mesh-ops": "ops"}[binary]]
    flags = accepted(path) - {"--help", "--version"}
    listed = named(REFERENCE / page)
    assert not flags - listed, f"{binary} accepts flags {page} does not list (run scripts/gen_reference.py)"
    assert not listed - flags, f"{page} names flags {binary} does not accept"
    # The generated table is the binary's own help, as it is now.
    text = (REFERENCE / page).read_text()
    assert gen_reference.MARKER in text
    assert text.split(gen_reference.MARKER)[1] == gen_reference.generated(path).split(gen_reference.MARKER)[1], \
        f"{page} is older than {binary}'s --help: run scripts/gen_reference.py"


def metric_names(port: int) -> set:
    text = http_request(port, "GET", "/metrics").body.decode()
    return set(re.findall(r"^# TYPE ((?:nv|mesh)_\w+) ", text, re.M))


def listed_metrics() -> set:
    return set(re.findall(r"`((?:nv|mesh)_[a-z_]+)`", (REFERENCE / "metrics.md").read_text()))


def test_the_metrics_reference_lists_every_metric_a_node_and_a_router_export(cluster_factory, models_dir, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(models_dir / "simple" / "add_sub", repo / "add_sub")
    cfg = repo / "add_sub" / "config.pbtxt"
    cfg.write_text(cfg.read_text() + "\nresponse_cache { enable: true }\n")
    c = cluster_factory()
    c.start_router([], [])
    node = c.start_node("n1", [repo], ["--cache-config", "local,size=1048576",
                                       "--metrics-config", "summary_latencies=true"])
    for url in (node.http_url, c.router.http_url):
        client = httpclient.InferenceServerClient(url)
        ins = [httpclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
        for i in ins:
            i.set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
        for _ in range(2):  # a miss, then a hit of the cache
            client.infer("add_sub", ins)
        client.close()
    exported = metric_names(node.metrics_port) | metric_names(c.router.metrics_port)
    assert {"nv_inference_count", "nv_cache_num_hits", "mesh_router_requests_total"} <= exported, exported
    listed = listed_metrics()
    assert not exported - listed, "docs/src/reference/metrics.md misses exported metrics"
    # Every metric listed exists in the code (some export only on a GPU, or in a cluster's events).
    code = "\n".join(p.read_text() for p in (REPO_ROOT / "crates").rglob("*.rs"))
    missing = {m for m in listed if f'"{m}"' not in code and m not in exported}
    assert not missing, f"metrics.md lists metrics the code has not: {missing}"


def test_the_link_check_finds_broken_links(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    book = root / "docs" / "src"
    book.mkdir(parents=True)
    (root / "README.md").write_text("[book](docs/src/a.md#the-start) [gone](nowhere.md) [out](../x.md)\n")
    (book / "SUMMARY.md").write_text("# Summary\n\n- [A](a.md)\n")
    (book / "a.md").write_text("# The start\n\n[b](b.md) [self](#no-such-heading) `[code](missing.md)`\n"
                               "[up](../../README.md) [code in a heading](#step-two-of-it)\n\n## Step `two` of it\n")
    (book / "b.md").write_text("# B\n")
    monkeypatch.setattr(check_links, "ROOT", root)
    monkeypatch.setattr(check_links, "BOOK", book)
    problems = []
    check_links.check_file(root / "README.md", root, problems)
    for page in sorted(book.glob("*.md")):
        check_links.check_file(page, book, problems)
    check_links.check_summary(problems)
    assert problems == [
        "README.md: 'nowhere.md': no such file",
        "README.md: '../x.md' points outside the repository",
        "docs/src/a.md: '#no-such-heading': docs/src/a.md has no heading '#no-such-heading'",
        "docs/src/a.md: '../../README.md' points outside docs/src",
        "docs/src/b.md: a chapter SUMMARY.md does not list",
    ]


def test_an_anchor_into_a_page_that_includes_a_file_is_one_of_that_files_headings(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    book = root / "docs" / "src"
    book.mkdir(parents=True)
    (root / "record.md").write_text("# Record\n\n## Round two\n")
    (book / "SUMMARY.md").write_text("# Summary\n\n- [A](a.md)\n- [R](r.md)\n")
    (book / "r.md").write_text("{{#include ../../record.md}}\n")
    (book / "a.md").write_text("# A\n\n[two](r.md#round-two) [three](r.md#round-three)\n")
    monkeypatch.setattr(check_links, "ROOT", root)
    monkeypatch.setattr(check_links, "BOOK", book)
    problems = []
    check_links.check_file(book / "a.md", book, problems)
    assert problems == ["docs/src/a.md: 'r.md#round-three': docs/src/r.md has no heading '#round-three'"]


def test_the_repositorys_own_links_all_lead_somewhere():
    res = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "check_links.py")], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_docs_point_nowhere_outside_the_repository():
    """What a user of the repository reads names nothing they do not have (the team's own notes and
    tools live beside the repository, not in it)."""
    pages = [REPO_ROOT / "README.md", REPO_ROOT / "benches" / "README.md", *sorted(BOOK.rglob("*.md"))]
    outside = [f"{p.relative_to(REPO_ROOT)}:{n}" for p in pages
               for n, line in enumerate(p.read_text().splitlines(), 1) if "../shared" in line]
    assert not outside, outside


def test_the_readme_is_short_and_starts_with_the_two_commands():
    readme = (REPO_ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150, "the README is a short page; the book holds the rest"
    sections = re.findall(r"^## (.*)$", readme, re.M)
    assert sections[0] == "Two commands for a fresh machine", sections
    first = re.search(r"```sh\n(.*?)```", readme, re.S).group(1).splitlines()
    assert [line.split()[0] for line in first] == ["./scripts/serve-example.sh", "./scripts/test-all.sh"]
