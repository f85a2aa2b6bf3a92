//! Shadow requests as they leave the router: a share of the requests a running rollout sends to
//! the serving version is also sent to the candidate, in a task of its own, so the client's answer
//! never waits for it; the shadow's answer is compared with the client's ([`shadow::compare`]) and
//! dropped. Shadows are dropped first under load: they take no part of the clients' budget, only
//! their own (a few in flight, a bound in bytes), go once to the candidate's least busy replica
//! without waiting or retrying, and are not sent at all when there is no room.
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mesh::cluster::call::{self, Peer};
use mesh::cluster::convert::request_frame;
use mesh::sync::Locked;
use mesh::{InferRequest, InferResponse, NamedTensor};
use serde_json::Value;
use tokio::sync::{oneshot, Semaphore};

use super::rollout::Side;
use super::RouterDispatch;
use crate::metrics;
use crate::rollout::shadow::{self, Results};
use crate::rollout::Arm;
use crate::shared::RoutingView;

/// The most shadows in flight on this router at once.
const MAX_SHADOWS: usize = 16;
/// The most request bytes the shadows in flight may hold.
const MAX_SHADOW_BYTES: usize = 64 << 20;
/// The longest a shadow waits for the client's answer to compare with.
const ANSWER_WAIT: Duration = Duration::from_secs(60);

/// The shadows' own budget and each model's results on this router.
pub(super) struct Shadows {
    slots: Arc<Semaphore>,
    bytes: Arc<AtomicUsize>,
    results: Mutex<HashMap<String, Results>>,
}

impl Default for Shadows {
    fn default() -> Self {
        Shadows {
            slots: Arc::new(Semaphore::new(MAX_SHADOWS)),
            bytes: Arc::new(AtomicUsize::new(0)),
            results: Mutex::new(HashMap::new()),
        }
    }
}

impl Shadows {
    /// `f` on `model`'s results of `rollout` (serving, candidate, started): new ones for a later
    /// rollout of the model; a late shadow of an earlier one counts for nothing.
    fn with(&self, model: &str, rollout: (&str, &str, u64), f: impl FnOnce(&mut Results)) {
        let mut all = self.results.locked();
        let r = all.entry(model.to_string()).or_insert_with(|| Results::new(rollout));
        let (serving, candidate, started) = rollout;
        if r.rollout != (serving.to_string(), candidate.to_string(), started) {
            if started < r.rollout.2 {
                return;
            }
            *r = Results::new(rollout);
        }
        f(r);
    }
}

/// The bytes of tensors (a request's inputs, an answer's outputs).
fn tensors_size(tensors: &[NamedTensor]) -> usize {
    tensors.iter().map(|t| t.tensor.data.len()).sum()
}

/// Why a shadow got no answer.
enum NotAnswered {
    /// Not sent: the candidate has no ready replica here.
    NoReplica,
    /// Sent, and failed (or not answered in time).
    Failed(String),
}

/// What a shadow needs once it is on its own.
struct Shadow {
    view: Arc<RoutingView>,
    shadows: Arc<Shadows>,
    model: String,
    rollout: (String, String, u64),
    request: InferRequest,
    held: usize,
}

impl RouterDispatch {
    /// Starts the shadow of `request` when its rollout shadows a share that its draw falls in and
    /// there is room; answers where the client's answer (and how long it took) goes to be compared.
    /// Requests of a sequence are never shadowed (the candidate holds no state of theirs), nor those
    /// of a model marked `mesh.idempotent: false`.
    pub(super) fn shadow(
        &self,
        side: &Side,
        request: &InferRequest,
        is_sequence: bool,
    ) -> Option<oneshot::Sender<(InferResponse, Duration)>> {
        if side.arm != Arm::Serving || !side.open || is_sequence || !shadow::shadowed(rand::random(), side.shadow) {
            return None;
        }
        // A model marked `mesh.idempotent: false` must not run a request twice.
        if !crate::route::attempt::may_run_twice(&self.view.routing(), &request.model_name, &side.candidate) {
            return None;
        }
        let rollout = (side.serving.as_str(), side.candidate.as_str(), side.started);
        let model = request.model_name.clone();
        let size = tensors_size(&request.inputs);
        let slot = self.shadows.slots.clone().try_acquire_owned().ok();
        let held = self.shadows.bytes.fetch_add(size, Ordering::AcqRel) + size;
        let Some(slot) = slot.filter(|_| held <= MAX_SHADOW_BYTES) else {
            self.shadows.bytes.fetch_sub(size, Ordering::AcqRel);
            self.shadows.with(&model, rollout, |r| r.dropped += 1);
            metrics::rollout_shadow(&model, "dropped");
            return None;
        };
        let mut copy = request.clone();
        copy.model_version = side.candidate.clone();
        let shadow = Shadow {
            view: self.view.clone(),
            shadows: self.shadows.clone(),
            model,
            rollout: (side.serving.clone(), side.candidate.clone(), side.started),
            request: copy,
            held: size,
        };
        let (tx, rx) = oneshot::channel();
        tokio::spawn(async move {
            shadow.run(rx).await;
            drop(slot);
        });
        Some(tx)
    }

    /// This router's shadow results of `model`'s rollout that started at `started`, if it
    /// shadowed any.
    pub fn shadow_status(&self, model: &str, started: u64) -> Option<Value> {
        let all = self.shadows.results.locked();
        all.get(model).filter(|r| r.rollout.2 == started).map(Results::status)
    }
}

impl Shadow {
    async fn run(self, answer: oneshot::Receiver<(InferResponse, Duration)>) {
        let started = Instant::now();
        let result = self.send().await;
        let took = started.elapsed();
        // The request's bytes are let go; the shadow's answer is held until compared.
        let answer_size = result.as_ref().map_or(0, |a| tensors_size(&a.outputs));
        self.shadows.bytes.fetch_add(answer_size, Ordering::AcqRel);
        self.shadows.bytes.fetch_sub(self.held, Ordering::AcqRel);
        let versions = (self.rollout.0.as_str(), self.rollout.1.as_str(), self.rollout.2);
        let outcome = match result {
            Err(NotAnswered::NoReplica) => {
                self.shadows.with(&self.model, versions, |r| r.dropped += 1);
                "dropped"
            }
            Err(NotAnswered::Failed(why)) => {
                tracing::debug!(model = %self.model, "a shadow request failed: {why}");
                self.shadows.with(&self.model, versions, |r| r.failed(took));
                "failed"
            }
            Ok(shadow) => {
                // The client's answer, once it is sent; a request that failed is not compared.
                let Ok(Ok((real, real_took))) = tokio::time::timeout(ANSWER_WAIT, answer).await else {
                    self.shadows.bytes.fetch_sub(answer_size, Ordering::AcqRel);
                    self.shadows.with(&self.model, versions, |r| r.dropped += 1);
                    metrics::rollout_shadow(&self.model, "dropped");
                    return;
                };
                // Both answers are held while compared: within the shadows' bytes, off the async
                // threads (a large output takes a while).
                let real_size = tensors_size(&real.outputs);
                let size = real_size + answer_size;
                let held = self.shadows.bytes.fetch_add(real_size, Ordering::AcqRel) + real_size;
                let compared = if held <= MAX_SHADOW_BYTES {
                    tokio::task::spawn_blocking(move || shadow::compare(&real.outputs, &shadow.outputs))
                        .await
                        .ok()
                } else {
                    None
                };
                self.shadows.bytes.fetch_sub(size, Ordering::AcqRel);
                match compared {
                    None => {
                        self.shadows.with(&self.model, versions, |r| r.dropped += 1);
                        "dropped"
                    }
                    Some(c) => {
                        self.shadows
                            .with(&self.model, versions, |r| r.compared(&c, real_took, took));
                        if c.mismatched {
                            "mismatched"
                        } else {
                            "matched"
                        }
                    }
                }
            }
        };
        metrics::rollout_shadow(&self.model, outcome);
    }

    /// Sends the shadow once to the candidate's least busy ready replica: its answer, or why not.
    async fn send(&self) -> Result<InferResponse, NotAnswered> {
        let link = {
            let table = self.view.routing();
            let resolved = table
                .resolve(&self.request.model_name, &self.request.model_version)
                .map_err(|_| NotAnswered::NoReplica)?;
            resolved
                .replicas
                .iter()
                .filter_map(|p| self.view.link(p.link))
                .min_by_key(|l| l.inflight())
                .ok_or(NotAnswered::NoReplica)?
        };
        let _permit = link.permit();
        let chunks = request_frame(&self.request, false, None, &self.view.limits)
            .map_err(|e| NotAnswered::Failed(e.to_string()))?;
        let name = format!("node '{}'", link.name);
        let peer = Peer {
            conn: &link.conn,
            name: &name,
            out: link.out(),
        };
        let deadline = self.view.route.request_timeout;
        match tokio::time::timeout(deadline, call::unary(peer, chunks, &link.limits)).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(failure)) => Err(NotAnswered::Failed(failure.to_string())),
            Err(_) => Err(NotAnswered::Failed(format!("no answer within {deadline:?}"))),
        }
    }
}
