//! `mesh-ops rollout MODEL start|pause|resume|promote|abort|status`: a model's rollout from its
//! serving version to a candidate, through the router's `/mesh/v1/models/{m}/rollout` (issue 59),
//! and the ROLLOUTS table of `mesh-ops status`.
use std::time::Duration;

use anyhow::bail;
use mesh::http::path_segment;
use serde_json::{json, Map, Value};

use crate::control::post;
use crate::http;
pub use crate::placement::{table_of, RolloutView};
use crate::render::pretty_json;

/// What `mesh-ops rollout MODEL start` sends: the flags given (the router fills in the others).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StartFlags {
    pub candidate: String,
    pub serving: Option<String>,
    pub steps: Option<Vec<u8>>,
    pub min_step_seconds: Option<u64>,
    pub min_step_requests: Option<u64>,
    pub min_requests: Option<u64>,
    pub max_error_rate_increase: Option<f64>,
    pub max_p99_ratio: Option<f64>,
    pub shadow: Option<u8>,
}

impl StartFlags {
    /// The request body of the start.
    pub fn body(&self) -> Value {
        let mut body = Map::new();
        body.insert("action".into(), json!("start"));
        body.insert("candidate".into(), json!(self.candidate));
        let optional = [
            ("serving", self.serving.as_ref().map(|s| json!(s))),
            ("steps", self.steps.as_ref().map(|s| json!(s))),
            ("min_step_seconds", self.min_step_seconds.map(|v| json!(v))),
            ("min_step_requests", self.min_step_requests.map(|v| json!(v))),
            ("min_requests", self.min_requests.map(|v| json!(v))),
            (
                "max_error_rate_increase",
                self.max_error_rate_increase.map(|v| json!(v)),
            ),
            ("max_p99_ratio", self.max_p99_ratio.map(|v| json!(v))),
            ("shadow", self.shadow.map(|v| json!(v))),
        ];
        for (key, value) in optional {
            if let Some(v) = value {
                body.insert(key.into(), v);
            }
        }
        Value::Object(body)
    }
}

fn url(router: &str, model: &str) -> String {
    format!("{}/mesh/v1/models/{}/rollout", http::base(router), path_segment(model))
}

/// The answer as a line, or as pretty JSON.
fn shown(answer: Value, json: bool) -> String {
    if json {
        return pretty_json(&answer.to_string());
    }
    let view: RolloutView = serde_json::from_value(answer).unwrap_or_default();
    view.line()
}

/// `mesh-ops rollout MODEL start|pause|resume|promote|abort`: sends the action, shows the rollout
/// as it is then.
pub fn act(router: &str, model: &str, body: &Value, json: bool, timeout: Duration) -> anyhow::Result<String> {
    Ok(shown(post(&url(router, model), body, timeout)?, json))
}

/// `mesh-ops rollout MODEL status`: the rollout as the router's intent holds it.
pub fn status(router: &str, model: &str, json: bool, timeout: Duration) -> anyhow::Result<String> {
    let url = url(router, model);
    let response = match http::get(&url, timeout) {
        Ok(r) => r,
        Err(http::Error::Connect(e)) => bail!("cannot reach the router at {url}: {e} (is mesh-router running there?)"),
        Err(e) => bail!("router at {url}: {e}"),
    };
    let value = crate::control::answer(&response)?;
    Ok(shown(value, json))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_sends_only_the_flags_given_and_rollouts_render() {
        let flags = StartFlags {
            candidate: "2".into(),
            steps: Some(vec![10, 100]),
            max_p99_ratio: Some(2.0),
            ..Default::default()
        };
        assert_eq!(
            flags.body(),
            json!({"action": "start", "candidate": "2", "steps": [10, 100], "max_p99_ratio": 2.0})
        );
        let view: RolloutView = serde_json::from_value(json!({
            "model": "m", "serving": "1", "candidate": "2", "state": "paused", "step": 1,
            "steps": [5, 25, 100], "share": 25, "reason": ""
        }))
        .unwrap();
        assert_eq!(
            view.line(),
            "model 'm': version 1 → 2, paused, step 2 of 3, 25% of requests that name no version to version 2"
        );
        let back: RolloutView = serde_json::from_value(json!({
            "model": "m", "serving": "1", "candidate": "2", "state": "rolled_back", "step": null,
            "steps": [5, 100], "share": 0, "reason": "version 2 failed 20.0% of 100 requests"
        }))
        .unwrap();
        assert!(
            back.line().ends_with(
                "rolled back, 0% of requests that name no version to version 2: version 2 failed 20.0% of 100 requests"
            ),
            "{}",
            back.line()
        );
        let t = table_of(&[view, back]);
        assert!(t.contains("m      1 → 2     paused       2 of 3  25%"), "{t}");
        assert!(t.contains("rolled_back  -       0%     version 2 failed"), "{t}");
        let junk: RolloutView = serde_json::from_value(json!({"model": 3, "share": "x", "steps": 7})).unwrap();
        assert_eq!((junk.share, junk.steps.len()), (0, 0));
        let shadowed: RolloutView = serde_json::from_value(json!({
            "model": "m", "serving": "1", "candidate": "2", "state": "running", "step": 0,
            "steps": [5, 100], "share": 5, "reason": "",
            "shadow_results": {"compared": 40, "mismatched": 3, "failed": 1, "dropped": 2,
                               "largest_abs_difference": {"Y": 0.5, "Z": "differs"}}
        }))
        .unwrap();
        assert!(
            shadowed.line().ends_with(
                "; shadows on this router: 40 compared, 3 mismatched, 1 failed, 2 dropped \
                 (largest difference: Y 0.5, Z differs)"
            ),
            "{}",
            shadowed.line()
        );
    }

    #[test]
    fn an_unreachable_router_is_named() {
        let e = status("http://127.0.0.1:1", "m", false, Duration::from_secs(2)).unwrap_err();
        assert!(
            e.to_string()
                .contains("cannot reach the router at http://127.0.0.1:1/mesh/v1/models/m/rollout"),
            "{e}"
        );
        let e = act(
            "http://127.0.0.1:1",
            "m",
            &json!({"action": "pause"}),
            false,
            Duration::from_secs(2),
        )
        .unwrap_err();
        assert!(e.to_string().contains("cannot reach the router"), "{e}");
    }
}
