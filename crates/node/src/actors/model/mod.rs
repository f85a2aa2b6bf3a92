//! ModelActor: supervises one loaded model version's instances (restarts with backoff, respawns,
//! in-place instance changes) and publishes the routing snapshot that requests read without a hop.
pub mod source;
pub mod warmup;

use mesh::sync::ReadWrite;
use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use mesh::config::ModelConfig;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::sync::oneshot;

use crate::actors::ask;
use crate::actors::instance::batching::BatchConfig;
use crate::actors::instance::rate_limit::Enrolled;
use crate::actors::instance::supervision::{self, BackendFactory, RestartPolicy};
use crate::actors::instance::{self, FailureNotice, InstanceHandle, InstanceSpec};
use crate::backend::onnx::Device;
use crate::backend::Backend;
use crate::placement::InstancePlacement;
use crate::serving::sequence::{SequenceSetup, Sequences};
use crate::telemetry::stats::ModelStats;
use source::VersionSource;

/// A servable model version as requests see it: replaced whole when its instances change.
pub struct LoadedVersion {
    pub config: Arc<ModelConfig>,
    pub version: i64,
    pub version_label: String,
    pub instances: Vec<Arc<InstanceHandle>>,
    /// Rotates the starting point of instance selection so ties spread.
    pub rotation: AtomicUsize,
    pub stats: Arc<ModelStats>,
    /// Set for ensembles, which have no instances: requests run through the plan's steps.
    pub ensemble: Option<Arc<mesh::ensemble::Plan>>,
    /// The outputs' class labels (`label_filename`), for the classification extension.
    pub labels: Arc<mesh::classify::Labels>,
    /// The active sequences of a model with `sequence_batching` (kept across snapshots).
    pub sequences: Option<Arc<std::sync::Mutex<Sequences>>>,
}

impl LoadedVersion {
    /// The ready instance with the least outstanding work.
    pub fn pick(&self) -> Option<&InstanceHandle> {
        instance::pick(&self.instances, &self.rotation)
    }

    /// Whether any instance can take work (an ensemble is ready once planned).
    pub fn is_ready(&self) -> bool {
        self.ensemble.is_some() || self.instances.iter().any(|i| i.is_ready())
    }
}

/// Where a ModelActor publishes its current snapshot.
type Slot = RwLock<Arc<LoadedVersion>>;

/// The node's reference to a running ModelActor; dropping it stops the actor (its instances
/// finish what they hold).
pub struct ModelHandle {
    slot: Arc<Slot>,
    /// None for ensembles: nothing of theirs runs, so nothing needs supervising.
    actor: Option<ActorRef<ModelMsg>>,
}

impl ModelHandle {
    /// The current snapshot (one uncontended read lock).
    pub fn snapshot(&self) -> Arc<LoadedVersion> {
        self.slot.reading().clone()
    }

    /// Changes the instances in place: keeps those whose name and device stay, starts (and warms
    /// up) new ones, and lets removed ones finish their work.
    pub async fn resize(&self, config: Arc<ModelConfig>, placements: Vec<InstancePlacement>) -> Result<(), String> {
        let actor = self.actor.as_ref().ok_or("ensembles take no instance_group")?;
        ask(actor, "model supervisor", |reply| {
            ModelMsg::Resize(config, placements, reply)
        })
        .await?
    }

    pub fn actor_id(&self) -> Option<ractor::ActorId> {
        self.actor.as_ref().map(|a| a.get_id())
    }

    /// An ensemble version: a fixed snapshot with its plan and statistics.
    pub fn ensemble(
        config: Arc<ModelConfig>,
        version: i64,
        plan: Arc<mesh::ensemble::Plan>,
        labels: Arc<mesh::classify::Labels>,
    ) -> Arc<Self> {
        let version_label = version.to_string();
        let loaded = LoadedVersion {
            stats: Arc::new(ModelStats::new(
                &config.name,
                version,
                crate::serving::cache::enabled(&config),
            )),
            config,
            version,
            version_label,
            instances: Vec::new(),
            rotation: AtomicUsize::new(0),
            ensemble: Some(plan),
            labels,
            sequences: None,
        };
        Arc::new(ModelHandle {
            slot: Arc::new(RwLock::new(Arc::new(loaded))),
            actor: None,
        })
    }
}

impl Drop for ModelHandle {
    fn drop(&mut self) {
        if let Some(actor) = &self.actor {
            actor.stop(None);
        }
    }
}

pub enum ModelMsg {
    /// An instance's backend failed; rebuild it after the policy's delay.
    InstanceFailed(String),
    Rebuild(String),
    Rebuilt(String, Result<Box<dyn Backend>, String>),
    Resize(
        Arc<ModelConfig>,
        Vec<InstancePlacement>,
        RpcReplyPort<Result<(), String>>,
    ),
}

/// What a ModelActor starts from: the first instances' backends are already open.
pub struct ModelArgs {
    pub source: VersionSource,
    pub config: Arc<ModelConfig>,
    pub placements: Vec<(InstancePlacement, Option<Box<dyn crate::backend::Backend>>)>,
    ready: oneshot::Sender<Arc<Slot>>,
}

pub struct ModelActor;

pub struct Supervised {
    source: VersionSource,
    slot: Arc<Slot>,
    devices: HashMap<String, Device>,
    policies: HashMap<String, RestartPolicy>,
}

/// Starts a ModelActor under `supervisor`; it answers once every instance runs and warmup passed.
pub async fn start(
    source: VersionSource,
    config: Arc<ModelConfig>,
    placements: Vec<(InstancePlacement, Option<Box<dyn crate::backend::Backend>>)>,
    supervisor: ActorCell,
) -> Result<Arc<ModelHandle>, String> {
    let (ready, slot) = oneshot::channel();
    let name = format!("{} v{}", source.model, source.version);
    let args = ModelArgs {
        source,
        config,
        placements,
        ready,
    };
    let (actor, _) = Actor::spawn_linked(None, ModelActor, args, supervisor)
        .await
        .map_err(|e| match e {
            ractor::SpawnErr::StartupFailed(inner) => inner.to_string(),
            other => format!("cannot start the supervisor of {name}: {other}"),
        })?;
    let slot = slot
        .await
        .map_err(|_| format!("the supervisor of {name} stopped while starting"))?;
    Ok(Arc::new(ModelHandle {
        slot,
        actor: Some(actor),
    }))
}

fn label(source: &VersionSource, p: &InstancePlacement) -> String {
    format!("{}_v{}", p.name, source.version)
}

/// Tells this ModelActor when an instance's backend fails.
fn failure_notice(me: &ActorRef<ModelMsg>, label: &str) -> FailureNotice {
    let (me, label) = (me.clone(), label.to_string());
    Arc::new(move || {
        let _ = me.cast(ModelMsg::InstanceFailed(label.clone()));
    })
}

/// Enrols an instance with the node's rate limiter, as its group's `rate_limiter` asks.
fn enrol(source: &VersionSource, config: &ModelConfig, p: &InstancePlacement) -> Result<Option<Arc<Enrolled>>, String> {
    let limits = config.instance_group.get(p.group).and_then(|g| g.rate_limiter.as_ref());
    let device = match p.device {
        Device::Cpu => 0,
        Device::Gpu(i) => i,
    };
    source.limiter.join(device, limits)
}

/// Triton's test hook `TRITONSERVER_DELAY_SCHEDULER` (a count of queued requests before the first
/// batch; see `batching`), read once; its qa suites set it to check how batches form.
fn scheduler_delay_hook() -> usize {
    static HOLD: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *HOLD.get_or_init(|| {
        let hold = std::env::var("TRITONSERVER_DELAY_SCHEDULER")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        if hold > 0 {
            tracing::warn!(
                hold,
                "TRITONSERVER_DELAY_SCHEDULER is set (a test hook): each dynamic batcher forms no batch until that many requests are queued on it"
            );
        }
        hold
    })
}

/// Starts one instance linked to the ModelActor.
async fn spawn_instance(
    me: &ActorRef<ModelMsg>,
    source: &VersionSource,
    config: &Arc<ModelConfig>,
    label: String,
    factory: BackendFactory,
    limit: Option<Arc<Enrolled>>,
) -> Result<Arc<InstanceHandle>, String> {
    let spec = InstanceSpec {
        ragged: instance::ragged::Ragged::from_config(config)?,
        limit,
        on_failure: failure_notice(me, &label),
        label,
        model: source.model.clone(),
        version: source.version,
        batch: BatchConfig::from_model_config(config).with_hold(config, scheduler_delay_hook()),
        factory,
        #[cfg(feature = "fault-injection")]
        panic_actor_on_rows: config
            .parameters
            .get("mesh_fault_panic_actor_on_rows")
            .and_then(|p| p.string_value.parse().ok()),
    };
    tracing::debug!(instance = %spec.label, "instance starting");
    Ok(Arc::new(InstanceHandle::spawn(spec, Some(me.get_cell())).await?))
}

impl Supervised {
    fn current(&self) -> Arc<LoadedVersion> {
        self.slot.reading().clone()
    }

    fn publish(&self, config: Arc<ModelConfig>, instances: Vec<Arc<InstanceHandle>>) {
        let old = self.current();
        let next = Arc::new(LoadedVersion {
            config,
            version: old.version,
            version_label: old.version_label.clone(),
            instances,
            rotation: AtomicUsize::new(0),
            stats: old.stats.clone(),
            ensemble: None,
            labels: old.labels.clone(),
            sequences: old.sequences.clone(),
        });
        *self.slot.writing() = next;
    }

    /// Carries out an in-place instance change; the old snapshot stays if anything fails.
    async fn resize(
        &mut self,
        me: &ActorRef<ModelMsg>,
        config: Arc<ModelConfig>,
        placements: Vec<InstancePlacement>,
    ) -> Result<(), String> {
        let current = self.current();
        let mut instances = Vec::with_capacity(placements.len());
        let mut fresh = Vec::new();
        let mut devices = HashMap::new();
        for p in &placements {
            let label = label(&self.source, p);
            let kept = current
                .instances
                .iter()
                .find(|i| i.label == label && self.devices.get(&label) == Some(&p.device));
            let inst = match kept {
                Some(i) => i.clone(),
                None => {
                    let factory = self.source.factory(&config, &label, p, None);
                    let limit = enrol(&self.source, &config, p)?;
                    let i = spawn_instance(me, &self.source, &config, label.clone(), factory, limit).await?;
                    fresh.push(i.clone());
                    i
                }
            };
            devices.insert(label, p.device);
            instances.push(inst);
        }
        warmup::run(&config, &self.source.dir, &fresh).await?;
        let (added, removed) = (fresh.len(), current.instances.len() + fresh.len() - instances.len());
        tracing::info!(
            model = %self.source.model, version = self.source.version, instances = instances.len(), added, removed,
            "instances changed in place"
        );
        self.policies.retain(|l, _| devices.contains_key(l));
        self.devices = devices;
        self.publish(config, instances);
        Ok(())
    }
}

impl Actor for ModelActor {
    type Msg = ModelMsg;
    type State = Supervised;
    type Arguments = ModelArgs;

    async fn pre_start(&self, myself: ActorRef<ModelMsg>, args: ModelArgs) -> Result<Supervised, ActorProcessingErr> {
        let ModelArgs {
            source,
            config,
            placements,
            ready,
        } = args;
        let labels = mesh::classify::Labels::load(&source.dir, &config)
            .map_err(|e| format!("version {}: {}", source.version, e.message))?;
        let sequences = SequenceSetup::from_config(&config, &source.dir)
            .map_err(|e| format!("version {}: {e}", source.version))?
            .map(|setup| Arc::new(std::sync::Mutex::new(Sequences::new(Arc::new(setup)))));
        let mut instances = Vec::with_capacity(placements.len());
        let mut devices = HashMap::new();
        for (p, first) in placements {
            let label = label(&source, &p);
            let factory = source.factory(&config, &label, &p, first);
            let limit = enrol(&source, &config, &p)?;
            instances.push(spawn_instance(&myself, &source, &config, label.clone(), factory, limit).await?);
            devices.insert(label, p.device);
        }
        let v = source.version;
        warmup::run(&config, &source.dir, &instances)
            .await
            .map_err(|e| format!("version {v}: {e}"))?;
        let caches = crate::serving::cache::enabled(&config);
        let slot = Arc::new(RwLock::new(Arc::new(LoadedVersion {
            config,
            version: v,
            version_label: v.to_string(),
            instances,
            rotation: AtomicUsize::new(0),
            stats: Arc::new(ModelStats::new(&source.model, v, caches)),
            ensemble: None,
            labels: Arc::new(labels),
            sequences,
        })));
        let _ = ready.send(slot.clone());
        Ok(Supervised {
            source,
            slot,
            devices,
            policies: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<ModelMsg>,
        msg: ModelMsg,
        state: &mut Supervised,
    ) -> Result<(), ActorProcessingErr> {
        let now = Instant::now();
        match msg {
            ModelMsg::InstanceFailed(label) => {
                let delay = state
                    .policies
                    .entry(label.clone())
                    .or_insert_with(RestartPolicy::standard)
                    .on_failure(now);
                tracing::warn!(instance = %label, delay_ms = delay.as_millis() as u64, "instance failed; restarting");
                myself.send_after(delay, move || ModelMsg::Rebuild(label));
            }
            ModelMsg::Rebuild(label) => {
                let current = state.current();
                let Some(inst) = current.instances.iter().find(|i| i.label == label) else {
                    return Ok(());
                };
                let factory = inst.factory.clone();
                let me = myself.clone();
                tokio::task::spawn_blocking(move || {
                    let built = supervision::build(&factory);
                    let _ = me.cast(ModelMsg::Rebuilt(label, built));
                });
            }
            ModelMsg::Rebuilt(label, built) => {
                let current = state.current();
                let Some(inst) = current.instances.iter().find(|i| i.label == label) else {
                    return Ok(());
                };
                match built {
                    Ok(backend) => {
                        inst.install(backend);
                        if let Some(p) = state.policies.get_mut(&label) {
                            p.on_restarted(now);
                        }
                        tracing::info!(instance = %label, "instance restarted");
                    }
                    Err(e) => {
                        tracing::error!(instance = %label, "restart failed: {e}");
                        let _ = myself.cast(ModelMsg::InstanceFailed(label));
                    }
                }
            }
            ModelMsg::Resize(config, placements, reply) => {
                let result = state.resize(&myself, config, placements).await;
                let _ = reply.send(result);
            }
        }
        Ok(())
    }

    /// An instance actor that died (a bug in its own code, not the backend's) is started again.
    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<ModelMsg>,
        event: SupervisionEvent,
        state: &mut Supervised,
    ) -> Result<(), ActorProcessingErr> {
        let SupervisionEvent::ActorFailed(cell, err) = event else {
            return Ok(());
        };
        let current = state.current();
        let Some(pos) = current.instances.iter().position(|i| i.actor_id() == cell.get_id()) else {
            return Ok(());
        };
        let dead = &current.instances[pos];
        dead.take_out_of_routing();
        tracing::error!(instance = %dead.label, "instance actor failed: {err}; starting it again");
        let (label, factory, limit) = (dead.label.clone(), dead.factory.clone(), dead.rate_limit());
        let config = current.config.clone();
        match spawn_instance(&myself, &state.source, &config, label.clone(), factory, limit).await {
            Ok(fresh) => {
                let mut instances = current.instances.clone();
                instances[pos] = fresh;
                state.publish(config, instances);
                tracing::info!(instance = %label, "instance actor started again");
            }
            Err(e) => tracing::error!(instance = %label, "cannot start the instance again: {e}"),
        }
        Ok(())
    }

    async fn post_stop(&self, myself: ActorRef<ModelMsg>, state: &mut Supervised) -> Result<(), ActorProcessingErr> {
        // Instances outlive their supervisor until the last request holding them is answered.
        for i in &state.current().instances {
            i.detach_from(&myself.get_cell());
        }
        Ok(())
    }
}
