//! NodeSupervisor: the root of the node's actor tree; it runs the RepositoryManager and restarts it if it dies.
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};

use crate::cli::ControlMode;
use crate::dispatch::{ManagerLink, NodeDispatch, NodeOptions, Repositories};
use crate::manager::{ManagerArgs, ManagerMsg, RepositoryManager};
use crate::table::ModelTable;

/// The running node: its Dispatch and the root of its actor tree.
pub struct Node {
    pub dispatch: Arc<NodeDispatch>,
    supervisor: ActorRef<()>,
    manager: Arc<ManagerLink>,
}

struct NodeSupervisor;

struct SupervisorArgs {
    repos: Arc<Repositories>,
    table: Arc<ModelTable>,
    manager: Arc<ManagerLink>,
    poll_every: Option<Duration>,
}

impl SupervisorArgs {
    /// Starts a RepositoryManager under `supervisor` and makes it the one Dispatch talks to.
    async fn spawn_manager(&self, supervisor: &ActorRef<()>) -> Result<ActorRef<ManagerMsg>, ActorProcessingErr> {
        let args = ManagerArgs {
            repos: self.repos.clone(),
            table: self.table.clone(),
            poll_every: self.poll_every,
        };
        let (manager, _) = Actor::spawn_linked(None, RepositoryManager, args, supervisor.get_cell()).await?;
        *self.manager.write().unwrap_or_else(|p| p.into_inner()) = Some(manager.clone());
        Ok(manager)
    }
}

impl Actor for NodeSupervisor {
    type Msg = ();
    type State = SupervisorArgs;
    type Arguments = SupervisorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<()>,
        args: SupervisorArgs,
    ) -> Result<SupervisorArgs, ActorProcessingErr> {
        args.spawn_manager(&myself).await?;
        Ok(args)
    }

    async fn handle(&self, _: ActorRef<()>, _: (), _: &mut SupervisorArgs) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<()>,
        event: SupervisionEvent,
        state: &mut SupervisorArgs,
    ) -> Result<(), ActorProcessingErr> {
        if let SupervisionEvent::ActorFailed(_, err) = event {
            tracing::error!("repository manager failed: {err}; restarting it");
            *state.manager.write().unwrap_or_else(|p| p.into_inner()) = None;
            let manager = state.spawn_manager(&myself).await?;
            let _ = manager.cast(ManagerMsg::Recover);
        }
        Ok(())
    }
}

impl Node {
    /// Starts the actor tree: NodeSupervisor → RepositoryManager → ModelActor → InstanceActor.
    pub async fn start(repos: Repositories, options: NodeOptions) -> Result<Node, String> {
        let table = Arc::new(ModelTable::default());
        let manager = Arc::new(ManagerLink::default());
        let dispatch = Arc::new(NodeDispatch::new(&options, &repos, table.clone(), manager.clone()));
        let seam: Arc<dyn mesh::Dispatch> = dispatch.clone();
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
        Ok(Node {
            dispatch,
            supervisor,
            manager,
        })
    }

    /// Loads the models the control mode asks for; returns how many failed.
    pub async fn load_at_start(&self, explicit: &[String]) -> usize {
        let manager = self.manager.read().unwrap_or_else(|p| p.into_inner()).clone();
        let Some(manager) = manager else { return 0 };
        let explicit = explicit.to_vec();
        crate::model::ask(&manager, "repository manager", |reply| {
            ManagerMsg::LoadAtStart(explicit, reply)
        })
        .await
        .unwrap_or(0)
    }

    /// Stops the actor tree and drops every model (after the servers drained).
    pub async fn stop(self) {
        let _ = self.supervisor.stop_and_wait(None, Some(Duration::from_secs(5))).await;
        self.dispatch.table.clear();
        crate::backend::python::stub::remove_runtime_dir();
    }
}
