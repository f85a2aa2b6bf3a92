//! `mesh-ops status`: fetch the router's cluster view (`GET /mesh/v1/cluster`) and render it as tables.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{bail, Context};
use serde::Deserialize;
use serde_json::Value;

use crate::http;
pub use crate::render::{age, pretty_json, seconds};
use crate::render::{lenient, lenient_list, sanitize, table, text, texts};

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

/// The cluster view URL for `router` (`http://HOST:PORT`; a bare `HOST:PORT` gets `http://`).
pub fn cluster_url(router: &str) -> String {
    format!("{}{CLUSTER_PATH}", crate::http::base(router))
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

#[cfg(test)]
#[path = "status_tests.rs"]
mod tests;
