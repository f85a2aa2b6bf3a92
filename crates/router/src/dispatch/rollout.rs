//! A model's rollout as its requests pass the router: a request that names no version gets the
//! version of its side of the split ([`split::choose`]: its sequence's pin, its client key, or a
//! draw), its answer is tallied for the leader's guard, and one the candidate failed goes again to
//! the serving version where the written rule ([`split::retry_on_serving`]) says that is safe. A
//! request that names a version gets it, as in Triton, and never comes here.
use std::sync::Arc;
use std::time::Instant;

use mesh::sync::Locked;
use mesh::{Error, InferRequest, Param, Params};

use super::RouterDispatch;
use crate::metrics;
use crate::rollout::split::{self, Key};
use crate::rollout::Arm;
use crate::route::Attempts;
use crate::shared::Placement;

/// The request parameters that carry a client's key (the second is what Triton's
/// `--http-header-forward-pattern mesh-rollout-key` makes of an HTTP header of that name).
pub const KEY_PARAMETERS: [&str; 2] = ["rollout_key", "mesh-rollout-key"];

/// The longest client key taken whole (a longer one is cut: only its first bytes choose the side).
const MAX_KEY_BYTES: usize = 256;

/// Which side of a rollout a request went to. Dropped before its answer was tallied (its client
/// went away), it tallies the time so far as a latency sample, so a candidate that hangs shows.
pub(super) struct Side {
    pub arm: Arm,
    pub serving: String,
    pub candidate: String,
    /// The rollout runs (its answers are tallied for the guard).
    pub open: bool,
    /// Percent of the serving version's requests also sent to the candidate as shadows.
    pub shadow: u8,
    /// When the rollout started (names it among the model's rollouts).
    pub started: u64,
    /// The request set its own deadline (its `timeout` parameter).
    client_deadline: bool,
    /// A draw chose the side (not the client's key or sequence).
    drawn: bool,
    /// When the request went to its side's version (for the tallied latency).
    since: Instant,
    /// Where its answer is tallied, until it is.
    untallied: Option<(Arc<Placement>, String)>,
}

impl Side {
    fn version(&self, arm: Arm) -> &str {
        match arm {
            Arm::Serving => &self.serving,
            Arm::Candidate => &self.candidate,
        }
    }

    /// Tallies an answer (`Some(ok)`) of its version at `now`, or none (`None`); either way its
    /// answer is settled.
    fn settle(&mut self, ok: Option<bool>, now: Instant) {
        if let (Some((placement, model)), Some(ok)) = (self.untallied.take(), ok) {
            let rollout = (self.serving.as_str(), self.candidate.as_str(), self.started);
            placement.tally(&model, rollout, self.arm, ok, now - self.since);
        }
    }
}

impl Drop for Side {
    fn drop(&mut self) {
        self.settle(Some(true), Instant::now());
    }
}

/// A client's key, when the request carries one.
fn client_key(params: &Params) -> Option<String> {
    let (_, value) = params.iter().find(|(k, _)| KEY_PARAMETERS.contains(&k.as_str()))?;
    let key = match value {
        Param::String(s) if !s.is_empty() => s.clone(),
        Param::Int(i) => i.to_string(),
        Param::Uint(u) => u.to_string(),
        _ => return None,
    };
    let mut end = key.len().min(MAX_KEY_BYTES);
    while !key.is_char_boundary(end) {
        end -= 1;
    }
    Some(key[..end].to_string())
}

impl RouterDispatch {
    /// The side of a request that names no version of a model with a rollout (running, or over
    /// and still holding its outcome), its version set to that side's; None for any other request.
    pub(super) fn split(&self, request: &mut InferRequest) -> Option<Side> {
        if !request.model_version.is_empty() {
            return None;
        }
        let view = self.placement.view();
        let (_, rollout) = view.rollouts.iter().find(|(m, _)| *m == request.model_name)?;
        let open = rollout.is_open();
        let mut side = Side {
            arm: Arm::Serving,
            serving: rollout.serving.clone(),
            candidate: rollout.candidate.clone(),
            open,
            shadow: rollout.shadow,
            started: rollout.started,
            client_deadline: mesh::params::timeout(&request.parameters).ok().flatten().is_some(),
            drawn: false,
            since: Instant::now(),
            untallied: open.then(|| (self.placement.clone(), request.model_name.clone())),
        };
        let table = self.view.routing();
        let ready = |arm| table.resolve(&request.model_name, side.version(arm)).is_ok();
        // A sequence's pin is its model's and this rollout's (ids are the client's, per model).
        let sequence = super::forward::sequence_of(request).map(|id| {
            let m = &request.model_name;
            format!("{m}\0{}\0{}\0{}\0{id}", side.serving, side.candidate, side.started)
        });
        let key = client_key(&request.parameters);
        let key = match (&sequence, &key) {
            (Some(id), _) => {
                let (start, end) = mesh::params::sequence_flags(&request.parameters).unwrap_or_default();
                Key::Sequence { id, start, end }
            }
            (None, Some(k)) => Key::Client(k),
            (None, None) => Key::Drawn(rand::random()),
        };
        let drawn = matches!(key, Key::Drawn(_));
        let arm = split::choose(key, rollout.share(), &mut self.pins.locked(), side.since, ready);
        side.drawn = drawn;
        side.arm = arm;
        request.model_version = side.version(arm).to_string();
        Some(side)
    }

    /// After a request the candidate failed: when the rule says it is safe, counts the failure
    /// (tally and metrics), moves the request to the serving version with a fresh routing state
    /// within its deadline, and answers true (send it again).
    pub(super) fn to_serving(
        &self,
        side: &mut Side,
        r: &mut Attempts,
        request: &mut InferRequest,
        error: &Error,
    ) -> bool {
        let state = r.state();
        let now = Instant::now();
        let safe = split::retry_on_serving(error.code, r.sequence().is_some(), state.answers(), state.idempotent());
        // Only while the rollout runs: once over, the serving version may be gone.
        if side.arm != Arm::Candidate || !side.open || !safe || now >= r.deadline() {
            return false;
        }
        let took = now - side.since;
        let model = request.model_name.clone();
        self.tally::<()>(side, Err(error), r.deadline(), now);
        metrics::request(&model, &side.candidate, 1, took, Some(error.metric_reason()));
        metrics::rollout_retry(&model);
        tracing::debug!(model = %model, candidate = %side.candidate, serving = %side.serving,
            "the candidate failed ({error}); sending the request to the serving version");
        side.arm = Arm::Serving;
        side.since = now;
        side.untallied = Some((self.placement.clone(), model));
        request.model_version = side.serving.clone();
        *r = self.begin_until(request, r.deadline());
        true
    }

    /// Tallies the answer of the side's version for the guard (a running rollout's only), as
    /// [`split::counted`] says it counts.
    pub(super) fn tally<T>(&self, side: &mut Side, result: Result<T, &Error>, deadline: Instant, now: Instant) {
        let gave_up = side.client_deadline && now >= deadline;
        let ok = split::counted(result.map(drop).map_err(|e| e.code), side.drawn, gave_up);
        side.settle(ok, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_key_is_read_from_either_parameter_and_bounded() {
        let with = |k: &str, v: Param| vec![(k.to_string(), v)];
        assert_eq!(
            client_key(&with("rollout_key", Param::String("alice".into()))).as_deref(),
            Some("alice")
        );
        assert_eq!(
            client_key(&with("mesh-rollout-key", Param::Uint(7))).as_deref(),
            Some("7")
        );
        assert_eq!(client_key(&with("rollout_key", Param::Int(-7))).as_deref(), Some("-7"));
        assert_eq!(client_key(&with("rollout_key", Param::String(String::new()))), None);
        assert_eq!(client_key(&with("rollout_key", Param::Bool(true))), None);
        assert_eq!(client_key(&with("other", Param::String("x".into()))), None);
        let long = "é".repeat(300);
        let cut = client_key(&with("rollout_key", Param::String(long))).unwrap();
        assert!(cut.len() <= MAX_KEY_BYTES && cut.chars().all(|c| c == 'é'));
    }
}
