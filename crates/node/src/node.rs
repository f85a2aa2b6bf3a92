//! The running node: its Dispatch and the root of its actor tree, started and stopped together.
use mesh::sync::ReadWrite;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorRef};

use crate::actors::manager::loader::Repositories;
use crate::actors::manager::{ManagerLink, ManagerMsg};
use crate::actors::node::{NodeSupervisor, SupervisorArgs};
use crate::actors::table::ModelTable;
use crate::backend::python::live::LiveStubs;
use crate::cli::ControlMode;
use crate::repository::placed::PlacedModels;
use crate::serving::bls::BlsDispatch;
use crate::serving::dispatch::{NodeDispatch, NodeOptions};

/// The running node: its Dispatch and the root of its actor tree.
pub struct Node {
    pub dispatch: Arc<NodeDispatch>,
    /// The Dispatch of BLS calls: this node's, and the cluster's for models served elsewhere.
    pub bls: Arc<BlsDispatch>,
    supervisor: ActorRef<()>,
    manager: Arc<ManagerLink>,
    placed: Arc<PlacedModels>,
    /// The Python instances' stubs still running: a stop waits for their finalize().
    stubs: Arc<LiveStubs>,
}

impl Node {
    /// Starts the actor tree: NodeSupervisor → RepositoryManager → ModelActor → InstanceActor.
    pub async fn start(repos: Repositories, options: NodeOptions) -> Result<Node, String> {
        let table = Arc::new(ModelTable::new(repos.loading.namespacing));
        let manager = Arc::new(ManagerLink::default());
        let dispatch = Arc::new(NodeDispatch::new(&options, &repos, table.clone(), manager.clone()));
        let bls = Arc::new(BlsDispatch::new(dispatch.clone()));
        let placed = repos.placed.clone();
        let stubs = repos.python.live.clone();
        let seam: Arc<dyn mesh::Dispatch> = bls.clone();
        let _ = repos.python.dispatch.set(Arc::downgrade(&seam));
        let args = SupervisorArgs {
            poll_every: (repos.mode == ControlMode::Poll).then(|| Duration::from_secs(options.poll_secs)),
            repos: Arc::new(repos),
            table,
            manager: manager.clone(),
        };
        let (supervisor, _) = Actor::spawn(None, NodeSupervisor, args)
            .await
            .map_err(|e| format!("cannot start the node supervisor: {e}"))?;
        crate::backend::python::stub::node_started();
        Ok(Node {
            dispatch,
            bls,
            supervisor,
            manager,
            placed,
            stubs,
        })
    }

    /// Loads the models the control mode asks for; returns how many failed.
    pub async fn load_at_start(&self, explicit: &[String]) -> usize {
        let manager = self.manager.reading().clone();
        let Some(manager) = manager else { return 0 };
        let explicit = explicit.to_vec();
        crate::actors::ask(&manager, "repository manager", |reply| {
            ManagerMsg::LoadAtStart(explicit, reply)
        })
        .await
        .unwrap_or(0)
    }

    /// The models the cluster's router placed here.
    pub fn placed(&self) -> Arc<PlacedModels> {
        self.placed.clone()
    }

    /// The model table requests read (the cluster side reports and checks it).
    pub fn table(&self) -> Arc<ModelTable> {
        self.dispatch.table.clone()
    }

    /// Stops the actor tree and unloads every model (after the servers drained): an instance
    /// goes once the last request holding it is answered, and its `finalize()` runs. Waits for
    /// them until `deadline` (and for their last log lines); a stub still running then is killed,
    /// and the log names its model.
    pub async fn stop(self, deadline: Instant) {
        let left = deadline.saturating_duration_since(Instant::now());
        let actors = left.clamp(Duration::from_millis(100), Duration::from_secs(5));
        let _ = self.supervisor.stop_and_wait(None, Some(actors)).await;
        self.dispatch.table.clear();
        let running = self.stubs.count();
        if running > 0 {
            tracing::info!(instances = running, "waiting for the Python models' finalize()");
        }
        if !self.stubs.wait_gone(deadline).await {
            for stub in self.stubs.kill_all() {
                tracing::error!(
                    model = %stub.model,
                    instance = %stub.label,
                    "model '{}' did not finish within --exit-timeout-secs (finalize() or requests still \
                     running); its stub was killed",
                    stub.model
                );
            }
            // Their instances' threads reap them and log what they wrote last.
            let _ = self.stubs.wait_gone(Instant::now() + Duration::from_secs(2)).await;
        }
        crate::backend::python::stub::node_stopped();
    }
}
