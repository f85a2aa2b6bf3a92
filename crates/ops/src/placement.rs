//! The placement part of the router's cluster view (replicas wanted and ready per model, recent
//! placement and scaling events, drains, rollouts) and its tables in `mesh-ops status` and
//! `mesh-ops models`.
use serde::Deserialize;

use crate::render::{age, lenient, lenient_list, sanitize, table, text};

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct PlacementView {
    #[serde(deserialize_with = "lenient_list")]
    pub models: Vec<PlacedModel>,
    #[serde(deserialize_with = "lenient_list")]
    pub events: Vec<Event>,
    #[serde(deserialize_with = "lenient_list")]
    pub errors: Vec<RepoError>,
    #[serde(deserialize_with = "lenient_list")]
    pub drains: Vec<Drain>,
    #[serde(deserialize_with = "lenient_list")]
    pub rollouts: Vec<RolloutView>,
}

/// A model of the cluster repository and its replicas.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct PlacedModel {
    #[serde(deserialize_with = "text")]
    pub name: String,
    #[serde(deserialize_with = "lenient")]
    pub min: u64,
    #[serde(deserialize_with = "lenient")]
    pub max: u64,
    #[serde(deserialize_with = "lenient")]
    pub wanted: u64,
    #[serde(deserialize_with = "lenient")]
    pub ready: u64,
    #[serde(deserialize_with = "lenient_list")]
    pub replicas: Vec<Replica>,
    #[serde(deserialize_with = "text")]
    pub reason: String,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Replica {
    #[serde(deserialize_with = "text")]
    pub node: String,
    #[serde(deserialize_with = "text")]
    pub state: String,
    #[serde(deserialize_with = "text")]
    pub reason: String,
}

/// A placement or scaling decision, newest first.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Event {
    #[serde(deserialize_with = "lenient")]
    pub age_ms: Option<f64>,
    #[serde(deserialize_with = "text")]
    pub kind: String,
    #[serde(deserialize_with = "text")]
    pub model: String,
    #[serde(deserialize_with = "text")]
    pub node: String,
    #[serde(deserialize_with = "text")]
    pub detail: String,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct RepoError {
    #[serde(deserialize_with = "text")]
    pub model: String,
    #[serde(deserialize_with = "text")]
    pub reason: String,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Drain {
    #[serde(deserialize_with = "text")]
    pub node: String,
    #[serde(deserialize_with = "lenient")]
    pub drained: bool,
}

/// A rollout as the router shows it. Unknown fields are ignored; missing or junk ones read as defaults.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct RolloutView {
    #[serde(deserialize_with = "text")]
    pub model: String,
    #[serde(deserialize_with = "text")]
    pub serving: String,
    #[serde(deserialize_with = "text")]
    pub candidate: String,
    /// running, paused, promoted, rolled_back or aborted.
    #[serde(deserialize_with = "text")]
    pub state: String,
    #[serde(deserialize_with = "lenient")]
    pub step: Option<u64>,
    #[serde(deserialize_with = "lenient_list")]
    pub steps: Vec<u64>,
    #[serde(deserialize_with = "lenient")]
    pub share: u64,
    #[serde(deserialize_with = "text")]
    pub reason: String,
    /// The router's own shadow results, when it shadowed requests.
    pub shadow_results: Option<serde_json::Value>,
}

impl RolloutView {
    /// "step 2 of 4" while it runs or is paused, "-" once it is over.
    fn step_cell(&self) -> String {
        match self.step {
            Some(s) => format!("{} of {}", s + 1, self.steps.len()),
            None => "-".into(),
        }
    }

    /// One line: "model 'm': version 1 → 2, running, step 2 of 4, 25% of unversioned requests to version 2".
    pub fn line(&self) -> String {
        let mut out = format!(
            "model '{}': version {} → {}, {}",
            sanitize(&self.model),
            sanitize(&self.serving),
            sanitize(&self.candidate),
            sanitize(&self.state).replace('_', " ")
        );
        if self.step.is_some() {
            out.push_str(&format!(", step {}", self.step_cell()));
        }
        out.push_str(&format!(
            ", {}% of requests that name no version to version {}",
            self.share,
            sanitize(&self.candidate)
        ));
        if !self.reason.is_empty() {
            out.push_str(&format!(": {}", sanitize(&self.reason)));
        }
        if let Some(s) = &self.shadow_results {
            let n = |k: &str| s.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
            out.push_str(&format!(
                "; shadows on this router: {} compared, {} mismatched, {} failed, {} dropped",
                n("compared"),
                n("mismatched"),
                n("failed"),
                n("dropped")
            ));
            if let Some(largest) = s.get("largest_abs_difference").and_then(serde_json::Value::as_object) {
                let each: Vec<String> = largest
                    .iter()
                    .take(8)
                    .map(|(k, v)| {
                        let v = v.as_str().map_or_else(|| v.to_string(), str::to_string);
                        format!("{} {}", sanitize(k), sanitize(&v))
                    })
                    .collect();
                if !each.is_empty() {
                    out.push_str(&format!(" (largest difference: {})", each.join(", ")));
                }
            }
        }
        out
    }
}

/// The ROLLOUTS table of `mesh-ops status`.
pub fn table_of(rollouts: &[RolloutView]) -> String {
    let rows = rollouts.iter().map(|r| {
        vec![
            r.model.clone(),
            format!("{} → {}", r.serving, r.candidate),
            r.state.clone(),
            r.step_cell(),
            format!("{}%", r.share),
            r.reason.clone(),
        ]
    });
    table(&["MODEL", "VERSIONS", "STATE", "STEP", "SHARE", "REASON"], rows)
}

/// "node-a (ready), node-b (loading)".
fn replicas_cell(replicas: &[Replica]) -> String {
    let cells: Vec<String> = replicas
        .iter()
        .map(|r| match r.state.as_str() {
            "ready" => r.node.clone(),
            state => format!("{} ({state})", r.node),
        })
        .collect();
    cells.join(", ")
}

/// The PLACEMENT table (one row per model of the cluster repository).
pub fn models_table(view: &PlacementView) -> String {
    let mut rows: Vec<Vec<String>> = view
        .models
        .iter()
        .map(|m| {
            vec![
                m.name.clone(),
                format!("{}/{}", m.ready, m.wanted),
                format!("{}-{}", m.min, m.max),
                replicas_cell(&m.replicas),
                m.reason.clone(),
            ]
        })
        .collect();
    rows.extend(view.errors.iter().map(|e| {
        vec![
            e.model.clone(),
            "0/0".into(),
            "-".into(),
            String::new(),
            e.reason.clone(),
        ]
    }));
    table(
        &["MODEL", "READY/WANTED", "MIN-MAX", "NODES", "REASON"],
        rows.into_iter(),
    )
}

/// The placement sections of `mesh-ops status`; empty when the router places nothing.
pub fn render(view: &PlacementView) -> String {
    if view.models.is_empty()
        && view.errors.is_empty()
        && view.events.is_empty()
        && view.drains.is_empty()
        && view.rollouts.is_empty()
    {
        return String::new();
    }
    let mut out = String::from("\nPLACEMENT\n");
    out.push_str(&models_table(view));
    if !view.drains.is_empty() {
        out.push_str("\nDRAINS\n");
        let rows = view.drains.iter().map(|d| {
            let state = if d.drained {
                "drained: may stop"
            } else {
                "moving models off"
            };
            vec![d.node.clone(), state.to_string()]
        });
        out.push_str(&table(&["NODE", "STATE"], rows));
    }
    if !view.rollouts.is_empty() {
        out.push_str("\nROLLOUTS\n");
        out.push_str(&table_of(&view.rollouts));
    }
    if !view.events.is_empty() {
        out.push_str("\nRECENT EVENTS\n");
        let rows = view.events.iter().take(10).map(|e| {
            vec![
                e.age_ms.map(|ms| format!("{} ago", age(ms))).unwrap_or_default(),
                e.kind.clone(),
                e.model.clone(),
                e.node.clone(),
                e.detail.clone(),
            ]
        });
        out.push_str(&table(&["WHEN", "EVENT", "MODEL", "NODE", "DETAIL"], rows));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_replicas_events_and_drains_and_nothing_without_placement() {
        assert_eq!(render(&PlacementView::default()), "");
        let view: PlacementView = serde_json::from_value(serde_json::json!({
            "models": [{"name": "simple", "min": 2, "max": 4, "wanted": 3, "ready": 2,
                        "replicas": [{"node": "a", "state": "ready"}, {"node": "b", "state": "ready"},
                                     {"node": "c", "state": "loading"}],
                        "reason": ""}],
            "events": [{"age_ms": 1500, "kind": "scale", "model": "simple", "node": "", "detail": "2 → 3"}],
            "errors": [{"model": "broken", "reason": "mesh.max_replicas must be at least 1"}],
            "drains": [{"node": "a", "drained": false}],
            "rollouts": [{"model": "simple", "serving": "1", "candidate": "2", "state": "rolled_back",
                          "step": null, "steps": [5, 100], "share": 0, "reason": "too slow"}],
        }))
        .unwrap();
        let text = render(&view);
        assert!(
            text.contains("simple  2/3           2-4      a, b, c (loading)"),
            "{text}"
        );
        assert!(text.contains("broken"), "{text}");
        assert!(text.contains("1.5 s ago  scale"), "{text}");
        assert!(text.contains("a     moving models off"), "{text}");
        assert!(
            text.contains("ROLLOUTS\nMODEL   VERSIONS  STATE        STEP  SHARE  REASON\n"),
            "{text}"
        );
        assert!(
            text.contains("simple  1 → 2     rolled_back  -     0%     too slow"),
            "{text}"
        );
    }

    #[test]
    fn junk_fields_read_as_defaults() {
        let view: PlacementView =
            serde_json::from_value(serde_json::json!({"models": [{"name": 3, "ready": "x"}], "events": 7})).unwrap();
        assert_eq!(view.models.len(), 1);
        assert_eq!(view.models[0].ready, 0);
        assert!(view.events.is_empty());
    }
}
