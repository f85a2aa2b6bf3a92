//! Models a router places on this node: their files come from the shipment cache, or from the
//! router when the cache lacks that key; they load through the node's own load path, and are
//! unloaded when the router evicts them. The node's own repository models are never touched.
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use mesh::cluster::msg::{Place, Placed};
use mesh::cluster::ship::{self, Cache};
use mesh::cluster::Limits;
use mesh::Dispatch;
use quinn::Connection;
use tokio::sync::mpsc;

use crate::repository::placed::{PlacedDir, PlacedModels};
use crate::repository::scan;
use crate::serving::dispatch::NodeDispatch;

/// What placing models needs.
pub struct Placing {
    pub cache: Cache,
    /// Bytes of files one model may ship (the memory the node offers).
    pub max_model_bytes: u64,
    pub dispatch: Arc<NodeDispatch>,
    pub placed: Arc<PlacedModels>,
    /// The node's own repositories, whose models the router may not place over.
    pub roots: Vec<PathBuf>,
    pub limits: Limits,
    /// The highest placement epoch seen from any router (commands of lower ones are refused).
    pub fencing: mesh::cluster::fence::Fencing,
}

/// A router's command about one model.
pub enum Command {
    Place(Place),
    Evict(String),
}

/// Runs each model's commands one at a time, in the order the router sent them (a model's
/// eviction waits for its placement to end); models do not wait for each other.
pub struct Queues {
    placing: Arc<Placing>,
    conn: Connection,
    done: mpsc::UnboundedSender<Placed>,
    queues: HashMap<String, mpsc::UnboundedSender<Command>>,
}

impl Queues {
    /// Answers of placements go to `done`.
    pub fn new(placing: Arc<Placing>, conn: Connection, done: mpsc::UnboundedSender<Placed>) -> Self {
        Queues {
            placing,
            conn,
            done,
            queues: HashMap::new(),
        }
    }

    pub fn submit(&mut self, model: &str, command: Command) {
        let queue = self.queues.entry(model.to_string()).or_insert_with(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            let (placing, conn, done) = (self.placing.clone(), self.conn.clone(), self.done.clone());
            tokio::spawn(run_queue(placing, conn, rx, done));
            tx
        });
        let _ = queue.send(command);
    }
}

/// One model's queue; it ends with the session (its `Queues` dropped).
async fn run_queue(
    placing: Arc<Placing>,
    conn: Connection,
    mut rx: mpsc::UnboundedReceiver<Command>,
    done: mpsc::UnboundedSender<Placed>,
) {
    while let Some(command) = rx.recv().await {
        match command {
            Command::Place(p) => {
                let _ = done.send(placing.place(&conn, p).await);
            }
            Command::Evict(model) => placing.evict(&model).await,
        }
    }
}

impl Placing {
    /// Places one model: files, then load; the answer says how it ended.
    pub async fn place(&self, conn: &Connection, p: Place) -> Placed {
        let total: u64 = p.files.iter().map(|f| f.size).sum();
        let result = self.try_place(conn, &p).await;
        match &result {
            Ok(()) => tracing::info!(model = %p.model, key = %short(&p.key), "placed by the router: ready"),
            Err(why) => tracing::error!(model = %p.model, "placed by the router, but not served: {why}"),
        }
        Placed {
            footprint: if result.is_ok() {
                total.saturating_mul(self.instances(&p.model))
            } else {
                0
            },
            error: result.err().unwrap_or_default(),
            model: p.model,
            key: p.key,
        }
    }

    async fn try_place(&self, conn: &Connection, p: &Place) -> Result<(), String> {
        let (own, _) = scan(&self.roots);
        if own.iter().any(|d| d.name == p.model) {
            return Err(format!(
                "model '{}' is served from this node's own repository (--model-repository); the router \
                 does not place over it",
                p.model
            ));
        }
        let dir = if self.cache.has(&p.key, &p.model) {
            tracing::info!(model = %p.model, key = %short(&p.key), "files already in the cache");
            self.cache.dir(&p.key, &p.model)
        } else {
            let files = p.files.clone();
            let bytes: u64 = files.iter().map(|f| f.size).sum();
            let began = std::time::Instant::now();
            let dir = ship::fetch(
                conn,
                &self.cache,
                &p.model,
                &p.key,
                files,
                self.max_model_bytes,
                &self.limits,
            )
            .await?;
            tracing::info!(
                model = %p.model,
                bytes,
                ms = began.elapsed().as_millis() as u64,
                "files received from the router"
            );
            dir
        };
        let config = (!p.config.is_empty()).then(|| p.config.clone());
        let before = self.placed.get(&p.model);
        self.placed.set(&p.model, PlacedDir { path: dir, config });
        if let Err(e) = self.dispatch.load_placed(&p.model).await {
            match before {
                // A failed reload keeps the versions already serving, as a repository load does.
                Some(previous) if self.dispatch.table.is_ready(&p.model) => self.placed.set(&p.model, previous),
                // Nothing of it serves: forget it, so a later placement starts clean.
                _ => {
                    self.placed.remove(&p.model);
                    let _ = self.dispatch.unload_placed(&p.model).await;
                }
            }
            return Err(e.message);
        }
        Ok(())
    }

    /// Instances of a served model (at least 1), from its final config.
    fn instances(&self, model: &str) -> u64 {
        let Ok(view) = self.dispatch.model(model, "") else {
            return 1;
        };
        mesh::config::instance_count(&view.config)
    }

    /// Unloads a model the router placed here; a model of the node's own repository stays.
    pub async fn evict(&self, model: &str) {
        if !self.placed.remove(model) {
            tracing::warn!(model = %model, "the router asked to evict a model it did not place here; ignored");
            return;
        }
        match self.dispatch.unload_placed(model).await {
            Ok(()) => tracing::info!(model = %model, "evicted by the router"),
            Err(e) => tracing::warn!(model = %model, "evicting: {}", e.message),
        }
    }
}

/// The first 12 hex digits of a key, for logs.
fn short(key: &str) -> &str {
    key.char_indices().nth(12).map_or(key, |(at, _)| &key[..at])
}

#[cfg(test)]
mod tests {
    #[test]
    fn short_keys_never_split_a_character() {
        assert_eq!(super::short("0123456789abcdef"), "0123456789ab");
        assert_eq!(super::short("abc"), "abc");
        assert_eq!(super::short("ééééééééééééé"), "éééééééééééé");
    }
}
