//! Model control through the router: load and unload go to placement, for models of the router's
//! cluster repository only.
use mesh::{Error, Result};

use super::RouterDispatch;

/// A model the router does not place: control it on the nodes whose repositories hold it.
fn model_control(name: &str, what: &str) -> Error {
    Error::unsupported(format!(
        "cannot {what} '{name}' through mesh-router: it is not a model of the router's cluster repository \
         (--model-repository); {what} it on the nodes that serve it from their own repositories, and the \
         router follows"
    ))
}

impl RouterDispatch {
    /// Whether the cluster repository holds a directory for `name` (read off the async runtime).
    async fn in_repository(&self, name: &str) -> bool {
        let (roots, name) = (self.placement.repo.roots.clone(), name.to_string());
        tokio::task::spawn_blocking(move || crate::repository::scan(&roots).0.contains_key(&name))
            .await
            .unwrap_or(false)
    }

    /// Places a model of the cluster repository (with its config and `file:` overrides); answers
    /// once a replica is ready.
    pub(super) async fn load(&self, name: &str, options: mesh::LoadOptions) -> Result<()> {
        self.placement.mode.check_explicit("load", name)?;
        mesh::repository::check_model_name(name)?;
        if self.placement.repo.roots.is_empty() || self.ensembles.get(name).is_some() {
            return Err(model_control(name, "load"));
        }
        self.placement
            .load(name, options, self.view.route.request_timeout)
            .await
    }

    /// Removes a placed model from every node; answers once none holds it.
    pub(super) async fn unload(&self, name: &str) -> Result<()> {
        self.placement.mode.check_explicit("unload", name)?;
        mesh::repository::check_model_name(name)?;
        if !self.placement.repo.contains(name) && !self.in_repository(name).await {
            return Err(model_control(name, "unload"));
        }
        self.placement.unload(name, self.view.route.request_timeout).await
    }
}
