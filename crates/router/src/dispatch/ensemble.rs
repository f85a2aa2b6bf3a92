//! Router ensembles (those of the router's own repository): planned against the cluster as it is
//! now, each step routed through the router's Dispatch to wherever its model is served.
use std::time::Instant;

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
    pub(super) async fn run_ensemble(&self, request: InferRequest) -> Result<InferResponse> {
        let name = request.model_name.clone();
        let plan = match self.ensemble_plan(&name) {
            Some(Ok(plan)) => plan,
            Some(Err(why)) => return Err(Error::unavailable(format!("ensemble '{name}' is not ready: {why}"))),
            None => return Err(Error::not_found(format!("unknown model: '{name}' is not found"))),
        };
        let Some(ensemble) = self.ensembles.get(&name) else {
            return Err(Error::not_found(format!("unknown model: '{name}' is not found")));
        };
        let started = Instant::now();
        let wanted = mesh::classify::wanted(&request.outputs);
        let checked = mesh::validate::check_request(&ensemble.config, &request)
            .and_then(|()| mesh::classify::check(&ensemble.config, &request.outputs, false));
        let result = match checked {
            Ok(()) => mesh::ensemble::run(&plan, self, request).await.and_then(|mut r| {
                mesh::classify::apply(&mut r, &wanted, &ensemble.config, &ensemble.labels).map(|()| r)
            }),
            Err(e) => Err(e),
        };
        self.ensembles.record(&name, result.is_ok(), started.elapsed());
        result.map(|mut r| {
            r.model_version = ensemble.version.to_string();
            r
        })
    }

    /// A router ensemble on a stream: one with a decoupled step streams each of its answers, any
    /// other answers once.
    pub(super) async fn stream_ensemble(&self, request: InferRequest, sink: StreamSender) {
        let Some(ensemble) = self.ensembles.get(&request.model_name) else {
            return;
        };
        if let Some(Ok(plan)) = self.ensemble_plan(&request.model_name) {
            if plan.decoupled {
                match mesh::validate::check_request(&ensemble.config, &request) {
                    Ok(()) => mesh::ensemble::run_stream(&plan, self, request, sink).await,
                    Err(e) => drop(sink.send(StreamItem::new(Some(Err(e)), true))),
                }
                return;
            }
        }
        let response = self.run_ensemble(request).await;
        let _ = sink.send(StreamItem::new(Some(response), true));
    }
}
