"""The router's web console (GET /mesh/v1/console) in a real headless Chromium (Debian's `chromium`,
installed by `scripts/setup.sh --torch`), driven over the DevTools protocol (tests/cdp_util.py).

A router, whose operator API is restricted (`--http-restricted-api cluster:KEY=VALUE`), places
add_sub and mlp on two empty nodes while a client sends both a steady trickle of requests. The
browser sends the key with every request (Network.setExtraHTTPHeaders, as an operator's header
extension or proxy would). The page loads with no JavaScript error (no uncaught exception, no
console.error, no error in the browser's log: a failed or refused load counts), shows both nodes
with each model's replica ready on them, and a traffic chart per model; a node killed with SIGKILL
is then shown down. Without the key, the page, its script and its data are refused exactly as the
operator API refuses. Screenshots go to target/test-screenshots/console-*.png and are kept
(MESH_CONSOLE_TRAFFIC_S=75 lets the traffic run that much longer before the first one, for the
book's docs/src/cluster/console.png).

Skipped, with one reason, when `chromium` is not installed; a failure with MESH_REQUIRE_SERVER=1.
"""
import json
import os
import shutil
import threading
import time
import uuid

import numpy as np
import pytest
import tritonclient.http as httpclient

from cdp_util import Chromium
from cluster_util import add_sub_inputs, copy_models, wait_until
from conftest import LOG_DIR, REPO_ROOT
from gen_models import MLP_IN
from mesh_util import HOST, http_request

SCREENSHOTS = REPO_ROOT / "target" / "test-screenshots"
# Hang guards, never bounds on how fast anything is.
GUARD_S = 90.0
# How soon a killed node must show down on the page: generous (the link's idle timeout is 3 s).
DOWN_GUARD_S = 30.0
KEY = "mesh-admin-key"
DOWN_STATES = {"lost", "silent", "left"}


def chromium_bin() -> str:
    found = shutil.which("chromium")
    if not found:
        msg = ("Debian's chromium is not installed: scripts/setup.sh --torch installs it "
               "(apt-get install --no-install-recommends chromium)")
        if os.environ.get("MESH_REQUIRE_SERVER") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return found


class Trickle:
    """A steady few requests a second to each model through the router, until stopped; failures
    (a killed node's requests before the router fails them over) are counted, not raised."""

    def __init__(self, url: str):
        self.url, self.stop_flag, self.ok, self.failed = url, threading.Event(), 0, 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        client = httpclient.InferenceServerClient(self.url, network_timeout=30)
        rng = np.random.default_rng(0)
        i = 0
        while not self.stop_flag.is_set():
            a, b = add_sub_inputs(i)
            ins = [httpclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
            ins[0].set_data_from_numpy(a.reshape(1, 16))
            ins[1].set_data_from_numpy(b.reshape(1, 16))
            x = httpclient.InferInput("x", [1, MLP_IN], "FP32")
            x.set_data_from_numpy(rng.standard_normal((1, MLP_IN)).astype(np.float32))
            for model, inputs in (("add_sub", ins), ("mlp", [x])):
                try:
                    client.infer(model, inputs)
                    self.ok += 1
                except Exception:  # noqa: BLE001 - counted; the test reads the page, not these
                    self.failed += 1
            i += 1
            self.stop_flag.wait(0.1 + 0.05 * (i % 4))
        client.close()

    def start(self) -> "Trickle":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stop_flag.set()
        self.thread.join(timeout=60)


def nodes_on_page(page) -> list[dict]:
    return page.evaluate("""Array.from(document.querySelectorAll('#nodes tbody tr[data-node]')).map(r => ({
        name: r.dataset.node, state: r.dataset.state,
        replicas: Array.from(r.querySelectorAll('.replica')).map(s => [s.dataset.model, s.dataset.state])}))""")


def page_state(page) -> dict:
    return page.evaluate("""({
        errors: document.getElementById('errors').hidden ? '' : document.getElementById('errors').textContent,
        status: document.getElementById('status').textContent,
        stale: document.getElementById('status').classList.contains('stale'),
        charts: Array.from(document.querySelectorAll('#charts .chart')).map(c => c.dataset.model),
        events: document.querySelectorAll('#events tbody tr[data-kind]').length,
        models: Array.from(document.querySelectorAll('#models tbody tr[data-model]')).map(r => r.dataset.model)})""")


@pytest.mark.server
@pytest.mark.cluster
def test_the_console_shows_a_live_cluster_and_a_killed_node_down(cluster_factory, models_dir, tmp_path):
    browser_bin = chromium_bin()
    secret = uuid.uuid4().hex
    header = {KEY: secret}
    repo = copy_models(models_dir / "simple", tmp_path / "repo", ["add_sub", "mlp"])
    c = cluster_factory("cl-console")
    c.start_router([repo], ["--http-restricted-api", f"cluster:{KEY}={secret}"])
    port = c.router.http_port

    def view() -> dict:
        r = http_request(port, "GET", "/mesh/v1/cluster", headers=header)
        assert r.status == 200, (r.status, r.body)
        return r.json()

    def ready_on(model: str) -> set[str]:
        m = next((m for m in view()["placement"]["models"] if m["name"] == model), None)
        return {r["node"] for r in m["replicas"] if r["state"] == "ready"} if m else set()

    for name in ("node-a", "node-b"):
        c.start_node(name, [], ["--cluster-cache", str(tmp_path / f"{name}-cache")], wait_models=[], joined=False)
    for model in ("add_sub", "mlp"):  # the default minimum: 2 replicas, one on each node
        wait_until(lambda: ready_on(model) == {"node-a", "node-b"}, GUARD_S,
                   lambda: f"{model} ready on both nodes: {view()['placement']}")

    # Without the key, the console and its data are refused as the operator API is.
    refused = http_request(port, "GET", "/mesh/v1/cluster")
    assert refused.status == 403, refused.body
    for path in ("/mesh/v1/console", "/mesh/v1/console/console.js", "/mesh/v1/console/console.css",
                 "/mesh/v1/history"):
        r = http_request(port, "GET", path)
        assert (r.status, r.body) == (refused.status, refused.body), path
        assert http_request(port, "GET", path, headers={KEY: "wrong"}).status == 403, path
        ok = http_request(port, "GET", path, headers=header)
        assert ok.status == 200, (path, ok.status, ok.body[:300])
        if "/console" in path:
            assert "default-src 'none'" in ok.header("content-security-policy", ""), path
    page_html = http_request(port, "GET", "/mesh/v1/console", headers=header)
    assert page_html.header("content-type", "").startswith("text/html")

    trickle = Trickle(c.router.http_url).start()
    browser = Chromium(browser_bin, tmp_path / "chromium-profile", LOG_DIR / "cl-console-chromium.log")
    page = None
    try:
        page = browser.page()
        page.call("Network.setExtraHTTPHeaders", headers=header)
        page.call("Page.navigate", url=f"http://{HOST}:{port}/mesh/v1/console")

        def both_nodes_with_replicas():
            nodes = {n["name"]: n for n in nodes_on_page(page) or []}
            if set(nodes) != {"node-a", "node-b"} or any(n["state"] != "up" for n in nodes.values()):
                return None
            for n in nodes.values():
                if {("add_sub", "ready"), ("mlp", "ready")} - {tuple(r) for r in n["replicas"]}:
                    return None
            return nodes
        wait_until(both_nodes_with_replicas, GUARD_S, lambda: f"both nodes on the page: {nodes_on_page(page)}", 0.25)
        # A traffic chart per model, once an interval with requests has closed (5 s); two closed
        # intervals make a line.
        wait_until(lambda: set(page_state(page)["charts"]) >= {"add_sub", "mlp"}, GUARD_S,
                   lambda: f"a chart per model: {page_state(page)}", 0.25)
        def busy_intervals() -> dict:
            h = json.loads(http_request(port, "GET", "/mesh/v1/history", headers=header).body)
            return {m["name"]: sum(1 for v in m["rps"] if v > 0) for m in h["models"]}
        wait_until(lambda: min(busy_intervals().get(m, 0) for m in ("add_sub", "mlp")) >= 3, GUARD_S,
                   lambda: f"three intervals with requests: {busy_intervals()}", 0.5)
        # MESH_CONSOLE_TRAFFIC_S: longer charts first (for the docs' screenshot); 0 by default.
        page.pump(2.0 + float(os.environ.get("MESH_CONSOLE_TRAFFIC_S", "0")))
        state = page_state(page)
        assert not state["errors"] and not state["stale"], state
        assert set(state["models"]) >= {"add_sub", "mlp"}, state
        assert state["events"] > 0, f"the placements are recent events: {state}"
        assert not page.errors, f"JavaScript errors: {page.errors}"
        shot = page.screenshot(SCREENSHOTS / "console-cluster.png")
        print(f"screenshot: {shot}")

        c.nodes["node-b"].kill()  # SIGKILL to the node's process group
        killed_at = time.monotonic()
        down = wait_until(lambda: next((n for n in nodes_on_page(page) if n["name"] == "node-b"
                                        and n["state"] in DOWN_STATES), None),
                          DOWN_GUARD_S, lambda: f"node-b shown down: {nodes_on_page(page)}", 0.25)
        print(f"node-b shown {down['state']} {time.monotonic() - killed_at:.1f} s after SIGKILL")
        assert next(n for n in nodes_on_page(page) if n["name"] == "node-a")["state"] == "up"
        page.pump(1.0)
        shot = page.screenshot(SCREENSHOTS / "console-node-down.png")
        print(f"screenshot: {shot}")
        state = page_state(page)
        assert not state["errors"] and not state["stale"], state
        assert not page.errors, f"JavaScript errors: {page.errors}"

        # The check sees an error when there is one: an uncaught exception in the page is reported.
        page.evaluate("setTimeout(() => { throw new Error('console-test probe') }, 0); 1")
        page.pump(1.0)
        assert any("console-test probe" in e for e in page.errors), page.errors
    finally:
        trickle.stop()
        if page is not None:
            page.close()
        browser.stop()
