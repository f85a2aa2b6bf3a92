//! The router's own HTTP API, beside KServe v2 on the same port: `GET /mesh/v1/cluster` is the
//! router's view of the cluster (what `mesh-ops status` shows).
use std::sync::Arc;
use std::time::Instant;

use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::dispatch::RouterDispatch;

/// The JSON of `GET /mesh/v1/cluster`: the router, its nodes, and the models they serve.
pub fn cluster_status(dispatch: &RouterDispatch) -> Value {
    let cluster = &dispatch.cluster;
    let nodes = cluster.membership().nodes(Instant::now());
    let nodes: Vec<Value> = nodes
        .iter()
        .map(|n| {
            let inflight = n.link.and_then(|l| cluster.link(l)).map_or(0, |l| l.inflight());
            json!({
                "name": n.name,
                "incarnation": format!("{:016x}", n.incarnation),
                "address": n.address,
                "state": n.state.as_str(),
                "models": n.models.iter().map(|m| format!("{}:{}", m.name, m.version)).collect::<Vec<_>>(),
                "models_ready": n.models.iter().filter(|m| m.ready).count(),
                "inflight": inflight,
                "last_report_ms": n.last_report_age.map(|d| d.as_millis() as u64),
                "devices": n.devices,
            })
        })
        .collect();
    let models: Vec<Value> = mesh::Dispatch::repository_index(dispatch)
        .into_iter()
        .map(|e| {
            json!({
                "name": e.name,
                "version": e.version,
                "state": e.state,
                "nodes": e.nodes,
                "reason": e.reason,
            })
        })
        .collect();
    json!({
        "router": {
            "id": cluster.id,
            "version": mesh::SERVER_VERSION,
            "uptime_s": cluster.started.elapsed().as_secs_f64(),
        },
        "nodes": nodes,
        "models": models,
    })
}

/// The routes of the router's own API.
pub fn routes(dispatch: Arc<RouterDispatch>) -> Router {
    Router::new().route(
        "/mesh/v1/cluster",
        get(move || {
            let d = dispatch.clone();
            async move { Json(cluster_status(&d)) }
        }),
    )
}
