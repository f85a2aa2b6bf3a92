// The mesh router's web console: polls the operator API (/mesh/v1/cluster, /mesh/v1/history) and
// draws the nodes, replicas, models, traffic charts and placement events. No library, no build step;
// every name from the cluster goes in as text, never as markup.
"use strict";

const POLL_MS = 1500;
const DOWN = new Set(["lost", "left", "silent"]);
const $ = (id) => document.getElementById(id);

// An uncaught error shows on the page, so a broken console says so instead of showing stale data.
function showError(text) {
  const box = $("errors");
  box.hidden = false;
  box.textContent = (box.textContent ? box.textContent + "\n" : "") + text;
}
window.addEventListener("error", (e) => showError(`script error: ${e.message}`));
window.addEventListener("unhandledrejection", (e) => showError(`script error: ${e.reason}`));

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const c of children) node.append(c instanceof Node ? c : String(c ?? ""));
  return node;
}

function fill(table, rows, columns, emptyText) {
  const body = $(table).tBodies[0];
  body.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { class: "empty", colSpan: columns }, emptyText))]));
}

function bytes(n) {
  if (!n) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(n < 10 && i ? 1 : 0)} ${units[i]}`;
}

function age(ms) {
  if (ms == null) return "-";
  if (ms < 1000) return `${ms} ms`;
  if (ms < 120000) return `${(ms / 1000).toFixed(1)} s`;
  return `${Math.round(ms / 60000)} min`;
}

function state(text, extra = "") {
  return el("span", { class: `state ${text} ${extra}` }, text);
}

// -- tables ----------------------------------------------------------------------------------------

function renderRouter(router, nodes) {
  const up = nodes.filter((n) => n.state === "up").length;
  const lead = router.lead ? `, ${router.lead.role}` : "";
  $("router").textContent =
    `router ${router.id} (${router.version}${lead}), up ${age(Math.round(router.uptime_s * 1000))}: ` +
    `${nodes.length} nodes, ${up} up`;
}

function replicasOf(node, placement) {
  const chips = [];
  const placed = new Set();
  for (const m of placement.models || []) {
    for (const r of m.replicas) {
      if (r.node !== node.name) continue;
      placed.add(m.name);
      const title = r.reason ? `${r.state}: ${r.reason}` : r.state;
      chips.push(el("span", { class: `replica ${r.state}`, title, "data-model": m.name, "data-state": r.state },
        `${m.name} · ${r.state}`));
    }
  }
  for (const served of node.models) {
    const name = served.split(":")[0];
    if (placed.has(name)) continue;
    chips.push(el("span", { class: "replica served", "data-model": name, "data-state": "served" }, served));
  }
  return chips.length ? chips : [el("span", { class: "empty" }, "none")];
}

function renderNodes(nodes, placement) {
  const rows = nodes.map((n) => {
    const down = DOWN.has(n.state);
    return el("tr", { class: down ? "down" : "", "data-node": n.name, "data-state": n.state },
      el("td", {}, n.name),
      el("td", {}, state(n.state), down ? " (down)" : ""),
      el("td", {}, n.address),
      el("td", {}, (n.devices || []).join(", ") || "-"),
      el("td", { class: "num" }, bytes(n.memory)),
      el("td", { class: "num" }, n.inflight),
      el("td", { class: "num" }, age(n.last_report_ms)),
      el("td", { class: "replicas" }, ...replicasOf(n, placement)));
  });
  fill("nodes", rows, 8, "no node has joined");
}

function renderModels(models, placement) {
  const placed = new Map((placement.models || []).map((m) => [m.name, m]));
  const errors = new Map((placement.errors || []).map((e) => [e.model, e.reason]));
  const rows = models.map((m) => {
    const p = placed.get(m.name);
    const reason = [m.reason, p && p.reason, errors.get(m.name)].filter(Boolean).join("; ");
    return el("tr", { "data-model": m.name },
      el("td", {}, m.version ? `${m.name}:${m.version}` : m.name),
      el("td", {}, state(m.state || "-")),
      el("td", { class: "num" }, p ? `${p.ready} / ${p.wanted}` : "-"),
      el("td", { class: "num" }, p ? `${p.min}–${p.max}` : "-"),
      el("td", {}, (m.nodes || []).join(", ") || "-"),
      el("td", {}, reason || "-"));
  });
  fill("models", rows, 6, "no model");
}

function renderEvents(events) {
  const rows = events.map((e) => el("tr", { "data-kind": e.kind },
    el("td", { class: "num" }, `${age(e.age_ms)} ago`),
    el("td", {}, state(e.kind)),
    el("td", {}, e.model || "-"),
    el("td", {}, e.node || "-"),
    el("td", {}, e.detail || "-")));
  fill("events", rows, 5, "no placement event yet");
}

// -- charts ----------------------------------------------------------------------------------------

const charts = new Map();

function chartCard(name) {
  let c = charts.get(name);
  if (c) return c;
  const rate = el("canvas", { "data-chart": "rate" });
  const latency = el("canvas", { "data-chart": "latency" });
  const now = el("span", { class: "now" });
  const card = el("div", { class: "chart", "data-model": name },
    el("h3", {}, name, now),
    el("div", { class: "legend" }, "requests/s", el("i", { class: "k-all" }), "all",
      el("i", { class: "k-failed" }), "failed"),
    rate,
    el("div", { class: "legend" }, "latency (ms)", el("i", { class: "k-p50" }), "p50",
      el("i", { class: "k-p99" }), "p99"),
    latency);
  c = { card, rate, latency, now };
  charts.set(name, c);
  return c;
}

function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  return [1, 2, 5, 10].map((m) => m * p).find((m) => m >= v);
}

// Lines of `series` ([{values, color}], null for no value) over the window, oldest at the left.
function draw(canvas, series, windowS) {
  const ratio = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  canvas.width = Math.round(w * ratio);
  canvas.height = Math.round(h * ratio);
  const g = canvas.getContext("2d");
  g.scale(ratio, ratio);
  const css = getComputedStyle(document.documentElement);
  const color = (c) => (c.startsWith("--") ? css.getPropertyValue(c).trim() : c);
  const pad = { l: 42, r: 6, t: 6, b: 16 };
  const all = series.flatMap((s) => s.values).filter((v) => v != null);
  const top = niceMax(Math.max(0, ...all));
  const x = (i, n) => pad.l + (n <= 1 ? 0 : (i / (n - 1)) * (w - pad.l - pad.r));
  const y = (v) => h - pad.b - (v / top) * (h - pad.t - pad.b);
  g.font = "11px system-ui, sans-serif";
  g.fillStyle = color("--muted");
  g.strokeStyle = color("--line");
  g.lineWidth = 1;
  for (const f of [0, 0.5, 1]) {
    const yy = Math.round(y(top * f)) + 0.5;
    g.beginPath(); g.moveTo(pad.l, yy); g.lineTo(w - pad.r, yy); g.stroke();
    g.textAlign = "right"; g.textBaseline = "middle";
    g.fillText(String(+(top * f).toPrecision(3)), pad.l - 4, yy);
  }
  g.textBaseline = "alphabetic";
  g.textAlign = "left"; g.fillText(`-${Math.round(windowS / 60)} min`, pad.l, h - 3);
  g.textAlign = "right"; g.fillText("now", w - pad.r, h - 3);
  g.lineWidth = 1.6;
  for (const s of series) {
    g.strokeStyle = color(s.color);
    g.beginPath();
    let pen = false;
    s.values.forEach((v, i) => {
      if (v == null) { pen = false; return; }
      const [px, py] = [x(i, s.values.length), y(v)];
      if (pen) g.lineTo(px, py); else g.moveTo(px, py);
      pen = true;
    });
    g.stroke();
  }
}

function last(values) {
  for (let i = values.length - 1; i >= 0; i--) if (values[i] != null) return values[i];
  return null;
}

function renderCharts(history) {
  const windowS = history.interval_s * history.samples;
  $("window").textContent = `(last ${Math.round(windowS / 60)} min, one point per ${history.interval_s} s)`;
  const box = $("charts");
  const names = new Set(history.models.map((m) => m.name));
  for (const [name, c] of charts) if (!names.has(name)) { c.card.remove(); charts.delete(name); }
  if (!history.models.length) {
    box.replaceChildren(el("p", { class: "empty" }, "no request has passed through this router in the window"));
    return;
  }
  box.querySelector("p.empty")?.remove();
  for (const m of history.models) {
    const c = chartCard(m.name);
    if (!c.card.isConnected) box.append(c.card);
    const rps = m.rps[m.rps.length - 1] || 0;
    const p99 = last(m.p99_ms);
    c.now.textContent = `${rps.toFixed(1)} req/s` + (p99 == null ? "" : `, p99 ${p99.toFixed(1)} ms`);
    draw(c.rate, [{ values: m.rps, color: "--fg" }, { values: m.failed_rps, color: "--bad" }], windowS);
    draw(c.latency, [{ values: m.p50_ms, color: "--p50" }, { values: m.p99_ms, color: "--p99" }], windowS);
  }
}

// -- polling ---------------------------------------------------------------------------------------

async function getJson(path) {
  const r = await fetch(path, { credentials: "same-origin", cache: "no-store" });
  if (!r.ok) {
    let why = r.statusText;
    try { why = (await r.json()).error || why; } catch (_) { /* not JSON */ }
    throw new Error(`${path}: ${r.status} ${why}`);
  }
  return r.json();
}

let lastOk = 0;

async function poll() {
  const status = $("status");
  try {
    const [cluster, history] = await Promise.all([getJson("/mesh/v1/cluster"), getJson("/mesh/v1/history")]);
    const placement = cluster.placement || {};
    renderRouter(cluster.router, cluster.nodes);
    renderNodes(cluster.nodes, placement);
    renderModels(cluster.models, placement);
    renderEvents(placement.events || []);
    renderCharts(history);
    lastOk = Date.now();
    status.className = "status";
    status.textContent = `updated ${new Date(lastOk).toLocaleTimeString()}`;
    document.body.dataset.updated = String(lastOk);
  } catch (e) {
    status.className = "status stale";
    status.textContent = `cannot read the router (${e.message})` +
      (lastOk ? `; showing what it said at ${new Date(lastOk).toLocaleTimeString()}` : "");
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

poll();
