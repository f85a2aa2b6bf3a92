"""configs/prometheus/ and configs/grafana/ against the real thing: Debian's `prometheus` (installed by
`scripts/setup.sh --torch`) scrapes a live router and two nodes with the committed prometheus.yml
and rules.yml, changed only where a test must: the scrape and evaluation intervals shortened to 1 s,
the targets (targets/*.yml) filled in with this cluster's metrics ports, and the `for:` of the
alerts the test waits for (FIRING_ALERTS) shortened to FIRING_FOR.

`promtool check config` and `promtool check rules` pass on the committed files and on the test's copy.
Every dashboard query (its Grafana variables substituted with `.*` and with a real model and node,
`$__rate_interval` with 1m), every recording rule and every operand of every alert expression (the
expression less its threshold) returns series from the live cluster, and every metric a query names
is one Prometheus has scraped or recorded: a query naming a metric nobody exports fails. The GPU
panels' metrics are exported only by nodes with a GPU: without one, their names are checked against
the nodes' code instead. Then, with a node killed (SIGKILL) under a request the router fails over,
the node-down alerts (a failed scrape, and the router's own view) and the below-minimum alert fire.

Skipped, with one reason, when `prometheus` is not installed; a failure with MESH_REQUIRE_SERVER=1.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
import yaml
from tritonclient.utils import InferenceServerException

from cluster_util import GATED_SLEEP, add_sub_inputs, copy_models, wait_until
from conftest import LOG_DIR, REPO_ROOT
from mesh_util import HOST, free_ports

PROM_DIR = REPO_ROOT / "configs" / "prometheus"
DASHBOARD = REPO_ROOT / "configs" / "grafana" / "mesh-dashboard.json"
PY_MODELS = Path(__file__).parent / "python_models"
# The test's intervals, and the `for:` of the alerts it waits to see fire.
INTERVAL = "1s"
FIRING_FOR = "2s"
FIRING_ALERTS = ("MeshNodeDown", "MeshRouterSeesFewerNodes", "MeshModelBelowMinReplicas")
# Grafana's $__rate_interval, as the test substitutes it.
RATE_INTERVAL = "1m"
# Hang guards (never bounds on how fast anything is).
GUARD_S = 90.0
# The longest a gated request sleeps (a hang guard: the test opens its gate).
SLEEP_MS = 20_000
# Metrics only a node with a GPU exports.
GPU_ONLY = re.compile(r"^nv_(gpu|energy)_")


# --------------------------------------------------------------------------
# PromQL as the test reads it
# --------------------------------------------------------------------------

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
            "offset", "inf", "nan"}
STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
MODIFIERS = re.compile(r"^\s*(?:bool\s+)?(?:(?:on|ignoring)\s*\([^)]*\)\s*)?(?:(?:group_left|group_right)\s*"
                       r"(?:\([^)]*\))?\s*)?")
# Top-level comparison and set operators (=~ and !~ live inside braces, which are never top level).
OPERATOR = re.compile(r"==|!=|>=|<=|>|<|\b(?:and|or|unless)\b")
NUMBER = re.compile(r"^\s*[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[-+]?\d+)?\s*$", re.I)


def metric_names(query: str) -> set[str]:
    """The metric names a PromQL query selects (not its functions, keywords, labels or durations)."""
    q = STRINGS.sub('""', query)
    q = re.sub(r"\{[^}]*\}", " ", q)
    q = re.sub(r"\[[^\]]*\]", " ", q)
    q = LABEL_LISTS.sub(" ", q)
    names = set()
    for m in re.finditer(r"(?<![\w:.])([a-zA-Z_:][\w:]*)(\s*\()?", q):
        if not m.group(2) and m.group(1).lower() not in KEYWORDS:
            names.add(m.group(1))
    return names


def top_level(expr: str, pattern: re.Pattern, opens: str = "([{", closes: str = ")]}"):
    """The matches of `pattern` in `expr` outside its strings and outside the brackets `opens`."""
    depth, i, quote = 0, 0, None
    while i < len(expr):
        c = expr[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = None
        elif c in "\"'`":
            quote = c
        elif c in opens:
            depth += 1
        elif c in closes:
            depth -= 1
        elif depth == 0 and (m := pattern.match(expr, i)):
            yield m
            i = m.end()
            continue
        i += 1


def operands(expr: str) -> list[str]:
    """An expression less its thresholds: the operands of its top-level comparison and set operators
    that are not numbers (the whole expression when it has none)."""
    parts, start = [], 0
    for m in top_level(expr, OPERATOR):
        parts.append(expr[start:m.start()])
        start = m.end()
    parts.append(expr[start:])
    out = [MODIFIERS.sub("", p, count=1).strip() for p in parts]
    return [p for p in out if p and not NUMBER.match(p)]


COMPARISON = re.compile(r"==|!=|>=|<=|>|<")


def as_bool(expr: str) -> str:
    """The expression with each comparison outside label matchers made a `bool` one: it then keeps
    every series its joins match, whatever the values, so a join that matches nothing is seen."""
    out, start = [], 0
    for m in top_level(expr, COMPARISON, "{", "}"):
        out.append(expr[start:m.end()])
        start = m.end()
        if not re.match(r"\s*bool\b", expr[start:]):
            out.append(" bool")
    out.append(expr[start:])
    return "".join(out)


def test_as_bool_keeps_label_matchers():
    assert as_bool('a{x!="y"} < on(c) b') == 'a{x!="y"} < bool on(c) b'
    assert as_bool("(a == 0) and on(m) (b > bool 0)") == "(a == bool 0) and on(m) (b > bool 0)"


def grafana(query: str, model: str, node: str) -> str:
    """A dashboard query as Grafana sends it: its variables substituted."""
    return (query.replace("$__rate_interval", RATE_INTERVAL).replace("${model}", model).replace("$model", model)
            .replace("${node}", node).replace("$node", node))


def dashboard_queries(dash: dict) -> list[tuple[str, str]]:
    """(panel title, expr) of every panel's targets, rows' nested panels included."""
    found = []

    def walk(panels):
        for p in panels:
            walk(p.get("panels", []))
            for t in p.get("targets", []):
                found.append((p["title"], t["expr"]))
    walk(dash["panels"])
    return found


def variable_queries(dash: dict) -> list[tuple[str, str, str]]:
    """(variable, metric selector, label) of every `label_values(SELECTOR, LABEL)` variable."""
    out = []
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", v["query"]["query"].strip())
            assert m, f"variable {v['name']}: not label_values(SELECTOR, LABEL): {v['query']}"
            out.append((v["name"], m.group(1), m.group(2)))
    return out


def exported_in_code(name: str) -> bool:
    """Whether the mesh's code exports a metric of this name (for metrics only a GPU node has)."""
    return any(f'"{name}"' in p.read_text() for p in (REPO_ROOT / "crates").rglob("*.rs"))


# --------------------------------------------------------------------------
# The live Prometheus
# --------------------------------------------------------------------------

class Prometheus:
    """A prometheus process on a free port, with its own storage, over the HTTP API."""

    def __init__(self, binary: str, config: Path, storage: Path, log: Path):
        self.port = free_ports(1)[0]
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [binary, f"--config.file={config}", f"--storage.tsdb.path={storage}",
                 f"--web.listen-address={HOST}:{self.port}"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        wait_until(self.ready, GUARD_S, lambda: f"prometheus to be ready: {self.log_tail()}", 0.2)

    def log_tail(self, n=30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            pytest.fail(f"prometheus exited: {self.log_tail()}")
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.port}/-/ready", timeout=5) as r:
                return r.status == 200
        except (urllib.error.URLError, ConnectionError):
            return False

    def api(self, path: str, **params):
        url = f"http://{HOST}:{self.port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:
            body = json.load(e)
        assert body["status"] == "success", f"{path} {params}: {body}"
        return body["data"]

    def query(self, q: str) -> list[dict]:
        return self.api("query", query=q)["result"]

    def names(self) -> set[str]:
        return set(self.api("label/__name__/values"))

    def firing(self) -> list[dict]:
        return [a for a in self.api("alerts")["alerts"] if a["state"] == "firing"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def check_series(prom: Prometheus, query: str, known: set[str], allow_absent=frozenset()) -> list[dict]:
    """The series `query` returns; fails when it names a metric Prometheus has never scraped nor
    recorded, or returns none. Metrics in `allow_absent` need only exist in the mesh's code."""
    names = metric_names(query)
    assert names, f"no metric named in {query!r}"
    absent = names - known
    unknown = {n for n in absent if n not in allow_absent or not exported_in_code(n)}
    assert not unknown, f"{query!r} names metrics nobody exports: {sorted(unknown)}"
    if absent:
        return []
    result = prom.query(query)
    assert result, f"{query!r} returns no series"
    return result


# --------------------------------------------------------------------------
# The committed configuration, and the test's copy of it
# --------------------------------------------------------------------------

def prometheus_bins() -> tuple[str, str]:
    prom, tool = shutil.which("prometheus"), shutil.which("promtool")
    if not (prom and tool):
        msg = ("Debian's prometheus (with promtool) is not installed: scripts/setup.sh --torch installs it "
               "(apt-get install --no-install-recommends prometheus)")
        if os.environ.get("MESH_REQUIRE_SERVER") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return prom, tool


def promtool(tool: str, *args) -> None:
    res = subprocess.run([tool, *args], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, f"promtool {' '.join(args)}:\n{res.stdout}\n{res.stderr}"


def config_copy(out: Path, routers: list[str], nodes: dict[str, str]) -> Path:
    """The committed configuration in `out`, with only the intervals, targets and FIRING_ALERTS' `for:`
    changed; returns its prometheus.yml."""
    config = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    config["global"]["scrape_interval"] = config["global"]["evaluation_interval"] = INTERVAL
    rules = yaml.safe_load((PROM_DIR / "rules.yml").read_text())
    shortened = set()
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") in FIRING_ALERTS:
                rule["for"] = FIRING_FOR
                shortened.add(rule["alert"])
    assert shortened == set(FIRING_ALERTS), shortened
    (out / "targets").mkdir(parents=True)
    (out / "targets" / "routers.yml").write_text(yaml.safe_dump([{"targets": routers}]))
    (out / "targets" / "nodes.yml").write_text(
        yaml.safe_dump([{"targets": [addr], "labels": {"node": name}} for name, addr in nodes.items()]))
    (out / "rules.yml").write_text(yaml.safe_dump(rules, sort_keys=False))
    (out / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    return out / "prometheus.yml"


def committed_rules() -> list[dict]:
    return [r for g in yaml.safe_load((PROM_DIR / "rules.yml").read_text())["groups"] for r in g["rules"]]


# --------------------------------------------------------------------------
# Offline: the files, and the test's reading of PromQL
# --------------------------------------------------------------------------

@pytest.mark.offline
def test_promtool_checks_the_committed_config_and_rules():
    _, tool = prometheus_bins()
    promtool(tool, "check", "config", str(PROM_DIR / "prometheus.yml"))
    promtool(tool, "check", "rules", str(PROM_DIR / "rules.yml"))


@pytest.mark.offline
def test_every_alert_has_a_duration_or_is_a_notice_a_severity_and_annotations():
    alerts = [r for r in committed_rules() if "alert" in r]
    assert {"MeshNodeDown", "MeshRouterSeesFewerNodes", "MeshModelBelowMinReplicas", "MeshModelQueueTimeHigh",
            "MeshModelErrorRateHigh", "MeshRouterErrorRateHigh", "MeshRouterRetriesHigh",
            "MeshRouterFailovers"} <= {a["alert"] for a in alerts}
    for a in alerts:
        assert a["labels"]["severity"] in ("critical", "warning", "info"), a
        assert "for" in a or a["labels"]["severity"] == "info", f"{a['alert']} has no for:"
        assert a["annotations"]["summary"] and a["annotations"]["description"], a
        assert operands(a["expr"]), a


@pytest.mark.offline
def test_the_dashboard_has_its_rows_and_variables_and_one_data_source():
    dash = json.loads(DASHBOARD.read_text())
    rows = [p["title"] for p in dash["panels"] if p["type"] == "row"]
    assert rows == ["Cluster", "Model: $model", "Node: $node"], rows
    assert [v["name"] for v in dash["templating"]["list"]] == ["datasource", "model", "node"]
    for p in dash["panels"]:
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
            assert p["targets"], p["title"]
    assert len(dashboard_queries(dash)) >= 25


@pytest.mark.offline
def test_the_promql_reading_finds_names_and_drops_thresholds():
    q = ('sum by (cluster, model) (rate(nv_inference_request_failure{job="mesh-router", reason=~"a|b"}[5m]))'
         ' / max(mesh_router_nodes offset 5m) > 0.05')
    assert metric_names(q) == {"nv_inference_request_failure", "mesh_router_nodes"}
    assert metric_names("model:nv_inference_queue_duration_us:mean5m > 1e5") == \
        {"model:nv_inference_queue_duration_us:mean5m"}
    assert operands("up{job=\"mesh-node\"} == 0") == ['up{job="mesh-node"}']
    assert operands("a < on (cluster) group_left () count by (cluster) (up{x=\"<\"})") == \
        ["a", 'count by (cluster) (up{x="<"})']
    assert operands("max(a) == 0 and on (model) max(b) > 0") == ["max(a)", "max(b)"]
    assert operands("sum(rate(x[5m]))") == ["sum(rate(x[5m]))"]
    assert grafana('rate(a{model=~"$model", node=~"${node}"}[$__rate_interval])', ".*", "n1") == \
        'rate(a{model=~".*", node=~"n1"}[1m])'


# --------------------------------------------------------------------------
# Live: a router, two nodes and prometheus
# --------------------------------------------------------------------------

def placed(c) -> dict:
    return {m["name"]: m for m in c.view()["placement"]["models"]}


def ready_on(c, model) -> set[str]:
    m = placed(c).get(model)
    return {r["node"] for r in m["replicas"] if r["state"] == "ready"} if m else set()


def infer(url: str, model: str, inputs: list, **kw):
    c = httpclient.InferenceServerClient(url, network_timeout=120)
    try:
        return c.infer(model, inputs, **kw)
    finally:
        c.close()


def add_sub(i: int, shape=(1, 16)) -> list:
    a, b = add_sub_inputs(i)
    ins = [httpclient.InferInput(n, list(shape), "FP32") for n in ("INPUT0", "INPUT1")]
    ins[0].set_data_from_numpy(a.reshape(-1)[: int(np.prod(shape))].reshape(shape))
    ins[1].set_data_from_numpy(b.reshape(-1)[: int(np.prod(shape))].reshape(shape))
    return ins


@pytest.fixture(scope="module")
def live(module_cluster_factory, models_dir, tmp_path_factory):
    """A router placing add_sub and a gated sleep on two empty nodes, scraped by prometheus with the
    test's copy of the committed configuration; node `killed` was killed (SIGKILL) while it ran a
    request the router then failed over to node `alive`."""
    prom_bin, tool = prometheus_bins()
    tmp = tmp_path_factory.mktemp("prometheus")
    repo = copy_models(models_dir / "simple", tmp / "repo", ["add_sub"])
    copy_models(PY_MODELS, repo, ["sleep_py"])
    (repo / "sleep_py" / "1" / "model.py").write_text(GATED_SLEEP)
    c = module_cluster_factory("cl-prometheus")
    c.start_router([repo])
    for name in ("p1", "p2"):
        cache = tmp / f"{name}-cache"
        c.start_node(name, [], ["--cluster-cache", str(cache), "--metrics-config", "summary_latencies=true",
                                "--backend-config", f"python,interpreter={sys.executable}"],
                     wait_models=[], joined=False)
    for model in ("add_sub", "sleep_py"):  # the default minimum: 2 replicas
        wait_until(lambda: len(ready_on(c, model)) == 2, GUARD_S, lambda: f"2 replicas of {model}: {placed(c)}")

    config = config_copy(tmp / "config", [f"{HOST}:{c.router.metrics_port}"],
                         {n: f"{HOST}:{node.metrics_port}" for n, node in c.nodes.items()})
    promtool(tool, "check", "config", str(config))
    promtool(tool, "check", "rules", str(config.parent / "rules.yml"))
    prom = Prometheus(prom_bin, config, tmp / "data", LOG_DIR / "cl-prometheus-prometheus.log")
    try:
        wait_until(lambda: len(prom.query("up == 1")) == 3, GUARD_S, lambda: f"3 targets up: {prom.query('up')}")
        # Successes, and a failure (a shape add_sub refuses), through the router.
        for i in range(10):
            infer(c.router.http_url, "add_sub", add_sub(i))
        with pytest.raises(InferenceServerException):
            infer(c.router.http_url, "add_sub", add_sub(0, (1, 8)))
        # A request running on one node; that node is killed, and the router runs it on the other.
        gate = tmp / "gate"
        x = httpclient.InferInput("X", [1], "FP32")
        x.set_data_from_numpy(np.array([7.0], np.float32))
        ms = httpclient.InferInput("MS", [1], "INT32")
        ms.set_data_from_numpy(np.array([SLEEP_MS], np.int32))
        client = httpclient.InferenceServerClient(c.router.http_url, network_timeout=120, concurrency=2)
        pending = client.async_infer("sleep_py", [x, ms], parameters={"gate": str(gate)})

        def runner():
            busy = [n["name"] for n in c.view()["nodes"] if n["inflight"] > 0 and n["state"].lower() == "up"]
            return busy[0] if len(busy) == 1 else None
        killed = wait_until(runner, GUARD_S, "the node running the gated request", 0.02)
        c.nodes[killed].kill()  # SIGKILL to the node's process group (its Python stubs with it)
        gate.touch()
        assert pending.get_result().as_numpy("Y").tolist() == [7.0]
        client.close()
        alive = next(n for n in c.nodes if n != killed)
        # Prometheus has scraped the failover and the dead node, and evaluated the rules since.
        wait_until(lambda: prom.query("mesh_router_failovers_total > 0") and prom.query("up == 0")
                   and prom.query("model:nv_inference_request_failure:router_ratio5m"), GUARD_S,
                   "prometheus to see the failover and the dead node", 0.2)
        yield {"prom": prom, "cluster": c, "killed": killed, "alive": alive}
    finally:
        prom.stop()


@pytest.mark.server
@pytest.mark.cluster
def test_every_dashboard_query_returns_series_from_the_live_cluster(live):
    prom = live["prom"]
    known = prom.names()
    dash = json.loads(DASHBOARD.read_text())
    for name, selector, label in variable_queries(dash):
        series = check_series(prom, selector, known)
        assert any(label in s["metric"] for s in series), f"variable {name}: no series of {selector} has {label}"
    gpu = any(GPU_ONLY.match(n) for n in known)
    for model, node in ((".*", ".*"), ("add_sub", live["alive"])):
        for title, expr in dashboard_queries(dash):
            q = grafana(expr, model, node)
            try:
                check_series(prom, q, known, allow_absent=frozenset() if gpu else
                             {n for n in metric_names(q) if GPU_ONLY.match(n)})
            except AssertionError as e:
                raise AssertionError(f"panel {title!r} (model={model}, node={node}): {e}") from None


@pytest.mark.server
@pytest.mark.cluster
def test_every_rule_expression_returns_series_from_the_live_cluster(live):
    prom = live["prom"]
    known = prom.names()
    for rule in committed_rules():
        if "record" in rule:
            check_series(prom, rule["expr"], known)
            assert rule["record"] in known, f"{rule['record']} was never recorded"
        else:
            # Each operand less its threshold, then the whole with its comparisons made `bool`
            # (its joins must match series too).
            for query in [*operands(rule["expr"]), as_bool(rule["expr"])]:
                try:
                    check_series(prom, query, known)
                except AssertionError as e:
                    raise AssertionError(f"alert {rule['alert']}: {e}") from None


@pytest.mark.server
@pytest.mark.cluster
def test_a_query_naming_a_metric_nobody_exports_fails_the_check(live):
    prom = live["prom"]
    known = prom.names()
    with pytest.raises(AssertionError, match="nobody exports"):
        check_series(prom, 'sum(rate(mesh_router_made_up_total{job="mesh-router"}[1m]))', known)
    with pytest.raises(AssertionError, match="nobody exports"):
        check_series(prom, "nv_gpu_made_up_bytes", known, allow_absent=frozenset({"nv_gpu_made_up_bytes"}))
    with pytest.raises(AssertionError, match="returns no series"):
        check_series(prom, 'up{job="no-such-job"}', known)


@pytest.mark.server
@pytest.mark.cluster
def test_the_node_down_alerts_fire_when_a_node_is_killed(live):
    prom, killed = live["prom"], live["killed"]

    def fired():
        alerts = prom.firing()
        names = {a["labels"]["alertname"] for a in alerts}
        return alerts if set(FIRING_ALERTS) <= names else None
    alerts = wait_until(fired, GUARD_S, lambda: f"{FIRING_ALERTS} to fire: {prom.firing()}", 0.5)
    down = [a for a in alerts if a["labels"]["alertname"] == "MeshNodeDown"]
    assert [a["labels"]["node"] for a in down] == [killed], down
    assert down[0]["labels"]["severity"] == "critical"
    assert killed in down[0]["annotations"]["summary"], down[0]
    seen = [a for a in alerts if a["labels"]["alertname"] == "MeshRouterSeesFewerNodes"]
    assert [float(a["value"]) for a in seen] == [1.0], seen  # one node up of the two
    short = {a["labels"]["model"] for a in alerts if a["labels"]["alertname"] == "MeshModelBelowMinReplicas"}
    assert short == {"add_sub", "sleep_py"}, alerts
