//! The running node: its Dispatch and the root of its actor tree, started and stopped together.
use mesh::sync::ReadWrite;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorRef};

use crate::actors::manager::loader::Repositories;
use crate::actors::manager::{ManagerLink, ManagerMsg};
use crate::actors::node::{NodeSupervisor, SupervisorArgs};
use crate::actors::table::ModelTable;
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
}

impl Node {
    /// Starts the actor tree: NodeSupervisor → RepositoryManager → ModelActor → InstanceActor.
    pub async fn start(repos: Repositories, options: NodeOptions) -> Result<Node, String> {
        let table = Arc::new(ModelTable::new(repos.loading.namespacing));
        let manager = Arc::new(ManagerLink::default());
        let dispatch = Arc::new(NodeDispatch::new(&options, &repos, table.clone(), manager.clone()));
        let bls = Arc::new(BlsDispatch::new(dispatch.clone()));
        let placed = repos.placed.clone();
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

    /// Stops the actor tree and drops every model (after the servers drained).
    pub async fn stop(self) {
        let _ = self.supervisor.stop_and_wait(None, Some(Duration::from_secs(5))).await;
        self.dispatch.table.clear();
        crate::backend::python::stub::node_stopped();
    }
}
