//! Statistics through the router: each node's statistics of a model, asked over its link and summed
//! per version; router ensembles add their own.
use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh::cluster::call::{self, Peer};
use mesh::proto::ModelStatisticsResponse;
use mesh::Result;

use super::RouterDispatch;
use crate::shared::Link;

/// How long a node has to answer a statistics query.
const STATS_WAIT: Duration = Duration::from_secs(5);

impl RouterDispatch {
    pub(super) async fn statistics(&self, name: &str, version: &str) -> Result<ModelStatisticsResponse> {
        if let Some(e) = self.ensembles.get(name) {
            self.ensembles.view(e, true, version)?;
            return Ok(ModelStatisticsResponse {
                model_stats: vec![self.ensembles.statistics(e)],
            });
        }
        let links: Vec<Arc<Link>> = if name.is_empty() {
            self.view.links.all()
        } else {
            self.cluster_view(name, version)?;
            let nodes = self.view.membership().nodes(Instant::now());
            nodes
                .iter()
                .filter(|n| n.models.iter().any(|m| m.name == name))
                .filter_map(|n| n.link.and_then(|l| self.view.link(l)))
                .collect()
        };
        let asks = links.iter().map(|link| async move {
            let peer_name = format!("node '{}'", link.name);
            let peer = Peer {
                conn: &link.conn,
                name: &peer_name,
                out: None,
            };
            let answer = tokio::time::timeout(STATS_WAIT, call::stats(peer, name, version, &link.limits)).await;
            match answer {
                Ok(Ok(s)) => Some(s),
                Ok(Err(e)) => {
                    tracing::debug!(node = %link.name, "statistics query failed: {e}");
                    None
                }
                Err(_) => None,
            }
        });
        let answers = futures::future::join_all(asks).await.into_iter().flatten();
        let mut merged = crate::stats::merge(answers);
        if name.is_empty() {
            for n in self.ensembles.names() {
                if let Some(e) = self.ensembles.get(n) {
                    merged.model_stats.push(self.ensembles.statistics(e));
                }
            }
        }
        Ok(merged)
    }
}
