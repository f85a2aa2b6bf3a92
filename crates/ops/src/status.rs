//! `mesh-ops status`: fetch the router's cluster view (`GET /mesh/v1/cluster`) and render it as tables.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{bail, Context};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::http;

/// Where the router serves its cluster view, under its HTTP address.
pub const CLUSTER_PATH: &str = "/mesh/v1/cluster";
/// The router asked when none is given.
pub const DEFAULT_ROUTER: &str = "http://localhost:8000";
/// A model list longer than this (joined) is shown as a count.
const MODELS_LIST_WIDTH: usize = 32;

/// The router's view of the cluster. Unknown fields are ignored; missing or null ones take their defaults.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct ClusterView {
    #[serde(deserialize_with = "lenient")]
    pub router: RouterInfo,
    #[serde(deserialize_with = "lenient_list")]
    pub nodes: Vec<NodeView>,
    #[serde(deserialize_with = "lenient_list")]
    pub models: Vec<ModelView>,
    #[serde(deserialize_with = "lenient")]
    pub placement: crate::placement::PlacementView,
}

/// The router itself.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct RouterInfo {
    #[serde(deserialize_with = "text")]
    pub version: String,
    #[serde(deserialize_with = "lenient")]
    pub uptime_s: Option<f64>,
    /// Its part in placement (several routers through etcd elect one leader).
    #[serde(deserialize_with = "lenient")]
    pub lead: LeadInfo,
}

/// `router.lead` of the cluster view.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct LeadInfo {
    #[serde(deserialize_with = "text")]
    pub role: String,
    #[serde(deserialize_with = "lenient")]
    pub epoch: Option<u64>,
    #[serde(deserialize_with = "text")]
    pub leader: String,
    #[serde(deserialize_with = "text")]
    pub why: String,
}

impl LeadInfo {
    /// ", placement leader (epoch 7)", ", follows router-b", ... ("" for a single router).
    fn describe(&self) -> String {
        match self.role.as_str() {
            "leader" => format!(", placement leader (epoch {})", self.epoch.unwrap_or(0)),
            "follower" => format!(", placement led by {}", sanitize(&self.leader)),
            "unknown" => format!(", no placement leader ({})", sanitize(&self.why)),
            _ => String::new(),
        }
    }
}

/// One node as the router sees it.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct NodeView {
    #[serde(deserialize_with = "text")]
    pub name: String,
    #[serde(deserialize_with = "text")]
    pub incarnation: String,
    #[serde(deserialize_with = "text")]
    pub address: String,
    /// up, draining, silent or lost.
    #[serde(deserialize_with = "text")]
    pub state: String,
    #[serde(deserialize_with = "texts")]
    pub models: Vec<String>,
    #[serde(deserialize_with = "lenient")]
    pub inflight: Option<u64>,
    #[serde(deserialize_with = "lenient")]
    pub last_report_ms: Option<f64>,
    #[serde(deserialize_with = "texts")]
    pub devices: Vec<String>,
}

/// One model version across the cluster.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct ModelView {
    #[serde(deserialize_with = "text")]
    pub name: String,
    #[serde(deserialize_with = "text")]
    pub version: String,
    #[serde(deserialize_with = "text")]
    pub state: String,
    #[serde(deserialize_with = "texts")]
    pub nodes: Vec<String>,
    #[serde(deserialize_with = "text")]
    pub reason: String,
}

/// A value of type `T`, or its default when null or of another type.
pub(crate) fn lenient<'de, D: Deserializer<'de>, T: Default + serde::de::DeserializeOwned>(
    d: D,
) -> Result<T, D::Error> {
    Ok(serde_json::from_value(Value::deserialize(d)?).unwrap_or_default())
}

/// The items of a list that read as `T` (objects); others are skipped. A non-list is empty.
pub(crate) fn lenient_list<'de, D: Deserializer<'de>, T: serde::de::DeserializeOwned>(
    d: D,
) -> Result<Vec<T>, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::Array(items) => items
            .into_iter()
            .filter_map(|item| serde_json::from_value(item).ok())
            .collect(),
        _ => Vec::new(),
    })
}

/// A string; a number or boolean is written out; anything else is empty.
pub(crate) fn text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(value_text(Value::deserialize(d)?))
}

/// A list of strings (see [`text`]); a non-list is empty.
pub(crate) fn texts<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::Array(items) => items.into_iter().map(value_text).collect(),
        _ => Vec::new(),
    })
}

fn value_text(value: Value) -> String {
    match value {
        Value::String(s) => s,
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        _ => String::new(),
    }
}

/// The cluster view URL for `router` (`http://HOST:PORT`; a bare `HOST:PORT` gets `http://`).
pub fn cluster_url(router: &str) -> String {
    format!("{}{CLUSTER_PATH}", crate::control::base(router))
}

/// GETs the cluster view from `router`; returns the URL asked and the JSON text. Errors name the URL.
pub fn fetch(router: &str, timeout: Duration) -> anyhow::Result<(String, String)> {
    let url = cluster_url(router);
    let response = match http::get(&url, timeout) {
        Ok(response) => response,
        Err(http::Error::Connect(e)) => bail!("cannot reach the router at {url}: {e} (is mesh-router running there?)"),
        Err(e) => bail!("router at {url}: {e}"),
    };
    let body = String::from_utf8_lossy(&response.body).into_owned();
    if response.status != 200 {
        let excerpt: String = body.trim().chars().take(300).collect();
        bail!(
            "router at {url} answered {} {}: {}",
            response.status,
            response.reason,
            sanitize(&excerpt)
        );
    }
    serde_json::from_str::<serde::de::IgnoredAny>(&body)
        .with_context(|| format!("router at {url} answered something that is not JSON"))?;
    Ok((url, body))
}

/// Parses the JSON text of a cluster view.
pub fn parse(url: &str, json: &str) -> anyhow::Result<ClusterView> {
    let value: Value = serde_json::from_str(json).with_context(|| format!("router at {url} answered bad JSON"))?;
    if !value.is_object() {
        bail!("router at {url} answered JSON that is not an object (a cluster view is {{\"router\", \"nodes\", \"models\"}})");
    }
    serde_json::from_value(value).with_context(|| format!("router at {url} answered an unreadable cluster view"))
}

/// `mesh-ops status`: the tables, or with `json` the JSON as received, pretty-printed.
pub fn run(router: &str, json: bool, timeout: Duration) -> anyhow::Result<String> {
    let (url, body) = fetch(router, timeout)?;
    if json {
        return Ok(pretty_json(&body));
    }
    Ok(render(&parse(&url, &body)?))
}

/// The cluster view as a summary line and two aligned tables, NODES and MODELS.
pub fn render(view: &ClusterView) -> String {
    let mut out = String::new();
    let up = view.nodes.iter().filter(|n| n.state == "up").count();
    let version = match view.router.version.as_str() {
        "" => "?".to_string(),
        v => sanitize(v),
    };
    let uptime = view
        .router
        .uptime_s
        .map(|s| format!(", up {}", seconds(s)))
        .unwrap_or_default();
    let lead = view.router.lead.describe();
    let _ = writeln!(
        out,
        "router {version}{uptime}{lead}: {} node{} ({up} up), {} model{}",
        view.nodes.len(),
        plural(view.nodes.len()),
        view.models.len(),
        plural(view.models.len())
    );
    out.push_str("\nNODES\n");
    let nodes = view.nodes.iter().map(|n| {
        vec![
            n.name.clone(),
            n.address.clone(),
            n.state.clone(),
            models_cell(&n.models),
            n.inflight.map(|i| i.to_string()).unwrap_or_else(|| "-".into()),
            n.last_report_ms.map(age).unwrap_or_else(|| "-".into()),
            n.devices.join(", "),
        ]
    });
    out.push_str(&table(
        &[
            "NAME",
            "ADDRESS",
            "STATE",
            "MODELS",
            "IN FLIGHT",
            "LAST REPORT",
            "DEVICES",
        ],
        nodes,
    ));
    out.push_str("\nMODELS\n");
    let models = view.models.iter().map(|m| {
        let nodes = match m.nodes.is_empty() {
            true => "-".to_string(),
            false => m.nodes.join(", "),
        };
        vec![
            m.name.clone(),
            m.version.clone(),
            m.state.clone(),
            nodes,
            m.reason.clone(),
        ]
    });
    out.push_str(&table(&["NAME", "VERSION", "STATE", "NODES", "REASON"], models));
    out.push_str(&crate::placement::render(&view.placement));
    out
}

fn plural(n: usize) -> &'static str {
    match n {
        1 => "",
        _ => "s",
    }
}

/// The models a node serves: the list when short, else a count.
fn models_cell(models: &[String]) -> String {
    let list = models.join(", ");
    match (models.len(), list.chars().count() <= MODELS_LIST_WIDTH) {
        (0, _) => "-".into(),
        (_, true) => list,
        (n, false) => format!("{n} models"),
    }
}

/// A report age: "120 ms", "3.2 s", "4m 05s".
pub fn age(ms: f64) -> String {
    match ms {
        ms if !ms.is_finite() || ms < 0.0 => "-".into(),
        ms if ms < 1000.0 => format!("{} ms", ms.round()),
        ms => seconds(ms / 1000.0),
    }
}

/// A duration in seconds: "3.2 s", "4m 05s", "2h 03m", "3d 04h".
pub fn seconds(s: f64) -> String {
    if !s.is_finite() || s < 0.0 {
        return "-".into();
    }
    if s < 60.0 {
        return format!("{s:.1} s");
    }
    let whole = s as u64;
    match whole {
        w if w < 3600 => format!("{}m {:02}s", w / 60, w % 60),
        w if w < 86_400 => format!("{}h {:02}m", w / 3600, w % 3600 / 60),
        w => format!("{}d {:02}h", w / 86_400, w % 86_400 / 3600),
    }
}

/// Rows under headers, columns padded to their widest cell; "(none)" for no rows.
pub(crate) fn table(headers: &[&str], rows: impl Iterator<Item = Vec<String>>) -> String {
    let rows: Vec<Vec<String>> = rows
        .map(|row| row.iter().map(|cell| empty_dash(sanitize(cell))).collect())
        .collect();
    if rows.is_empty() {
        return "  (none)\n".into();
    }
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header_row: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header_row).chain(&rows) {
        let mut line = String::new();
        for (i, (cell, width)) in row.iter().zip(&widths).enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            let _ = write!(line, "{cell:<width$}");
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn empty_dash(cell: String) -> String {
    match cell.is_empty() {
        true => "-".into(),
        false => cell,
    }
}

/// Text from the network made safe for a terminal: control characters become '?'.
pub(crate) fn sanitize(text: &str) -> String {
    text.chars().map(|c| if c.is_control() { '?' } else { c }).collect()
}

/// Re-indents valid JSON text with two spaces, keeping its keys in the order received and its numbers as
/// written (parsing into a map would sort the keys).
pub fn pretty_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len() * 2);
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    let mut chars = json.chars().peekable();
    let newline = |out: &mut String, depth: usize| {
        out.push('\n');
        out.extend(std::iter::repeat_n("  ", depth));
    };
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            '{' | '[' => {
                out.push(c);
                while chars.peek().is_some_and(|c| c.is_whitespace()) {
                    chars.next();
                }
                if let Some(&close @ ('}' | ']')) = chars.peek() {
                    out.push(close);
                    chars.next();
                } else {
                    depth += 1;
                    newline(&mut out, depth);
                }
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(c);
            }
            ',' => {
                out.push(c);
                newline(&mut out, depth);
            }
            ':' => out.push_str(": "),
            c if c.is_whitespace() => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
#[path = "status_tests.rs"]
mod tests;
