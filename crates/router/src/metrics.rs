//! The router's Prometheus metrics: Triton's request metrics as clients see them through the router,
//! and the router's own `mesh_router_*` (nodes by state, requests per node, retries, failovers,
//! link round-trip time).
use std::time::Duration;

use metrics::{counter, gauge};
use metrics_exporter_prometheus::PrometheusHandle;

/// Installs the global recorder and returns the handle that renders `/metrics`.
pub fn install() -> Result<PrometheusHandle, String> {
    mesh::telemetry::install(describe, None)
}

fn describe() {
    use metrics::describe_counter as c;
    use metrics::describe_gauge as g;
    g!(
        "mesh_router_nodes",
        "Nodes the router knows, by state (up, draining, silent, lost, left)"
    );
    c!(
        "mesh_router_requests_total",
        "Request attempts the router sent to each node"
    );
    c!(
        "mesh_router_retries_total",
        "Attempts that were retried on another node, by why"
    );
    c!(
        "mesh_router_failovers_total",
        "Requests that succeeded on another node after a node failed them at the transport level"
    );
    g!(
        "mesh_router_link_rtt_us",
        "QUIC round-trip time of each node link, in microseconds"
    );
    g!("mesh_router_inflight", "Requests of this router in flight on each node");
    c!(
        "mesh_link_shared_memory_bytes_total",
        "Tensor bytes that crossed the cluster link through shared memory, by direction"
    );
    g!(
        "mesh_router_model_replicas",
        "Replicas of each placed model: wanted (within its bounds, after autoscaling) and ready"
    );
    c!(
        "mesh_router_placement_events_total",
        "Placement decisions and observations, by kind (place, ready, failed, evict, move, unload, lost, scale, drained)"
    );
}

/// One placement event.
pub fn placement_event(kind: &str) {
    counter!("mesh_router_placement_events_total", "kind" => kind.to_string()).increment(1);
}

/// A placed model's wanted and ready replicas.
pub fn replicas(model: &str, wanted: u32, ready: usize) {
    gauge!("mesh_router_model_replicas", "model" => model.to_string(), "state" => "wanted").set(f64::from(wanted));
    gauge!("mesh_router_model_replicas", "model" => model.to_string(), "state" => "ready").set(ready as f64);
}

/// One finished client request.
pub fn request(model: &str, version: &str, rows: u64, took: Duration, failure: Option<&'static str>) {
    let labels = [("model", model.to_string()), ("version", version.to_string())];
    match failure {
        None => {
            counter!("nv_inference_request_success", &labels).increment(1);
            counter!("nv_inference_count", &labels).increment(rows);
        }
        Some(reason) => {
            let labels = [
                ("model", model.to_string()),
                ("reason", reason.to_string()),
                ("version", version.to_string()),
            ];
            counter!("nv_inference_request_failure", &labels).increment(1);
        }
    }
    counter!("nv_inference_request_duration_us", &labels).increment(took.as_micros() as u64);
}

/// One attempt sent to a node.
pub fn attempt(node: &str) {
    counter!("mesh_router_requests_total", "node" => node.to_string()).increment(1);
}

/// One attempt retried elsewhere; `why` is "lost", "not_sent", "refused" or "overloaded".
pub fn retry(why: &'static str) {
    counter!("mesh_router_retries_total", "why" => why).increment(1);
}

pub fn failover() {
    counter!("mesh_router_failovers_total").increment(1);
}

/// Nodes by state, and each live link's round-trip time and in-flight count.
pub fn cluster(states: &[(&'static str, usize)], links: &[(String, Duration, u32)]) {
    for (state, n) in states {
        gauge!("mesh_router_nodes", "state" => *state).set(*n as f64);
    }
    for (node, rtt, inflight) in links {
        gauge!("mesh_router_link_rtt_us", "node" => node.clone()).set(rtt.as_micros() as f64);
        gauge!("mesh_router_inflight", "node" => node.clone()).set(*inflight as f64);
    }
}
