//! The node inside a Rust program: started from `mesh-node`'s own flags on the caller's tokio
//! runtime, its models called directly through the node's `Dispatch` (no port, no copy of a
//! request's tensors: `Tensor` data is shared `Bytes`, or the caller's own slices with
//! `infer_borrowed`), its ports opened only when asked, stopped cleanly. `mesh-node` itself is
//! this plus signal handling.
#![warn(missing_docs)]
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::watch;

use mesh::stream::{stream_channel, StreamReceiver, Window};
use mesh::{Dispatch, InferRequest, InferResponse, LoadOptions, NamedTensor};

use crate::actors::instance::rate_limit::Limiter;
use crate::actors::manager::loader::{LoadSettings, Repositories};
use crate::backend::ort_env;
use crate::backend::python::live::LiveStubs;
use crate::backend::python::{PythonContext, PythonSettings};
use crate::cli::Args;
use crate::cluster::{ClusterNode, Settings as ClusterSettings};
use crate::node::Node;
use crate::serving::admit::Replies;
use crate::serving::cache::CacheConfig;
use crate::serving::dispatch::{NodeDispatch, NodeOptions};
use crate::telemetry::metrics;
use crate::{placement, repository};

/// A running node. Dropping it without [`Server::stop`] leaves its actors to the runtime's end.
pub struct Server {
    args: Args,
    runtime: tokio::runtime::Handle,
    node: Node,
    prometheus: PrometheusHandle,
    gpu_uuids: Vec<String>,
    cluster: Option<ClusterNode>,
    ports: Option<(watch::Sender<bool>, Vec<tokio::task::JoinHandle<()>>)>,
}

/// The process's metrics recorder: one per process, installed by the first server (its
/// `--metrics-config` wins). Servers started at once on several threads wait for one another here,
/// so only one of them installs it.
fn recorder(config: &[String]) -> Result<PrometheusHandle, String> {
    static HANDLE: Mutex<Option<PrometheusHandle>> = Mutex::new(None);
    let mut installed = HANDLE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(h) = installed.as_ref() {
        return Ok(h.clone());
    }
    let handle = metrics::install(metrics::MetricsConfig::parse(config)?)?;
    *installed = Some(handle.clone());
    Ok(handle)
}

/// The metrics text: Triton's metrics, then the custom ones Python models define.
fn render_metrics(prometheus: &PrometheusHandle) -> String {
    let mut text = prometheus.render();
    text.push_str(&crate::telemetry::custom::CUSTOM.render());
    text
}

impl Server {
    /// Starts a node from `mesh-node`'s flags (without the program name), e.g.
    /// `["--model-repository", "/models", "--model-control-mode", "explicit"]`, and loads what the
    /// control mode loads at start. Needs a multi-threaded tokio runtime. A bad flag, a repository
    /// that cannot be read or (with `--exit-on-error=true`) a model that fails to load is an error.
    pub async fn start<I, S>(flags: I) -> Result<Server, String>
    where
        I: IntoIterator<Item = S>,
        S: Into<std::ffi::OsString> + Clone,
    {
        Server::from_args(Args::parse_flags(flags)?).await
    }

    /// Starts a node from parsed flags (what `mesh-node` does before it opens its ports).
    pub async fn from_args(args: Args) -> Result<Server, String> {
        match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => {}
            _ => {
                return Err("a node needs a multi-threaded tokio runtime (its executors block on their models)".into())
            }
        }
        repository::check_repositories(&args.model_repository)?;
        let prometheus = recorder(&args.triton.metrics_config)?;
        let env = ort_env::Ort::load(args.backend_setting("onnxruntime", "library"))?;
        let discovery = placement::discover_gpus();
        tracing::info!("{}", discovery.note);
        let used = placement::restrict(&discovery.gpus, args.gpus.as_deref())?;
        let gpu_uuids: Vec<String> = used.iter().map(|g| g.uuid.clone()).collect();
        let repos = Repositories {
            env,
            roots: args.model_repository.clone(),
            gpus: used.iter().map(|g| g.index).collect(),
            gpu_uuids: gpu_uuids.clone(),
            mode: args.control.model_control_mode,
            python: Arc::new(PythonContext {
                settings: PythonSettings::from_backend_config(&args.backend_settings("python"))?,
                dispatch: Default::default(),
                runtime: tokio::runtime::Handle::current(),
                live: Arc::new(LiveStubs::new(Duration::from_secs(args.exit_timeout_secs))),
            }),
            placed: Default::default(),
            loading: LoadSettings::from_flags(&args.triton)?,
            limiter: Limiter::from_flags(args.triton.rate_limit.as_deref(), &args.triton.rate_limit_resource)?,
        };
        // Triton's rule and words: the old flag and the new one are one or the other.
        if args.triton.response_cache_byte_size.is_some() && !args.cache_config.is_empty() {
            return Err(
                "Error: Incompatible flags --response-cache-byte-size and --cache-config both provided. \
                 Please provide one or the other."
                    .into(),
            );
        }
        let caches: Vec<String> = args
            .triton
            .cache_config()
            .into_iter()
            .chain(args.cache_config.iter().cloned())
            .collect();
        let options = NodeOptions {
            strict_readiness: args.strict_readiness,
            poll_secs: args.control.repository_poll_secs,
            max_inflight_bytes: args.max_inflight_bytes,
            inflight_reserve_bytes: args.inflight_reserve_bytes,
            cache: CacheConfig::parse(&caches)?,
        };
        let cluster = ClusterSettings::from_args(&args, &repos.gpus)?;
        let node = Node::start(repos, options).await?;
        let failed = node.load_at_start(&args.control.load_model).await;
        if failed > 0 && args.exit_on_error {
            node.stop(Instant::now() + Duration::from_secs(args.exit_timeout_secs))
                .await;
            return Err(format!("{failed} model(s) failed to load and --exit-on-error is true"));
        }
        let cluster = match cluster {
            Some((settings, transport)) => {
                let joined = ClusterNode::start(settings, &node, transport)?;
                node.bls.set_remote(joined.remote());
                Some(joined)
            }
            None => None,
        };
        Ok(Server {
            args,
            runtime: tokio::runtime::Handle::current(),
            node,
            prometheus,
            gpu_uuids,
            cluster,
            ports: None,
        })
    }

    /// Opens the HTTP, gRPC and metrics ports the flags name (as `mesh-node` does), and starts the
    /// CPU and GPU metric samplers they allow; the calls keep working beside them.
    pub async fn serve_ports(&mut self) -> Result<(), String> {
        if self.ports.is_some() {
            return Err("the ports are open already".into());
        }
        let (stop_tx, stop_rx) = watch::channel(false);
        let prometheus = self.prometheus.clone();
        let render: mesh::serve::RenderMetrics = Arc::new(move || render_metrics(&prometheus));
        let servers = self
            .args
            .listen
            .start(self.node.dispatch.clone(), None, render, &stop_rx)
            .await?;
        let (args, listen) = (&self.args.triton, &self.args.listen);
        let interval = metrics::sample_interval(args.metrics_interval_ms)?;
        if listen.allow_metrics && args.allow_cpu_metrics != Some(false) {
            metrics::spawn_cpu_sampler(interval);
        }
        // A node without GPUs has said so already ("running CPU-only"): nothing to sample.
        if listen.allow_metrics && args.allow_gpu_metrics != Some(false) && !self.gpu_uuids.is_empty() {
            crate::telemetry::gpu::spawn_sampler(interval, self.gpu_uuids.clone());
        }
        self.ports = Some((stop_tx, servers));
        Ok(())
    }

    /// The node's Dispatch: every call a frontend makes (metadata, index, statistics, ...).
    pub fn dispatch(&self) -> &Arc<NodeDispatch> {
        &self.node.dispatch
    }

    /// Whether the node is ready (Triton's server readiness).
    pub fn is_ready(&self) -> bool {
        self.node.dispatch.ready()
    }

    /// Runs one request and answers it; a decoupled model needs [`Server::infer_stream`]. Its
    /// tensors are checked with the rest of the request when the node admits it, once.
    pub async fn infer(&self, request: InferRequest) -> mesh::Result<InferResponse> {
        let admission = self.node.dispatch.admit_local(request, Replies::One)?;
        self.node.dispatch.infer_admitted(admission).await
    }

    /// Runs one request on buffers the caller lends: no input is copied into the request, and the
    /// call returns only once nothing in the node holds them any more (an output that shares an
    /// input's memory is copied out first), so the borrows end with the call. It blocks its thread
    /// (on a runtime worker it steps aside with `block_in_place`); a decoupled model needs
    /// [`Server::infer_stream`].
    pub fn infer_borrowed(
        &self,
        model: &str,
        version: &str,
        inputs: &[Borrowed<'_>],
        outputs: &[&str],
    ) -> mesh::Result<InferResponse> {
        let loans = Arc::new(Loans::default());
        // Declared first, dropped last: even a panic below waits for the loans before unwinding on.
        let _back = AwaitLoans(loans.clone());
        let tensors = inputs
            .iter()
            .map(|b| NamedTensor {
                name: b.name.to_string(),
                tensor: mesh::Tensor {
                    dtype: b.dtype,
                    shape: b.shape.to_vec(),
                    // SAFETY: the slice is borrowed for this call, which returns only once every
                    // Loan was dropped (`_back` waits for that, even while unwinding).
                    data: unsafe { lent_bytes(b.data.as_ptr(), b.data.len(), Loan::new(&loans)) },
                },
            })
            .collect();
        let request = InferRequest {
            model_name: model.to_string(),
            model_version: version.to_string(),
            inputs: tensors,
            outputs: outputs.iter().map(|o| mesh::RequestedOutput::named(*o)).collect(),
            ..Default::default()
        };
        let admission = self.node.dispatch.admit_local(request, Replies::One)?;
        let dispatch = self.node.dispatch.clone();
        let run = async move { dispatch.infer_admitted(admission).await };
        let answer = match tokio::runtime::Handle::try_current() {
            Ok(_) => tokio::task::block_in_place(|| self.runtime.block_on(run)),
            Err(_) => self.runtime.block_on(run),
        };
        answer.map(|mut answer| {
            for o in &mut answer.outputs {
                let d = &o.tensor.data;
                let lent = inputs.iter().any(|b| {
                    let (start, end) = (b.data.as_ptr() as usize, b.data.as_ptr() as usize + b.data.len());
                    (d.as_ptr() as usize) < end && start < d.as_ptr() as usize + d.len()
                });
                if lent {
                    o.tensor.data = bytes::Bytes::copy_from_slice(d);
                }
            }
            answer
        })
    }

    /// Runs one request of a decoupled model (or any model): its answers as they come, the last
    /// with `last` set. Each answer holds a credit of the stream's window until the caller drops
    /// it, so a caller that stops reading stops the model after 16 answers, as a gRPC client does.
    pub fn infer_stream(&self, request: InferRequest) -> StreamReceiver {
        let (tx, rx) = stream_channel(Window::for_stream());
        let admission = match self.node.dispatch.admit_local(request, Replies::Stream) {
            Ok(admission) => admission,
            Err(e) => {
                let _ = tx.send(mesh::StreamItem::new(Some(Err(e)), true));
                return rx;
            }
        };
        let dispatch = self.node.dispatch.clone();
        tokio::spawn(async move { dispatch.infer_stream_admitted(admission, tx).await });
        rx
    }

    /// Loads (or reloads) a model, as the repository extension does; explicit control mode only.
    pub async fn load(&self, name: &str, options: LoadOptions) -> mesh::Result<()> {
        self.node.dispatch.load_model(name, options).await
    }

    /// Unloads a model (with `dependents`, an ensemble's composing models too).
    pub async fn unload(&self, name: &str, dependents: bool) -> mesh::Result<()> {
        self.node.dispatch.unload_model(name, dependents).await
    }

    /// Triton's statistics of a model (`version` empty: every ready version).
    pub async fn statistics(&self, name: &str, version: &str) -> mesh::Result<mesh::proto::ModelStatisticsResponse> {
        self.node.dispatch.model_statistics(name, version).await
    }

    /// The metrics in Prometheus' text format, as the metrics port serves them.
    pub fn metrics(&self) -> String {
        render_metrics(&self.prometheus)
    }

    /// Stops, all within `--exit-timeout-secs` (as tritonserver): a cluster's routers are
    /// drained first, the ports stop taking requests and finish theirs, then every model is
    /// unloaded and its instances' `finalize()` waited for; what still runs when the time is up
    /// is killed, and the log names its model.
    pub async fn stop(self) {
        let deadline = Instant::now() + Duration::from_secs(self.args.exit_timeout_secs);
        let left = || deadline.saturating_duration_since(Instant::now());
        if let Some(cluster) = &self.cluster {
            // Routers stop sending new requests first and release the node once theirs are answered.
            cluster.drain(left()).await;
        }
        if let Some((stop_tx, servers)) = self.ports {
            let _ = stop_tx.send(true);
            mesh::process::drain(servers, left()).await;
        }
        mesh::trace::flush(); // traces not written yet go to trace_file, as tritonserver writes them at exit
        if let Some(cluster) = self.cluster {
            cluster.leave(left()).await;
        }
        self.node.stop(deadline).await;
        tracing::info!("stopped");
    }
}

/// An input lent to [`Server::infer_borrowed`]: its bytes are read where they are.
#[derive(Debug, Clone, Copy)]
pub struct Borrowed<'a> {
    /// The model's name of the input.
    pub name: &'a str,
    /// Its element type.
    pub dtype: mesh::DataType,
    /// Its shape (the batch dimension included, for a batching model).
    pub shape: &'a [i64],
    /// Its bytes, row-major, as many as the type and shape need.
    pub data: &'a [u8],
}

/// How many lent buffers the node still holds, and where their owner waits for them.
#[derive(Default)]
struct Loans {
    out: std::sync::Mutex<usize>,
    back: std::sync::Condvar,
}

/// A loan the node still holds: counted while it lives, given back when dropped.
struct Loan(Arc<Loans>);

impl Loan {
    fn new(loans: &Arc<Loans>) -> Loan {
        *loans.out.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        Loan(loans.clone())
    }
}

impl Drop for Loan {
    fn drop(&mut self) {
        let mut out = self.0.out.lock().unwrap_or_else(|p| p.into_inner());
        *out -= 1;
        if *out == 0 {
            self.0.back.notify_all();
        }
    }
}

/// Memory an in-process caller lends as a tensor's bytes, with no copy: `keep` lives as long as
/// any `Bytes` over it does, so dropping it tells the lender the node is done with the memory.
struct Lent<K> {
    base: usize,
    len: usize,
    _keep: K,
}

impl<K> AsRef<[u8]> for Lent<K> {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `lent_bytes`'s caller keeps the memory valid and unchanged until `_keep` drops.
        unsafe { std::slice::from_raw_parts(self.base as *const u8, self.len) }
    }
}

/// `Bytes` over `len` bytes at `base` that the caller lends (the embedding APIs' inputs).
///
/// # Safety
/// The memory must stay valid and unchanged until `keep` is dropped, which happens when the last
/// `Bytes` over it goes; the caller waits for that (a drop guard, a release callback).
pub unsafe fn lent_bytes<K: Send + Sync + 'static>(base: *const u8, len: usize, keep: K) -> bytes::Bytes {
    bytes::Bytes::from_owner(Lent {
        base: base as usize,
        len,
        _keep: keep,
    })
}

/// Waits, when dropped, until the node gave every lent buffer back.
struct AwaitLoans(Arc<Loans>);

impl Drop for AwaitLoans {
    fn drop(&mut self) {
        let mut out = self.0.out.lock().unwrap_or_else(|p| p.into_inner());
        while *out > 0 {
            out = self.0.back.wait(out).unwrap_or_else(|p| p.into_inner());
        }
    }
}
