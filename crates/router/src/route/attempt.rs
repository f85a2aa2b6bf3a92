//! One request's way through the routing rules, as a pure decision: resolve the model, pin a
//! sequence or let the balancer pick, wait for a replica, and record each attempt's outcome.
//!
//! The real dispatcher and the simulator both run [`Attempts`]: each asks [`Attempts::next`] where
//! the next attempt goes (Send, Wait or Fail), tells it when an attempt was sent, and reports how
//! it ended with [`Attempts::failed`] or [`Attempts::succeeded`], the one place an outcome reaches
//! the balancer and the retry rules.
//!
//! The rules, beyond the retry rules ([`super::retry`]):
//! - A request for "the latest" version stays on the version its first attempt resolved to.
//! - A model known to the cluster with no routable replica, or a model of the cluster repository
//!   being placed, is waited for (at most the route wait, within the deadline); an unknown model
//!   fails at once with NOT_FOUND.
//! - A model is idempotent unless its config (or, for an ensemble a node runs whole, a step
//!   model's) sets `mesh.idempotent` to `false`.
//! - A sequence's requests all go to one node: the highest rendezvous hash of (sequence, node).
use std::time::{Duration, Instant};

use mesh::cluster::call::Failure;
use mesh::Error;
use rand::Rng;

use super::balance::{Balancer, Pick};
use super::retry::{Decision, RequestState, RetryPolicy};
use crate::membership::{LinkId, Replica, ResolveError, RoutingTable};

/// Where the next attempt goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Send it on `link`, for this model version.
    Send { link: LinkId, version: String },
    /// Nothing can take it now: ask again at `until` or when the routing table changes.
    Wait { reason: String, until: Instant },
    /// Answer the client with this error.
    Fail(Error),
}

/// What a request routes against at one moment.
pub struct View<'a, I: Fn(LinkId) -> u32> {
    pub table: &'a RoutingTable,
    /// Whether the cluster is placing a model (a request for it waits instead of failing unknown).
    pub placing: &'a dyn Fn(&str) -> bool,
    /// The router's in-flight count on each link.
    pub inflight: I,
}

/// One request's routing state.
#[derive(Debug, Clone)]
pub struct Attempts {
    state: RequestState,
    model: String,
    /// The version asked for, then the one the first pick resolved to.
    version: String,
    resolved: bool,
    sequence: Option<String>,
    route_wait: Duration,
    /// When the current attempt started waiting for a replica.
    waiting_since: Option<Instant>,
    /// A node failed at the transport level: success afterwards is a failover.
    failed_over: bool,
    /// What went wrong with the last attempt, for the client's error when nothing is left to try.
    last_failure: Option<String>,
}

impl Attempts {
    /// A request for `model` `version` received at `now`, to be answered by `deadline`, in the
    /// sequence `sequence` if it belongs to one; each attempt waits at most `route_wait` for a
    /// replica.
    pub fn new(
        model: &str,
        version: &str,
        sequence: Option<String>,
        now: Instant,
        deadline: Instant,
        route_wait: Duration,
    ) -> Self {
        let mut state = RequestState::new(model, now, deadline);
        if sequence.is_some() {
            state = state.in_sequence();
        }
        Attempts {
            state,
            model: model.to_string(),
            version: version.to_string(),
            resolved: false,
            sequence,
            route_wait,
            waiting_since: None,
            failed_over: false,
            last_failure: None,
        }
    }

    /// Where the next attempt goes at `now`.
    pub fn next<I: Fn(LinkId) -> u32, R: Rng + ?Sized>(
        &mut self,
        view: &View<'_, I>,
        balancer: &Balancer,
        now: Instant,
        rng: &mut R,
    ) -> Step {
        let (reason, until) = match view.table.resolve(&self.model, &self.version) {
            Err(ResolveError::NoReplica { reason }) => (reason, None),
            Err(ResolveError::NotFound(_)) if (view.placing)(&self.model) => {
                (format!("model '{}' is being placed", self.model), None)
            }
            Err(e) => return Step::Fail(self.with_cause(e.into())),
            Ok(resolved) => {
                let version = resolved.version.to_string();
                if !self.resolved {
                    let config = view.table.model_view(&self.model, &version);
                    if config.is_ok_and(|v| !idempotent_in(view.table, &v.config, 0)) {
                        self.state = self.state.clone().non_idempotent();
                    }
                }
                let pick = match &self.sequence {
                    // The retry rules never move a sequence, so this is its one attempt.
                    Some(seq) => pinned(seq, resolved.replicas).map_or_else(
                        || Pick::Wait {
                            reason: "no replica".into(),
                            until: None,
                        },
                        Pick::Routed,
                    ),
                    None => balancer.pick(resolved.replicas, &view.inflight, self.state.tried(), now, rng),
                };
                match pick {
                    Pick::Routed(link) => {
                        self.resolved = true;
                        self.version = version.clone();
                        self.waiting_since = None;
                        return Step::Send { link, version };
                    }
                    Pick::Wait { reason, until } => (reason, until),
                    Pick::Unavailable(e) => return Step::Fail(self.with_cause(e)),
                }
            }
        };
        self.wait(reason, until, now)
    }

    /// The link [`Step::Send`] named ended before the attempt was sent: look again shortly (its
    /// removal from the routing table is on its way).
    pub fn vanished(&mut self, now: Instant) -> Step {
        self.wait("a chosen node just left".into(), Some(now + VANISHED_RETRY), now)
    }

    fn wait(&mut self, reason: String, until: Option<Instant>, now: Instant) -> Step {
        let bound = (*self.waiting_since.get_or_insert(now) + self.route_wait).min(self.state.deadline());
        if now >= bound {
            return Step::Fail(self.with_cause(self.state.waited_out(&reason, now)));
        }
        Step::Wait {
            reason,
            until: until.map_or(bound, |u| u.min(bound)),
        }
    }

    /// An error that ends routing, with the last attempt's failure when there was one.
    fn with_cause(&self, e: Error) -> Error {
        match &self.last_failure {
            Some(why) => Error::new(e.code, format!("{}; last failure: {why}", e.message)),
            None => e,
        }
    }

    /// Records an attempt sent on `link` to the node named `node`.
    pub fn sent(&mut self, link: LinkId, node: &str) {
        self.state.sent(link, node);
    }

    /// Records one answer of a stream forwarded to the client.
    pub fn answered(&mut self) {
        self.state.answered();
    }

    /// The attempt on `link` succeeded.
    pub fn succeeded(&mut self, link: LinkId, balancer: &mut Balancer) {
        balancer.succeeded(link);
    }

    /// The attempt on `link` failed at `now`: the balancer marks the link (quarantined after a
    /// transport failure, busy when overloaded), and the retry rules say whether to try again.
    pub fn failed(
        &mut self,
        link: LinkId,
        failure: Failure,
        balancer: &mut Balancer,
        retry: &RetryPolicy,
        now: Instant,
    ) -> Decision {
        self.last_failure = Some(failure.to_string());
        match &failure {
            Failure::NotSent(_) | Failure::Lost(_) => {
                balancer.transport_failed(link, now);
                self.failed_over = true;
            }
            Failure::Overloaded(_) => balancer.overloaded(link, now),
            Failure::Refused(_) | Failure::Answered(_) => {}
        }
        retry.decide(&self.state, failure, now)
    }

    /// Whether the request moved off a node that failed at the transport level.
    pub fn failed_over(&self) -> bool {
        self.failed_over
    }

    /// The version the request resolved to (empty before its first attempt).
    pub fn version(&self) -> Option<&str> {
        self.resolved.then_some(self.version.as_str())
    }

    pub fn deadline(&self) -> Instant {
        self.state.deadline()
    }

    /// The model it routes.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The sequence it belongs to, if any.
    pub fn sequence(&self) -> Option<&str> {
        self.sequence.as_deref()
    }

    /// The retry rules' view of the request.
    pub fn state(&self) -> &RequestState {
        &self.state
    }
}

/// How soon a request whose chosen link vanished looks again.
const VANISHED_RETRY: Duration = Duration::from_millis(5);

/// The replica a sequence is pinned to: the highest rendezvous hash of (sequence, node name), so
/// every request of a sequence picks the same node while it serves the model, and a node joining or
/// leaving moves only the sequences it wins or held.
pub fn pinned(sequence: &str, replicas: &[Replica]) -> Option<LinkId> {
    use std::hash::{Hash, Hasher};
    replicas
        .iter()
        .max_by_key(|r| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (sequence, r.node.as_str()).hash(&mut h);
            h.finish()
        })
        .map(|r| r.link)
}

/// A model is idempotent unless its config says `parameters { key: "mesh.idempotent" value {
/// string_value: "false" } }`: then a request lost with its node is not run again elsewhere.
pub fn idempotent(config: &mesh::config::ModelConfig) -> bool {
    config
        .parameters
        .get("mesh.idempotent")
        .is_none_or(|p| !p.string_value.trim().eq_ignore_ascii_case("false"))
}

/// Whether version `version` of `model` may run twice, as the cluster serves it (true when the
/// table does not know it).
pub fn may_run_twice(table: &RoutingTable, model: &str, version: &str) -> bool {
    table
        .model_view(model, version)
        .map_or(true, |v| idempotent_in(table, &v.config, 0))
}

/// Whether a model served in the cluster is idempotent: its own flag, and for an ensemble a node
/// runs whole, every step model's too (nested ensembles to a few levels).
fn idempotent_in(table: &RoutingTable, config: &mesh::config::ModelConfig, depth: usize) -> bool {
    if !idempotent(config) {
        return false;
    }
    let steps = mesh::ensemble::step_models(config);
    depth < 8
        && steps.iter().all(|step| {
            table
                .model_view(step, "")
                .map_or(true, |v| idempotent_in(table, &v.config, depth + 1))
        })
}

#[cfg(test)]
mod tests;
