//! Retry rules: whether a failed attempt may go to another node, as a pure decision.
//!
//! The rules:
//! - An attempt the node **answered** with an error (the model ran) is never retried; the error goes to
//!   the client unchanged.
//! - A request of a **sequence** (it carries a `sequence_id`) is pinned to one node, where the
//!   sequence's state lives: it is never moved to another node, whatever failed; it gets UNAVAILABLE
//!   naming the node and the failure.
//! - An attempt **not sent** whole (the stream could not be opened or written), one the node **refused**
//!   (it is draining, does not serve the model) or refused as **overloaded** never ran, so it is always
//!   safe to retry on another node.
//! - An attempt **lost** after it was sent (the link or stream failed) may have run. It is retried only for
//!   an idempotent request that has forwarded no answer yet. A decoupled stream that already answered gets
//!   UNAVAILABLE saying the node was lost after N answers; a request of a model marked non-idempotent gets
//!   UNAVAILABLE saying why it was not retried.
//! - Every retry stays within the attempt bound (default 3 attempts in all) and the request's deadline.
//!   Giving up on either is UNAVAILABLE (the client may retry later), naming the nodes tried and the last
//!   failure.
//! - Each attempt goes to a link not tried before for this request (the balancer excludes them); a node
//!   that joined again over a new link counts as untried.
use std::time::Instant;

pub use mesh::cluster::call::Failure;
use mesh::Error;

use crate::membership::LinkId;

/// The bound on attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetrySettings {
    /// Attempts in all, the first included.
    pub max_attempts: u32,
}

impl Default for RetrySettings {
    fn default() -> Self {
        RetrySettings { max_attempts: 3 }
    }
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Pick another node and send again.
    Retry,
    /// Answer the client with this error.
    GiveUp(Error),
}

/// What the retry rules need to know about one client request.
#[derive(Debug, Clone)]
pub struct RequestState {
    model: String,
    started_at: Instant,
    deadline: Instant,
    idempotent: bool,
    sequence: bool,
    tried: Vec<LinkId>,
    nodes: Vec<String>,
    answers: u32,
}

impl RequestState {
    /// A request for `model`, received at `started_at`, to be answered by `deadline`. It starts idempotent
    /// and outside any sequence.
    pub fn new(model: impl Into<String>, started_at: Instant, deadline: Instant) -> Self {
        RequestState {
            model: model.into(),
            started_at,
            deadline,
            idempotent: true,
            sequence: false,
            tried: Vec::new(),
            nodes: Vec::new(),
            answers: 0,
        }
    }

    /// Whether it may run twice (its model is not marked non-idempotent).
    pub fn idempotent(&self) -> bool {
        self.idempotent
    }

    /// Marks the request as one that must not run twice (its model is marked non-idempotent).
    pub fn non_idempotent(mut self) -> Self {
        self.idempotent = false;
        self
    }

    /// Marks the request as part of a sequence (it carries a `sequence_id`).
    pub fn in_sequence(mut self) -> Self {
        self.sequence = true;
        self
    }

    /// Records an attempt sent on `link` to the node named `node`.
    pub fn sent(&mut self, link: LinkId, node: impl Into<String>) {
        self.tried.push(link);
        self.nodes.push(node.into());
    }

    /// Records one answer forwarded to the client (a decoupled stream's response).
    pub fn answered(&mut self) {
        self.answers += 1;
    }

    /// Links already tried, for [`super::Balancer::pick`].
    pub fn tried(&self) -> &[LinkId] {
        &self.tried
    }

    /// Attempts sent so far.
    pub fn attempts(&self) -> u32 {
        self.tried.len() as u32
    }

    /// Answers forwarded to the client so far.
    pub fn answers(&self) -> u32 {
        self.answers
    }

    /// When the client must have its answer.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Whether the deadline has passed at `now`.
    pub fn expired(&self, now: Instant) -> bool {
        now >= self.deadline
    }

    fn elapsed_ms(&self, now: Instant) -> u128 {
        now.saturating_duration_since(self.started_at).as_millis()
    }

    fn tried_text(&self) -> String {
        if self.nodes.is_empty() {
            "no node tried".into()
        } else {
            format!("nodes tried: {}", self.nodes.join(", "))
        }
    }

    /// The error for a request whose deadline passed while it waited for a replica (`reason` says why none
    /// was available).
    pub fn waited_out(&self, reason: &str, now: Instant) -> Error {
        Error::unavailable(format!(
            "model '{}': the request's deadline passed after {} ms waiting for a replica ({}; {}): {}",
            self.model,
            self.elapsed_ms(now),
            attempts_text(self.attempts()),
            self.tried_text(),
            reason
        ))
    }
}

fn attempts_text(n: u32) -> String {
    if n == 1 {
        "1 attempt".into()
    } else {
        format!("{n} attempts")
    }
}

/// The retry rules with their attempt bound.
#[derive(Debug, Clone, Copy, Default)]
pub struct RetryPolicy {
    settings: RetrySettings,
}

impl RetryPolicy {
    /// The rules with this attempt bound.
    pub fn new(settings: RetrySettings) -> Self {
        RetryPolicy { settings }
    }

    /// Whether the request may be sent again after its last attempt (the last one recorded with
    /// [`RequestState::sent`]) failed with `failure` at `now`.
    pub fn decide(&self, req: &RequestState, failure: Failure, now: Instant) -> Decision {
        let node = req.nodes.last().map(String::as_str).unwrap_or("?");
        let last = match &failure {
            Failure::Answered(e) => return Decision::GiveUp(e.clone()),
            Failure::NotSent(why) => format!("node '{node}' did not start it: {why}"),
            Failure::Refused(e) => format!("node '{node}' did not start it: {}", e.message),
            Failure::Overloaded(e) => format!("node '{node}' is overloaded: {}", e.message),
            Failure::Lost(why) => format!("node '{node}' was lost: {why}"),
        };
        let model = &req.model;
        // A sequence is pinned to one node (its state lives there): it never moves, whatever failed.
        if req.sequence {
            return give_up(format!(
                "model '{model}': a sequence request stays on its node and node '{node}' failed it ({last}); \
                 it is not moved to another node"
            ));
        }
        if let Failure::Lost(why) = &failure {
            if req.answers > 0 {
                return give_up(format!(
                    "model '{model}': node '{node}' was lost after {} of the stream's answers ({why}); \
                     a stream that already answered is not retried",
                    req.answers
                ));
            }
            if !req.idempotent {
                return give_up(format!(
                    "model '{model}': node '{node}' was lost while it had the request ({why}); the request may \
                     have run and the model is marked non-idempotent, so it is not retried"
                ));
            }
        }
        if req.expired(now) {
            return give_up(format!(
                "model '{model}': the request's deadline passed after {} ms and {} ({}); last failure: {last}",
                req.elapsed_ms(now),
                attempts_text(req.attempts()),
                req.tried_text()
            ));
        }
        if req.attempts() >= self.settings.max_attempts {
            return give_up(format!(
                "model '{model}': gave up after {} ({}); last failure: {last}",
                attempts_text(req.attempts()),
                req.tried_text()
            ));
        }
        Decision::Retry
    }
}

fn give_up(message: String) -> Decision {
    Decision::GiveUp(Error::unavailable(message))
}

#[cfg(test)]
mod tests;
