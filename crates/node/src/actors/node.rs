//! NodeSupervisor: the root of the node's actor tree; it runs the RepositoryManager and restarts it if it dies.
use mesh::sync::ReadWrite;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};

use crate::actors::manager::loader::Repositories;
use crate::actors::manager::{ManagerArgs, ManagerLink, ManagerMsg, RepositoryManager};
use crate::actors::table::ModelTable;

pub(crate) struct NodeSupervisor;

pub(crate) struct SupervisorArgs {
    pub(crate) repos: Arc<Repositories>,
    pub(crate) table: Arc<ModelTable>,
    pub(crate) manager: Arc<ManagerLink>,
    pub(crate) poll_every: Option<Duration>,
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
        *self.manager.writing() = Some(manager.clone());
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
            *state.manager.writing() = None;
            let manager = state.spawn_manager(&myself).await?;
            let _ = manager.cast(ManagerMsg::Recover);
        }
        Ok(())
    }
}
