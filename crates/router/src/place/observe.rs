//! What nodes and requests report to the placer: replica states, measured footprints, use (for LRU).
use std::time::Instant;

use super::{key, EventKind, Key, Model, Observed, Placer, Replica, State};

impl Placer {
    /// What a node reports about a model: call it for every change a node reports (and for its full list
    /// when it joins). `Absent` while a load is outstanding is taken as a report older than the load.
    pub fn observed(&mut self, node: &str, model: &str, seen: Observed, now: Instant) {
        let k = key(model, node);
        let Some(r) = self.replicas.get_mut(&k) else {
            self.observed_unknown(k, seen, now);
            return;
        };
        match (seen, &r.state) {
            (Observed::Ready, State::Loading { .. }) => {
                r.state = State::Ready { since: now };
                let from = r.move_from.take();
                self.event(now, EventKind::Ready, model, node, "");
                if let Some(from) = from {
                    let old = key(model, &from);
                    if self.replicas.get(&old).is_some_and(Replica::is_ready) {
                        self.unload(&old, &format!("moved to {node}"), EventKind::Unload, now);
                    }
                }
            }
            (Observed::Failed(why), State::Loading { .. } | State::Ready { .. }) => {
                self.replicas.remove(&k);
                self.fail(k, why, EventKind::Failed, now);
            }
            (Observed::Absent, State::Ready { .. }) => {
                // Unasked: the node dropped it (a crash, an operator). Not placed there again before retry_after.
                self.replicas.remove(&k);
                self.fail(k, "the node stopped serving it".into(), EventKind::Lost, now);
            }
            (Observed::Absent | Observed::Failed(_), State::Unloading { .. }) => {
                self.replicas.remove(&k);
            }
            // Ready again, Ready while unloading, or an Absent older than the load.
            _ => {}
        }
    }

    /// A replica a node reports as placed by a router that this placer never asked for (this router
    /// restarted, its state gone): taken as its own and Ready. Scale-down unloads it if it is one
    /// too many, and it is unloaded if its model is no longer wanted.
    pub fn adopt(&mut self, node: &str, model: &str, now: Instant) {
        let k = key(model, node);
        if self.replicas.contains_key(&k) {
            return;
        }
        self.foreign.remove(&k);
        self.asked.insert(k);
        self.observed(node, model, Observed::Ready, now);
    }

    fn observed_unknown(&mut self, k: Key, seen: Observed, now: Instant) {
        match seen {
            Observed::Absent => {
                self.foreign.remove(&k);
            }
            Observed::Ready if self.asked.contains(&k) && self.nodes.contains_key(&k.1) => {
                // A replica of ours the placer had forgotten (its node left and came back, or an unload was
                // given up on): take it back; scale-down unloads it if it is one too many.
                let wanted = self.models.get(&k.0).map(Model::footprint);
                let bytes = wanted.unwrap_or(0);
                let state = match wanted {
                    Some(_) => State::Ready { since: now },
                    None => State::Unloading {
                        sent: None,
                        why: "model removed".into(),
                    },
                };
                self.event(now, EventKind::Ready, &k.0, &k.1, "reported by the node again");
                let replica = Replica {
                    state,
                    bytes,
                    move_from: None,
                };
                self.replicas.insert(k, replica);
            }
            Observed::Ready | Observed::Failed(_) => {
                if !self.asked.contains(&k) {
                    self.foreign.insert(k);
                }
            }
        }
    }

    /// The footprint a node measured after loading the model.
    pub fn measured(&mut self, model: &str, bytes: u64) {
        if let Some(m) = self.models.get_mut(model) {
            m.measured = Some(bytes);
            for ((rm, _), r) in self.replicas.iter_mut() {
                if rm == model {
                    r.bytes = bytes;
                }
            }
        }
    }

    /// A request for the model was routed (for least-recently-used eviction).
    pub fn used(&mut self, model: &str, now: Instant) {
        if let Some(m) = self.models.get_mut(model) {
            m.last_used = Some(now);
        }
    }
}
