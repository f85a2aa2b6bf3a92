//! What the placer shows: each model's replicas and reason for status and the repository index, and recent events.
use std::collections::BTreeSet;

use super::{key, ModelView, PlaceEvent, Placer, ReplicaState, ReplicaView, State};

impl Placer {
    /// Every wanted model (and every removed one still unloading), for status and the repository index.
    pub fn view(&self) -> Vec<ModelView> {
        let mut names: BTreeSet<&str> = self.models.keys().map(String::as_str).collect();
        names.extend(self.replicas.keys().map(|(m, _)| m.as_str()));
        names
            .into_iter()
            .map(|name| {
                let mut replicas: Vec<ReplicaView> = self
                    .replicas
                    .iter()
                    .filter(|((m, _), _)| m == name)
                    .map(|((_, node), r)| {
                        let (state, reason) = match &r.state {
                            State::Loading { .. } => (
                                ReplicaState::Loading,
                                r.move_from.as_ref().map(|f| format!("replaces the copy on {f}")),
                            ),
                            State::Ready { .. } => (ReplicaState::Ready, None),
                            State::Unloading { why, .. } => (ReplicaState::Unloading, Some(why.clone())),
                        };
                        ReplicaView {
                            node: node.clone(),
                            state,
                            reason: reason.unwrap_or_default(),
                        }
                    })
                    .collect();
                for ((m, node), f) in &self.failures {
                    if m == name && !self.replicas.contains_key(&key(m, node)) {
                        replicas.push(ReplicaView {
                            node: node.clone(),
                            state: ReplicaState::Failed,
                            reason: f.reason.clone(),
                        });
                    }
                }
                replicas.sort_by(|a, b| a.node.cmp(&b.node));
                match self.models.get(name) {
                    Some(m) => {
                        let (min, max) = self.bounds_of(m);
                        ModelView {
                            name: name.into(),
                            min,
                            max,
                            wanted: self.wanted_of(m),
                            replicas,
                            reason: m.reason.clone(),
                        }
                    }
                    None => ModelView {
                        name: name.into(),
                        min: 0,
                        max: 0,
                        wanted: 0,
                        replicas,
                        reason: "removed from the repository; unloading".into(),
                    },
                }
            })
            .collect()
    }

    /// Recent events, oldest first.
    pub fn events(&self) -> Vec<PlaceEvent> {
        self.events.iter().cloned().collect()
    }
}

/// "1 replica", "2 replicas".
pub(super) fn count(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// Bytes as status output writes them (decimal units: "500 MB", "1.5 GB").
pub(super) fn bytes(n: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (1_000_000_000_000, "TB"),
        (1_000_000_000, "GB"),
        (1_000_000, "MB"),
        (1_000, "kB"),
    ];
    for (size, unit) in UNITS {
        if n >= size {
            let v = n as f64 / size as f64;
            return if v.fract() == 0.0 || v >= 100.0 {
                format!("{v:.0} {unit}")
            } else {
                format!("{v:.1} {unit}")
            };
        }
    }
    format!("{n} B")
}
