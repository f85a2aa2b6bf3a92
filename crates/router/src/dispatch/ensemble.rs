//! Router ensembles (those of the router's own repository): planned against the cluster as it is
//! now, each step routed through the router's Dispatch to wherever its model is served.
use std::time::Instant;

use mesh::ensemble::Served;
use mesh::validate::Admitted;
use mesh::{Error, IndexEntry, InferRequest, InferResponse, Result, StreamItem, StreamSender};

use super::RouterDispatch;

impl RouterDispatch {
    /// A router ensemble's plan against the cluster as it is now.
    fn ensemble_plan(&self, name: &str) -> Option<crate::ensembles::Planned> {
        let generation = self.view.routing().generation();
        self.ensembles.plan(name, generation, &|m, v| self.cluster_view(m, v))
    }

    /// Whether a router ensemble can serve now: it plans against the cluster and every step model
    /// has a routable replica (else the reason).
    pub(super) fn ensemble_ready(&self, name: &str) -> Option<std::result::Result<(), String>> {
        let plan = match self.ensemble_plan(name)? {
            Ok(plan) => plan,
            Err(why) => return Some(Err(why)),
        };
        let table = self.view.routing();
        let missing: Vec<String> = plan
            .steps
            .iter()
            .filter(|step| !table.model_view(&step.model, &step.version).is_ok_and(|v| v.ready))
            .map(|step| format!("step model '{}' has no ready replica", step.model))
            .collect();
        Some(if missing.is_empty() {
            Ok(())
        } else {
            Err(missing.join("; "))
        })
    }

    /// The repository index rows of the router's ensembles.
    pub(super) fn ensemble_rows(&self, rows: &mut Vec<IndexEntry>) {
        for name in self.ensembles.names() {
            let Some(e) = self.ensembles.get(name) else { continue };
            let (state, reason) = match self.ensemble_ready(name) {
                Some(Ok(())) => ("READY", String::new()),
                Some(Err(why)) => ("UNAVAILABLE", why),
                None => continue,
            };
            rows.push(IndexEntry {
                name: name.clone(),
                version: e.version.to_string(),
                state: state.into(),
                reason,
                nodes: vec![],
            });
        }
    }

    /// Runs a router ensemble: its steps go through this Dispatch, each wherever its model is served.
    /// `stream`: where the answers of an ensemble with a decoupled step go (None: it must answer
    /// once). Checked, run, classified and counted as a node serves its own ensembles
    /// (`mesh::validate::Admitted`, `mesh::ensemble::serve`).
    async fn serve_ensemble(
        &self,
        request: InferRequest,
        stream: Option<StreamSender>,
    ) -> Result<Option<InferResponse>> {
        let name = request.model_name.clone();
        let plan = match self.ensemble_plan(&name) {
            Some(Ok(plan)) => plan,
            Some(Err(why)) => return Err(Error::unavailable(format!("ensemble '{name}' is not ready: {why}"))),
            None => return Err(Error::not_found(format!("unknown model: '{name}' is not found"))),
        };
        let Some(ensemble) = self.ensembles.get(&name) else {
            return Err(Error::not_found(format!("unknown model: '{name}' is not found")));
        };
        if plan.decoupled && stream.is_none() {
            return Err(mesh::validate::needs_stream(&name));
        }
        let started = Instant::now();
        let admitted = match Admitted::check(&ensemble.config, &request, plan.decoupled) {
            Ok(admitted) => admitted,
            Err(e) => {
                self.ensembles.record(&name, false, started.elapsed());
                return Err(e);
            }
        };
        let version = ensemble.version.to_string();
        let served = mesh::ensemble::serve(&plan, self, request, &version, stream).await;
        self.ensembles
            .record(&name, served.failed().is_none(), started.elapsed());
        match served {
            Served::Answered(answer) => answer
                .and_then(|r| admitted.answer(r, &ensemble.config, &ensemble.labels))
                .map(Some),
            Served::Streamed { .. } => Ok(None),
        }
    }

    /// A router ensemble asked for one answer.
    pub(super) async fn run_ensemble(&self, request: InferRequest) -> Result<InferResponse> {
        let name = request.model_name.clone();
        self.serve_ensemble(request, None)
            .await?
            .ok_or_else(|| Error::internal(format!("ensemble '{name}' gave no answer")))
    }

    /// A router ensemble on a stream: one with a decoupled step streams each of its answers, any
    /// other answers once. How it ended (its error was sent to `sink` too).
    pub(super) async fn stream_ensemble(&self, request: InferRequest, sink: StreamSender) -> Result<()> {
        let answer = self.serve_ensemble(request, Some(sink.clone())).await;
        let ended = answer.as_ref().map(|_| ()).map_err(Clone::clone);
        if let Some(answer) = answer.transpose() {
            let _ = sink.send(StreamItem::new(Some(answer), true));
        }
        ended
    }
}
