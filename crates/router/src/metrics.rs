//! The router's Prometheus metrics: Triton's request metrics as clients see them through the router,
//! and the router's own `mesh_router_*` (nodes by state, requests per node, retries, failovers,
//! link round-trip time, each placed model's replicas); `history` keeps each model's recent traffic
//! for the console.
pub mod histogram;
pub mod history;

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use metrics::{counter, gauge};
use metrics_exporter_prometheus::PrometheusHandle;

use crate::place::{ModelView, ReplicaState};

/// Why an attempt is retried (`mesh::cluster::call::Failure::metric_reason`), the label values of
/// `mesh_router_retries_total{why}`.
const RETRY_REASONS: [&str; 4] = ["lost", "not_sent", "refused", "overloaded"];

/// Installs the global recorder and returns the handle that renders `/metrics`.
pub fn install() -> Result<PrometheusHandle, String> {
    let handle = mesh::telemetry::install(describe, None)?;
    register();
    Ok(handle)
}

/// The retry and failover counters exist from the start, at 0, as a node's failure counters do: a
/// rate over them is defined before the first retry, and an alert on their increase sees the first
/// one (Prometheus counts no increase into a series that did not exist yet).
fn register() {
    for why in RETRY_REASONS {
        counter!("mesh_router_retries_total", "why" => why).increment(0);
    }
    counter!("mesh_router_failovers_total").increment(0);
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
        "Replicas of each placed model, by state: min and max (its bounds), wanted (within them, after autoscaling) and ready"
    );
    g!(
        "mesh_router_rollout_share",
        "The candidate version's share of each rolled-out model's requests that name no version, in percent"
    );
    c!(
        "mesh_router_rollout_events_total",
        "Rollout commands and the guard's decisions, by model and event (start, pause, resume, promote, abort; advance, auto_promote, roll_back)"
    );
    c!(
        "mesh_router_rollout_shadows_total",
        "Shadow requests of rollouts, by model and outcome (matched, mismatched, failed, dropped)"
    );
    c!(
        "mesh_router_rollout_retries_total",
        "Requests the candidate version failed that were answered by the serving version instead"
    );
    c!(
        "mesh_router_placement_events_total",
        "Placement decisions and observations, by kind (place, ready, failed, evict, move, unload, lost, scale, drained, rollout)"
    );
}

/// One rollout event of `model` (an operator's command or the guard's decision).
pub fn rollout_event(model: &str, event: &'static str) {
    counter!("mesh_router_rollout_events_total", "model" => model.to_string(), "event" => event).increment(1);
}

/// The rollouts last published, so that a rollout dropped (its model unloaded) is set to zero.
static ROLLOUTS: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// The candidate's share of each rolled-out model's versionless requests now; 0 for a model whose
/// rollout is gone.
pub fn rollout_shares(shares: &[(String, u8)]) {
    let set = |model: &str, share: u8| {
        gauge!("mesh_router_rollout_share", "model" => model.to_string()).set(f64::from(share));
    };
    let gone = republish(&ROLLOUTS, shares.iter().map(|(m, _)| m.clone()).collect());
    for model in &gone {
        set(model, 0);
    }
    for (model, share) in shares {
        set(model, *share);
    }
}

/// Records `now` as the models `published` holds, answering those it held before and not now
/// (whose series are to be set to 0: the registry keeps a series once set).
fn republish(published: &Mutex<BTreeSet<String>>, now: BTreeSet<String>) -> Vec<String> {
    let mut published = published.lock().unwrap_or_else(|e| e.into_inner());
    let gone = published.difference(&now).cloned().collect();
    *published = now;
    gone
}

/// A shadow request of `model`'s rollout and how it ended.
pub fn rollout_shadow(model: &str, outcome: &'static str) {
    counter!("mesh_router_rollout_shadows_total", "model" => model.to_string(), "outcome" => outcome).increment(1);
}

/// A request of `model` the candidate failed, sent to the serving version.
pub fn rollout_retry(model: &str) {
    counter!("mesh_router_rollout_retries_total", "model" => model.to_string()).increment(1);
}

/// One placement event.
pub fn placement_event(kind: &str) {
    counter!("mesh_router_placement_events_total", "kind" => kind.to_string()).increment(1);
}

/// The models `replicas` last published, so that one no longer placed can be set to zero.
static PUBLISHED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// Each placed model's bounds, wanted and ready replicas. A model published before and absent now
/// (unloaded, or gone from the repository) gets 0 for all four: the registry keeps a series once set,
/// and a stale `ready` below a stale `min` would look like a model short of replicas forever.
pub fn replicas(models: &[ModelView]) {
    let set = |model: &str, state: &'static str, n: f64| {
        gauge!("mesh_router_model_replicas", "model" => model.to_string(), "state" => state).set(n);
    };
    for gone in republish(&PUBLISHED, models.iter().map(|m| m.name.clone()).collect()) {
        for state in ["min", "max", "wanted", "ready"] {
            set(&gone, state, 0.0);
        }
    }
    for m in models {
        let ready = m.replicas.iter().filter(|r| r.state == ReplicaState::Ready).count();
        set(&m.name, "min", f64::from(m.min));
        set(&m.name, "max", f64::from(m.max));
        set(&m.name, "wanted", f64::from(m.wanted));
        set(&m.name, "ready", ready as f64);
    }
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

#[cfg(test)]
mod tests {
    use metrics_exporter_prometheus::PrometheusBuilder;

    use super::*;
    use crate::place::ReplicaView;

    fn model(name: &str, min: u32, ready: usize) -> ModelView {
        let replica = |i: usize| ReplicaView {
            node: format!("n{i}"),
            state: if i < ready {
                ReplicaState::Ready
            } else {
                ReplicaState::Loading
            },
            reason: String::new(),
        };
        ModelView {
            name: name.into(),
            min,
            max: 4,
            wanted: min,
            replicas: (0..min as usize).map(replica).collect(),
            reason: String::new(),
        }
    }

    fn value(text: &str, model: &str, state: &str) -> Option<f64> {
        let prefix = format!("mesh_router_model_replicas{{model=\"{model}\",state=\"{state}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map(|v| v.parse().unwrap())
    }

    #[test]
    fn the_retry_and_failover_counters_exist_before_the_first_retry() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, register);
        let text = handle.render();
        for why in RETRY_REASONS {
            assert!(
                text.contains(&format!("mesh_router_retries_total{{why=\"{why}\"}} 0")),
                "{text}"
            );
        }
        assert!(text.contains("mesh_router_failovers_total 0"), "{text}");
    }

    #[test]
    fn each_model_shows_its_bounds_and_one_no_longer_placed_shows_zero_everywhere() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || replicas(&[model("a", 2, 1), model("b", 3, 3)]));
        let text = handle.render();
        assert_eq!(value(&text, "a", "min"), Some(2.0), "{text}");
        assert_eq!(value(&text, "a", "ready"), Some(1.0), "{text}");
        assert_eq!(value(&text, "a", "max"), Some(4.0), "{text}");
        assert_eq!(value(&text, "b", "wanted"), Some(3.0), "{text}");
        // `a` is unloaded: its series stay, at 0, so ready is no longer below min.
        metrics::with_local_recorder(&recorder, || replicas(&[model("b", 3, 2)]));
        let text = handle.render();
        for state in ["min", "max", "wanted", "ready"] {
            assert_eq!(value(&text, "a", state), Some(0.0), "{state}: {text}");
        }
        assert_eq!(value(&text, "b", "ready"), Some(2.0), "{text}");
    }
}
