//! The router's own HTTP API, beside KServe v2 on the same port: `GET /mesh/v1/cluster` is the
//! router's view of the cluster (what `mesh-ops status` shows); `POST /mesh/v1/models/{m}/scale`
//! changes a model's replica bounds and `POST /mesh/v1/nodes/{n}/drain` empties a node; `rollout`
//! shows and changes a model's rollout (`/mesh/v1/models/{m}/rollout`); `console`
//! serves the web console (`GET /mesh/v1/console`) and its charts' data. The whole API is the
//! restricted-API group `cluster` (`--http-restricted-api cluster:KEY=VALUE`); without that rule its
//! changes are answered only to clients on the router's own host (loopback).
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Path, Query};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::dispatch::RouterDispatch;

mod console;
mod rollout;
use crate::place::ReplicaState;
use crate::shared::PlacementView;

/// The placement part of the status: models with their replicas, recent events, drains.
fn placement_status(view: &PlacementView, now: Instant) -> Value {
    let models: Vec<Value> = view
        .models
        .iter()
        .map(|m| {
            json!({
                "name": m.name,
                "min": m.min,
                "max": m.max,
                "wanted": m.wanted,
                "ready": m.replicas.iter().filter(|r| r.state == ReplicaState::Ready).count(),
                "replicas": m.replicas.iter().map(|r| json!({"node": r.node, "state": r.state.as_str(), "reason": r.reason})).collect::<Vec<_>>(),
                "reason": m.reason,
            })
        })
        .collect();
    let events: Vec<Value> = view
        .events
        .iter()
        .rev()
        .take(20)
        .map(|e| {
            json!({
                "age_ms": now.saturating_duration_since(e.at).as_millis() as u64,
                "kind": e.kind.as_str(),
                "model": e.model,
                "node": e.node,
                "detail": e.detail,
            })
        })
        .collect();
    json!({
        "models": models,
        "events": events,
        "errors": view.errors.iter().map(|(m, why)| json!({"model": m, "reason": why})).collect::<Vec<_>>(),
        "drains": view.drains.iter().map(|(n, done)| json!({"node": n, "drained": done})).collect::<Vec<_>>(),
        "rollouts": view.rollouts.iter().map(|(m, r)| r.status(m)).collect::<Vec<_>>(),
    })
}

/// The JSON of `GET /mesh/v1/cluster`: the router, its nodes, and the models they serve.
pub fn cluster_status(dispatch: &RouterDispatch) -> Value {
    let cluster = &dispatch.view;
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
                "memory": n.memory,
                "placed": n.models.iter().filter(|m| m.placed).map(|m| m.name.clone()).collect::<Vec<_>>(),
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
            "lead": lead_status(&dispatch.placement.lead.role()),
        },
        "nodes": nodes,
        "models": models,
        "placement": placement_status(&dispatch.placement.view(), Instant::now()),
    })
}

/// Whether this router decides placement: its role, the epoch it acts with, who leads.
fn lead_status(role: &crate::lead::Role) -> Value {
    use crate::lead::Role;
    match role {
        Role::Single => json!({ "role": "single", "epoch": 0 }),
        Role::Leader { epoch, .. } => json!({ "role": "leader", "epoch": epoch }),
        Role::Follower { leader, http, .. } => json!({ "role": "follower", "leader": leader, "leader_http": http }),
        Role::Unknown { why } => json!({ "role": "unknown", "why": why }),
    }
}

/// An error as the router's API answers it: the mesh error's HTTP status (409 for a conflict, such
/// as a second rollout of a model) and `{"error": ...}`.
fn error_response(e: mesh::Error) -> Response {
    let status = match e.code {
        mesh::error::Code::AlreadyExists => StatusCode::CONFLICT,
        _ => StatusCode::from_u16(e.http_status().as_u16()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
    };
    (status, Json(json!({ "error": e.message }))).into_response()
}

#[derive(Debug, Deserialize)]
struct ScaleBody {
    min: Option<u32>,
    max: Option<u32>,
}

#[derive(Debug, Deserialize)]
struct DrainQuery {
    timeout_s: Option<u64>,
}

async fn scale(dispatch: Arc<RouterDispatch>, model: String, body: ScaleBody) -> Response {
    if body.min.is_none() && body.max.is_none() {
        return error_response(mesh::Error::invalid("give 'min', 'max' or both"));
    }
    if body.max == Some(0) {
        return error_response(mesh::Error::invalid(format!(
            "'max' must be at least 1: to stop serving '{model}', unload it \
             (POST /v2/repository/models/{model}/unload, or mesh-ops unload)"
        )));
    }
    match dispatch.placement.scale(&model, body.min, body.max).await {
        Ok((min, max)) => Json(json!({ "model": model, "min": min, "max": max })).into_response(),
        Err(e) => error_response(e),
    }
}

async fn drain(dispatch: Arc<RouterDispatch>, node: String, wait: Duration) -> Response {
    match dispatch.placement.drain(&node, wait).await {
        Ok(()) => Json(json!({ "node": node, "drained": true })).into_response(),
        Err(e) => error_response(e),
    }
}

/// Without a `cluster` rule, a change (any method but GET) is answered only to a client on the
/// router's own host: reaching the HTTP port is not enough to move the cluster's models.
async fn local_changes_only(
    ConnectInfo(peer): ConnectInfo<std::net::SocketAddr>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let local = peer.ip().to_canonical().is_loopback();
    if request.method() != axum::http::Method::GET && !local {
        let message = "the operator API (/mesh/v1) answers changes only from the router's own host unless \
                       --http-restricted-api names the 'cluster' group (cluster:KEY=VALUE) and the request \
                       carries that header";
        return (StatusCode::FORBIDDEN, Json(json!({ "error": message }))).into_response();
    }
    next.run(request).await
}

/// The routes of the router's own API; `restricted`: `--http-restricted-api` names the `cluster`
/// group, whose header the HTTP frontend checks; otherwise changes are for local clients only.
pub fn routes(dispatch: Arc<RouterDispatch>, restricted: bool) -> Router {
    let api = api_routes(dispatch);
    if restricted {
        api
    } else {
        api.layer(axum::middleware::from_fn(local_changes_only))
    }
}

fn api_routes(dispatch: Arc<RouterDispatch>) -> Router {
    let (d1, d2, d3) = (dispatch.clone(), dispatch.clone(), dispatch.clone());
    console::routes(dispatch.clone())
        .merge(rollout::routes(dispatch))
        .route(
            "/mesh/v1/cluster",
            get(move || {
                let d = d1.clone();
                async move { Json(cluster_status(&d)) }
            }),
        )
        .route(
            "/mesh/v1/models/{model}/scale",
            post(move |Path(model): Path<String>, body: axum::body::Bytes| {
                let d = d2.clone();
                async move {
                    match serde_json::from_slice::<ScaleBody>(&body) {
                        Ok(body) => scale(d, model, body).await,
                        Err(e) => error_response(mesh::Error::invalid(format!(
                            "the body must be JSON such as {{\"min\": 1, \"max\": 3}}: {e}"
                        ))),
                    }
                }
            }),
        )
        .route(
            "/mesh/v1/nodes/{node}/drain",
            post(move |Path(node): Path<String>, Query(q): Query<DrainQuery>| {
                let d = d3.clone();
                let wait = Duration::from_secs(q.timeout_s.unwrap_or(120).clamp(1, 3600));
                async move { drain(d, node, wait).await }
            }),
        )
}
