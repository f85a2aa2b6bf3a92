//! Who decides placement when several routers serve one cluster: exactly one leader, elected
//! through etcd (`--etcd-endpoints`) with a lease, and a fencing token (the epoch) on every command
//! it sends. A single router needs none of this: it is always the leader, at epoch 0.
use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

pub mod etcd;
pub mod forward;
pub mod lease;

/// What the placement leader keeps in etcd so that the next one carries on: the operator's intent
/// (explicitly loaded models with their config overrides, replica bounds, drains, rollouts), never
/// where replicas are (nodes report that). Every field reads as empty when absent, so the intent an
/// older build stored still reads.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Desired {
    /// Explicit model control: the loaded models, each with its config override ("" for none).
    #[serde(default)]
    pub wanted: BTreeMap<String, String>,
    /// Replica bounds set through `mesh-ops scale`.
    #[serde(default)]
    pub bounds: BTreeMap<String, (u32, u32)>,
    /// Drained nodes and the incarnation drained.
    #[serde(default)]
    pub drains: BTreeMap<String, u64>,
    /// Each model's rollout (`mesh-ops rollout`): its spec and where it is; one this build cannot
    /// read is left out, not the rest of the intent.
    #[serde(default, deserialize_with = "crate::rollout::stored::lenient")]
    pub rollouts: BTreeMap<String, crate::rollout::Stored>,
}

/// This router's part in placement, as the PlacementActor reads it each tick.
#[derive(Debug, Clone, PartialEq)]
pub enum Role {
    /// No etcd: the only router, always deciding, at epoch 0.
    Single,
    /// Elected: decides placement with this fencing token; `state` is what the previous leader
    /// left in etcd when this one took over.
    Leader { epoch: u64, state: Arc<Desired> },
    /// Another router decides (`leader`, whose HTTP API is at `http`, HOST:PORT); `state` is the
    /// intent it last stored.
    Follower {
        leader: String,
        http: String,
        state: Arc<Desired>,
    },
    /// Not known (etcd unreachable, the lease lost): placement waits, routing goes on.
    Unknown { why: String },
}

impl Role {
    /// The epoch to stamp commands with, when this router may send placement commands.
    pub fn epoch(&self) -> Option<u64> {
        match self {
            Role::Single => Some(0),
            Role::Leader { epoch, .. } => Some(*epoch),
            _ => None,
        }
    }

    /// For status: "single", "leader", "follower" or "unknown".
    pub fn name(&self) -> &'static str {
        match self {
            Role::Single => "single",
            Role::Leader { .. } => "leader",
            Role::Follower { .. } => "follower",
            Role::Unknown { .. } => "unknown",
        }
    }
}

/// What the leader key holds: who leads, and where its HTTP API is (followers forward changes
/// there).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderInfo {
    pub name: String,
    #[serde(default)]
    pub http: String,
}

impl LeaderInfo {
    /// Reads a leader key's value (a bare name from another build reads as a name alone).
    pub fn parse(value: &[u8]) -> LeaderInfo {
        serde_json::from_slice(value).unwrap_or_else(|_| LeaderInfo {
            name: String::from_utf8_lossy(value).into_owned(),
            http: String::new(),
        })
    }
}

/// The shared handle: the current role, and the intent the leader wants stored.
pub struct Lead {
    role: watch::Receiver<Role>,
    /// A leader acts only until then (its lease's end minus a margin), checked at every read, so a
    /// router paused past its lease stops even before the election task runs again.
    until: watch::Receiver<Option<std::time::Instant>>,
    save: Option<watch::Sender<Option<(u64, Desired)>>>,
    /// Versions of the intent: the last one handed to `save`, the last one etcd confirmed.
    seq: std::sync::atomic::AtomicU64,
    stored: Option<watch::Receiver<u64>>,
    /// Asks the election to hand leadership back (revoke its lease) and answers when it did.
    resign: Option<tokio::sync::mpsc::Sender<tokio::sync::oneshot::Sender<()>>>,
    /// This router's name (`--router-name`), as errors show it.
    pub id: String,
}

impl Lead {
    /// A router without etcd.
    pub fn single(id: String) -> Arc<Lead> {
        let (_tx, role) = watch::channel(Role::Single);
        let (_tx, until) = watch::channel(None);
        Arc::new(Lead {
            role,
            until,
            save: None,
            seq: Default::default(),
            stored: None,
            resign: None,
            id,
        })
    }

    /// Whether placement is elected through etcd (false: the only router, always deciding).
    pub fn elected(&self) -> bool {
        self.save.is_some()
    }

    pub fn role(&self) -> Role {
        let role = self.role.borrow().clone();
        if let Role::Leader { .. } = role {
            if self.until.borrow().is_none_or(|u| std::time::Instant::now() >= u) {
                return Role::Unknown {
                    why: "its lease in etcd may have run out: etcd has not answered the renewal".into(),
                };
            }
        }
        role
    }

    /// On shutdown: gives the lease back, so another router leads at once instead of after the
    /// lease runs out (bounded wait; a router that cannot reach etcd just stops).
    pub async fn resign(&self) {
        let Some(tx) = &self.resign else { return };
        let (done, answered) = tokio::sync::oneshot::channel();
        if tx.send(done).await.is_ok() {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(2), answered).await;
        }
    }

    /// The leader stores the operator's intent in etcd (written only while it still holds the
    /// leader key; a deposed leader's write is refused by etcd).
    /// Answers the intent's version, to wait for with `stored`.
    pub fn save(&self, desired: &Desired) -> u64 {
        use std::sync::atomic::Ordering;
        let Some(tx) = &self.save else { return 0 };
        tx.send_if_modified(|d| {
            if d.as_ref().is_some_and(|(_, was)| was == desired) {
                return false;
            }
            *d = Some((self.seq.fetch_add(1, Ordering::AcqRel) + 1, desired.clone()));
            true
        });
        self.seq.load(Ordering::Acquire)
    }

    /// Waits until etcd holds the intent of version `seq` (at once without etcd), so an operator's
    /// change is answered only once the next leader would know it.
    pub async fn stored(&self, seq: u64) -> mesh::Result<()> {
        let Some(stored) = &self.stored else { return Ok(()) };
        let mut stored = stored.clone();
        let wait = std::time::Duration::from_secs(5);
        let confirmed = tokio::time::timeout(wait, stored.wait_for(|s| *s >= seq))
            .await
            .is_ok_and(|r| r.is_ok());
        if confirmed {
            return Ok(());
        }
        Err(mesh::Error::unavailable(format!(
            "the change was made, but etcd did not confirm storing it within {}s: a new placement \
             leader may not know it; check mesh-ops status and repeat it",
            wait.as_secs()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::{Guard, Phase, Spec, Stored};

    #[test]
    fn the_intent_an_older_build_stored_still_reads_and_rollouts_round_trip() {
        let old = r#"{"wanted": {"m": ""}, "bounds": {"m": [1, 3]}, "drains": {"n1": 7}}"#;
        let mut d: Desired = serde_json::from_str(old).expect("intent without rollouts");
        assert!(d.rollouts.is_empty());
        assert_eq!((d.bounds["m"], d.drains["n1"]), ((1, 3), 7));
        assert_eq!(serde_json::from_str::<Desired>("{}").unwrap(), Desired::default());

        let spec = Spec {
            model: "m".into(),
            serving: "1".into(),
            candidate: "2".into(),
            steps: vec![5, 50, 100],
            min_step_time: std::time::Duration::from_secs(30),
            min_step_requests: 10,
            guard: Guard::default(),
            shadow: 0,
        };
        d.rollouts
            .insert("m".into(), Stored::new(&spec, Phase::Paused { step: 1 }));
        let text = serde_json::to_string(&d).unwrap();
        assert!(text.contains(r#""phase":{"state":"paused","step":1}"#), "{text}");
        let back: Desired = serde_json::from_str(&text).unwrap();
        assert_eq!(back, d);
        assert_eq!(back.rollouts["m"].spec("m"), spec);

        // A rollout this build cannot carry on is left out; the rest of the intent stays.
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v["rollouts"]["x"] = serde_json::json!({"serving": "1", "phase": {"state": "exploded"}});
        v["rollouts"]["y"] = v["rollouts"]["m"].clone();
        v["rollouts"]["y"]["phase"]["step"] = serde_json::json!(9);
        v["rollouts"]["z"] = v["rollouts"]["m"].clone();
        v["rollouts"]["z"]["steps"] = serde_json::json!([50, 5, 100]);
        // Hostile intent is checked as a client's start is: versions, counts, the reason's size.
        let hostile = [
            ("serving", serde_json::json!("../x")),
            ("candidate", serde_json::json!("02")),
            ("candidate", serde_json::json!("1")),
            ("min_requests", serde_json::json!(0)),
            ("min_step_seconds", serde_json::json!(u64::MAX)),
            ("steps", serde_json::json!((1..=25).map(|i| i * 4).collect::<Vec<u8>>())),
            (
                "phase",
                serde_json::json!({"state": "rolled_back", "reason": "x".repeat(5000)}),
            ),
        ];
        for (i, (field, value)) in hostile.iter().enumerate() {
            let key = format!("h{i}");
            v["rollouts"][&key] = v["rollouts"]["m"].clone();
            v["rollouts"][&key][*field] = value.clone();
        }
        let read: Desired = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(read.rollouts.keys().collect::<Vec<_>>(), ["m"]);
        assert_eq!(read.bounds, d.bounds);
        // Rollouts that are not a map of models lose only themselves, not the intent.
        for odd in [serde_json::json!([]), serde_json::json!("x"), serde_json::json!(3)] {
            v["rollouts"] = odd;
            let read: Desired = serde_json::from_value(v.clone()).expect("the rest of the intent reads");
            assert!(read.rollouts.is_empty());
            assert_eq!(
                (read.bounds.clone(), read.wanted.clone()),
                (d.bounds.clone(), d.wanted.clone())
            );
        }
        // `null` reads as none.
        let none: Desired = serde_json::from_str(r#"{"rollouts": null}"#).unwrap();
        assert!(none.rollouts.is_empty());
    }
}
