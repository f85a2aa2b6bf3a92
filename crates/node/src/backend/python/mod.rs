//! The Python backend: Triton's `model.py` files (`TritonPythonModel`) run unmodified, one stub process
//! per instance; tensors cross in shared memory and BLS calls go back through the node's Dispatch.
mod bls;
mod decoupled;
mod each;
pub mod env;
pub mod ipc;
pub mod live;
mod settings;
mod spin;
pub mod stub;
mod wait;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use mesh::config::{config_from_json, config_to_json, ModelConfig};
use mesh::{Code, Dispatch, Error, NamedTensor, Params, Result};
use serde_json::{json, Value};

use super::{Backend, Deliver, PerRequest, RequestView, Timings};
use ipc::{decode_tensor, encode_tensor};
pub use settings::PythonSettings;
use spin::SpinPolicy;
use stub::Stub;

/// What every Python instance of the node shares: settings, and the Dispatch BLS calls go through.
pub struct PythonContext {
    pub settings: PythonSettings,
    /// Set once the node's Dispatch exists (it is built after the loader).
    pub dispatch: OnceLock<Weak<dyn Dispatch>>,
    pub runtime: tokio::runtime::Handle,
    /// The instances' stubs still running, which a stop waits for.
    pub live: Arc<live::LiveStubs>,
}

/// Where one instance runs, for `initialize(args)`.
pub struct InstanceInfo<'a> {
    /// The node's label of the instance (its logs).
    pub name: &'a str,
    /// Triton's name of the instance (`model_instance_name`).
    pub triton_name: &'a str,
    pub gpu: Option<i32>,
    pub version: i64,
    pub model_dir: &'a Path,
    pub file: &'a Path,
    /// A TensorFlow model's files (`file` is then the bundled runner).
    pub artifact: Option<&'a Path>,
}

/// The interpreter for a model: `EXECUTION_ENV_PATH`, then `--backend-config python,interpreter=`, then python3.
fn interpreter(ctx: &PythonContext, config: &ModelConfig, model_dir: &Path) -> std::result::Result<PathBuf, String> {
    if let Some(p) = config.parameters.get("EXECUTION_ENV_PATH") {
        let dir = model_dir.to_string_lossy();
        let path = PathBuf::from(p.string_value.replace("$$TRITON_MODEL_DIRECTORY", &dir));
        return env::interpreter_in(&path);
    }
    Ok(ctx
        .settings
        .interpreter
        .clone()
        .unwrap_or_else(|| PathBuf::from("python3")))
}

/// Runs the model's `auto_complete_config` (if it has one) in a short-lived stub and returns the completed config.
pub fn auto_complete(
    ctx: &PythonContext,
    config: &ModelConfig,
    model_dir: &Path,
    file: &Path,
    artifact: Option<&Path>,
) -> std::result::Result<ModelConfig, String> {
    let python = interpreter(ctx, config, model_dir)?;
    let label = format!("{}_autocomplete", config.name);
    let mut stub = Stub::start(&python, 1 << 16, Duration::ZERO, &label)?;
    let header = json!({
        "op": "auto_complete", "model_file": file, "config": config_to_json(config), "artifact": artifact,
    });
    let reply = call(&mut stub, &header, Some(Instant::now() + Duration::from_secs(60)));
    stub.stop(true, Duration::from_secs(2));
    let reply = reply?;
    let completed = serde_json::to_string(&reply["config"]).map_err(|e| e.to_string())?;
    config_from_json(&completed).map_err(|e| format!("auto_complete_config returned an invalid config: {e}"))
}

/// Sends one control message and waits for its ok/error answer (no BLS happens during these).
fn call(stub: &mut Stub, header: &Value, deadline: Option<Instant>) -> std::result::Result<Value, String> {
    stub.send(header, &[])
        .map_err(|e| format!("cannot reach the python stub: {e}"))?;
    loop {
        let (reply, _) = stub.recv(deadline).map_err(|e| {
            let tail = stub.stderr_tail();
            format!(
                "the python stub stopped answering ({e}){}",
                if tail.is_empty() {
                    String::new()
                } else {
                    format!(":\n{tail}")
                }
            )
        })?;
        match reply["op"].as_str() {
            Some("ok") => return Ok(reply),
            Some("log") => log(&stub.label, &reply),
            Some("metric") => metric(&stub.answers(), &reply),
            Some("error") => {
                return Err(reply["message"]
                    .as_str()
                    .unwrap_or("unknown error")
                    .trim_end()
                    .to_string())
            }
            other => return Err(format!("unexpected answer from the python stub: {other:?}")),
        }
    }
}

/// A custom-metric operation of the model (`pb_utils.MetricFamily`, `Metric`), answered when the
/// stub waits for it (it names a call).
fn metric(answers: &bls::Answers, frame: &Value) {
    let mut answer = crate::telemetry::custom::CUSTOM.apply(&answers.holder, frame);
    if let Some(id) = frame.get("call_id") {
        answer["op"] = "metric_reply".into();
        answer["call_id"] = id.clone();
        bls::reply(&answers.writer, &answer, &[]);
    }
}

fn log(label: &str, frame: &Value) {
    let message = frame["message"].as_str().unwrap_or_default();
    let at = frame["at"].as_str().unwrap_or_default();
    match frame["level"].as_str() {
        Some("error") => tracing::error!(instance = %label, at = %at, "{message}"),
        Some("warn") => tracing::warn!(instance = %label, at = %at, "{message}"),
        Some("verbose") => tracing::debug!(instance = %label, at = %at, "{message}"),
        _ => tracing::info!(instance = %label, at = %at, "{message}"),
    }
}

/// One instance of a Python model: its stub process and the link to it.
pub struct PythonBackend {
    stub: Stub,
    ctx: Arc<PythonContext>,
    /// Why the stub can no longer serve (it died or hung); the instance is then rebuilt.
    dead: Option<String>,
    /// `model_transaction_policy { decoupled: true }`: answers stream back per request.
    decoupled: bool,
    /// Numbers executions, so a late frame of an earlier one is recognised.
    seq: u64,
    /// A decoupled model's requests still answering (read by the stub's reading thread).
    streams: Arc<decoupled::Streams>,
    /// Set once the model made a BLS call: its requests then never run on an async runtime worker.
    calls_node: bool,
    /// Whether a wait for the stub on the executor thread polls first (`spin-microseconds`).
    spin: SpinPolicy,
    /// How those waits went.
    waits: wait::WaitCounts,
}

impl PythonBackend {
    /// Starts the stub and runs the model's `initialize(args)`; its exception is the load error.
    pub fn start(
        ctx: Arc<PythonContext>,
        config: &ModelConfig,
        info: &InstanceInfo<'_>,
    ) -> std::result::Result<Self, String> {
        let python = interpreter(&ctx, config, info.model_dir)?;
        if !settings::force_cpu_only_inputs(config)? && info.gpu.is_some() {
            tracing::info!(
                model = %config.name,
                "FORCE_CPU_ONLY_INPUT_TENSORS is off; inputs still reach execute() in CPU memory (mesh-node keeps \
                 tensors in host memory), as Triton gives those that arrive in CPU memory"
            );
        }
        let settings = &ctx.settings;
        let mut stub = Stub::start(&python, settings.shm_bytes, settings.spin, info.name)?;
        stub.enroll(&ctx.live, &config.name);
        let spin = SpinPolicy::new(settings.spin);
        let mut args = json!({
            "model_config": config_to_json(config).to_string(),
            "model_instance_kind": if info.gpu.is_some() { "GPU" } else { "CPU" },
            // Triton's `<group>_<index>`, or `<group>` for a group of one (`<model>_0` by default).
            "model_instance_name": info.triton_name,
            "model_instance_device_id": info.gpu.unwrap_or(0).to_string(),
            "model_repository": info.model_dir,
            "model_version": info.version.to_string(),
            "model_name": config.name,
        });
        if let Some(artifact) = info.artifact {
            args["model_artifact"] = json!(artifact);
        }
        let decoupled = config.model_transaction_policy.as_ref().is_some_and(|p| p.decoupled);
        let header = json!({"op": "initialize", "model_file": info.file, "args": args, "decoupled": decoupled});
        call(&mut stub, &header, Some(Instant::now() + ctx.settings.execute_timeout))
            .map_err(|e| format!("initialize() failed: {e}"))?;
        let mut backend = PythonBackend {
            stub,
            ctx,
            dead: None,
            decoupled,
            seq: 0,
            streams: Default::default(),
            calls_node: false,
            spin,
            waits: wait::WaitCounts::new(&config.name, info.version, info.name),
        };
        if decoupled {
            backend.route_frames()?;
        }
        Ok(backend)
    }

    /// Marks the stub dead (killing it if it hung) and says why.
    fn fail(&mut self, why: String) -> Error {
        tracing::error!(instance = %self.stub.label, "{why}");
        self.stub.kill();
        self.dead = Some(why.clone());
        Error::unavailable(why)
    }

    /// Sends one frame; a stub that cannot take it is dead.
    fn send(&mut self, header: &Value, blob: &[u8]) -> Result<()> {
        if let Err(e) = self.stub.send(header, blob) {
            return Err(self.fail(format!("python stub {} is gone: {e}", self.stub.label)));
        }
        Ok(())
    }

    /// The stub's next frame other than BLS calls and logs, which are served here meanwhile. A stub
    /// that exits, or sends nothing before `deadline`, is killed and its execution fails.
    fn next_reply(&mut self, deadline: Instant) -> Result<(Value, Vec<u8>)> {
        self.next_reply_watching(deadline, &[])
    }

    /// `next_reply`, telling the stub meanwhile which of `watch`'s requests (those with a probe)
    /// lost their client.
    fn next_reply_watching(&mut self, deadline: Instant, watch: &[RequestView<'_>]) -> Result<(Value, Vec<u8>)> {
        let watching = watch.iter().any(|r| r.cancelled.is_some());
        let mut told = vec![false; if watching { watch.len() } else { 0 }];
        loop {
            // When watching, the frame has started to arrive once `watch_cancels` returns (it
            // polled already): it is read at once. On an async runtime worker (a request that
            // found the instance idle) polling would take the CPU the stub and the runtime's other
            // tasks need.
            let may_poll = if watching {
                self.watch_cancels(watch, &mut told, deadline)?;
                false
            } else {
                crate::backend::thread_may_block()
            };
            let (frame, blob) = match self.recv_polled(deadline, may_poll) {
                Ok(f) => f,
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    let why = format!(
                        "python stub {} did not answer within {:?} (execute-timeout-seconds); restarting it",
                        self.stub.label, self.ctx.settings.execute_timeout
                    );
                    return Err(self.fail(why));
                }
                Err(_) => {
                    let status = self.stub.exited().unwrap_or_else(|| "connection lost".into());
                    let tail = self.stub.stderr_tail();
                    let why = format!(
                        "python stub {} exited ({status}) during execute(); restarting it",
                        self.stub.label
                    );
                    if !tail.is_empty() {
                        tracing::error!(instance = %self.stub.label, "stub stderr:\n{tail}");
                    }
                    return Err(self.fail(why));
                }
            };
            match frame["op"].as_str() {
                // A BLS call or a model-control call (`pb_utils.load_model`, ...).
                Some("bls" | "model_control") => {
                    // The model's later requests go to its executor thread (`may_wait_inline`).
                    self.calls_node = true;
                    if !crate::backend::thread_may_block() && on_multi_thread_runtime() {
                        // On an async runtime worker (a request that found the instance idle) the
                        // tasks a BLS call starts would wait in this worker's own queue until the
                        // execute ends: the rest of it runs with the worker handed over.
                        return tokio::task::block_in_place(|| {
                            let _may_block = crate::backend::enter_may_block();
                            bls::start(&self.ctx, &self.stub.answers(), frame, &blob);
                            self.next_reply_watching(deadline, watch)
                        });
                    }
                    bls::start(&self.ctx, &self.stub.answers(), frame, &blob)
                }
                Some("bls_cancel") => bls::cancel(&self.stub.answers(), &frame),
                Some("log") => log(&self.stub.label, &frame),
                Some("metric") => metric(&self.stub.answers(), &frame),
                _ => return Ok((frame, blob)),
            }
        }
    }

    /// Sends an execute and waits for its responses, serving BLS calls and logs meanwhile and
    /// telling the stub which of `watch`'s requests lost their client.
    fn exchange(&mut self, header: &Value, blob: &[u8], watch: &[RequestView<'_>]) -> Result<(Value, Vec<u8>)> {
        self.send(header, blob)?;
        let (frame, blob) = self.next_reply_watching(Instant::now() + self.ctx.settings.execute_timeout, watch)?;
        if frame["op"] == "error" {
            return Err(stub_error(&frame));
        }
        Ok((frame, blob))
    }

    /// Describes the requests of a batch for the stub, their inputs in shared memory.
    fn encode_requests(&self, requests: &[RequestView<'_>]) -> (Vec<Value>, Vec<u8>) {
        let mut blob = Vec::new();
        let encoded = requests
            .iter()
            .map(|r| {
                let param = |name: &str| r.parameters.iter().find(|(k, _)| k == name).map(|(_, v)| v);
                // An integer id, or a string one, as Triton's correlation_id() gives it.
                let correlation = match mesh::params::sequence_id(r.parameters).ok().flatten() {
                    Some(mesh::params::SequenceId::Int(i)) => json!(i),
                    Some(mesh::params::SequenceId::Str(s)) => json!(s),
                    None => json!(0),
                };
                let flag = |name: &str, bit: u64| match param(name) {
                    Some(mesh::Param::Bool(true)) => bit,
                    _ => 0,
                };
                json!({
                    "id": r.id,
                    "trace": r.trace,
                    // `request.trace().get_context()` (OpenTelemetry mode only).
                    "trace_context": r.trace.and_then(mesh::trace::context),
                    "outputs": r.outputs,
                    "parameters": params_json(r.parameters),
                    "correlation_id": correlation,
                    // Triton's TRITONSERVER_REQUEST_FLAG_SEQUENCE_START and _END.
                    "flags": flag("sequence_start", 1) | flag("sequence_end", 2),
                    "timeout": mesh::params::timeout(r.parameters).ok().flatten().map_or(0, |t| t.as_micros() as u64),
                    "inputs": r.inputs.iter().map(|t| encode_tensor(&self.stub.shm, t, &mut blob)).collect::<Vec<_>>(),
                })
            })
            .collect();
        (encoded, blob)
    }

    /// One response as the stub described it: its outputs, or the model's error.
    fn response_from(&self, response: &Value, blob: &[u8]) -> Result<Vec<NamedTensor>> {
        decode_response(&self.stub.shm, response, blob)
    }
}

/// One response as the stub described it: its outputs, or the model's error.
fn decode_response(shm: &ipc::Shm, response: &Value, blob: &[u8]) -> Result<Vec<NamedTensor>> {
    if response.get("error").is_some_and(|e| !e.is_null()) {
        return Err(error_from(response));
    }
    let outputs = response["outputs"].as_array().map(|v| v.as_slice()).unwrap_or_default();
    outputs.iter().map(|d| decode_tensor(shm, d, blob)).collect()
}

/// Whether this thread is a worker of a multi-threaded async runtime (whose other workers can take
/// its tasks while it blocks, `tokio::task::block_in_place`).
fn on_multi_thread_runtime() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

/// The stub's own failure (not the model's), as it reported it.
fn stub_error(frame: &Value) -> Error {
    let message = frame["message"].as_str().unwrap_or("unknown error");
    Error::internal(format!("python stub error: {}", message.trim_end()))
}

/// The `pb_utils.TritonError` code for an error, so a model sees why its BLS call failed.
pub(super) fn triton_code(code: Code) -> u32 {
    match code {
        Code::Internal => 1,
        Code::NotFound => 2,
        Code::InvalidArgument | Code::PayloadTooLarge => 3,
        Code::Unavailable | Code::Overloaded => 4,
        Code::Unsupported => 5,
        Code::AlreadyExists => 6,
        Code::Cancelled => 7,
        Code::Unknown => 0,
    }
}

/// Reads Triton's `TritonError` code a Python model set on an error response.
fn error_from(response: &Value) -> Error {
    let message = response["error"].as_str().unwrap_or("error").to_string();
    let code = match response["code"].as_u64() {
        Some(0) => Code::Unknown,
        Some(2) => Code::NotFound,
        Some(3) => Code::InvalidArgument,
        Some(4) => Code::Unavailable,
        Some(5) => Code::Unsupported,
        Some(6) => Code::AlreadyExists,
        Some(7) => Code::Cancelled,
        _ => Code::Internal,
    };
    Error::new(code, message)
}

/// Parameters as the JSON object `request.parameters()` returns.
pub(crate) fn params_json(params: &Params) -> String {
    use mesh::Param;
    let map: serde_json::Map<String, Value> = params
        .iter()
        .map(|(k, v)| {
            let v = match v {
                Param::Bool(b) => json!(b),
                Param::Int(i) => json!(i),
                Param::Uint(u) => json!(u),
                Param::Double(d) => json!(d),
                Param::String(s) => json!(s),
            };
            (k.clone(), v)
        })
        .collect();
    Value::Object(map).to_string()
}

impl Backend for PythonBackend {
    fn execute(&mut self, inputs: &[NamedTensor], outputs: &[String]) -> Result<(Vec<NamedTensor>, Timings)> {
        let params = Params::new();
        let view = RequestView {
            inputs,
            outputs,
            id: "",
            parameters: &params,
            trace: None,
            sink: None,
            cancelled: None,
        };
        let (mut results, timings) = self.execute_requests(&[view])?;
        let out = results.pop().unwrap_or_else(|| Err(Error::internal("no response")))?;
        Ok((out, timings))
    }

    fn takes_requests(&self) -> bool {
        true
    }

    fn may_run_inline(&self) -> bool {
        false
    }

    fn may_wait_inline(&self) -> bool {
        !self.decoupled && !self.calls_node
    }

    fn inline_limit(&self) -> Option<std::time::Duration> {
        Some(self.ctx.settings.inline_limit)
    }

    /// Runs the batch, then again the requests the model rescheduled
    /// (`set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)`) until none is.
    fn execute_requests(&mut self, requests: &[RequestView<'_>]) -> Result<(PerRequest, Timings)> {
        self.execute_rounds(requests)
    }

    /// A model that is not decoupled takes the requests that queued while it was busy in one frame.
    fn groups_executions(&self) -> bool {
        !self.decoupled
    }

    /// The requests travel to the stub in one frame; it runs `execute([request])` for each, as
    /// Triton runs a model without dynamic batching, and sends each answer as soon as it has it.
    fn execute_each(&mut self, requests: &[RequestView<'_>], deliver: Deliver<'_>) -> Result<()> {
        if self.decoupled {
            return super::each_in_turn(self, requests, deliver);
        }
        // Rescheduled requests run again (each in its own execute too) until none is.
        let mut pending: Vec<usize> = (0..requests.len()).collect();
        while !pending.is_empty() {
            let views: Vec<RequestView<'_>> = pending.iter().map(|&i| requests[i]).collect();
            let again = self.execute_streamed(&views, &mut |k, r| deliver(pending[k], r))?;
            pending = again.into_iter().filter_map(|k| pending.get(k).copied()).collect();
        }
        Ok(())
    }

    fn healthy(&mut self) -> bool {
        self.dead.is_none() && self.stub.exited().is_none()
    }
}

impl PythonBackend {
    /// Runs the requests in one `execute`, then again those the model rescheduled until none is.
    fn execute_rounds(&mut self, requests: &[RequestView<'_>]) -> Result<(PerRequest, Timings)> {
        let (mut results, mut timings, mut again) = self.execute_once(requests)?;
        while !again.is_empty() {
            let views: Vec<RequestView<'_>> = again.iter().map(|&i| requests[i]).collect();
            let (answers, more, next) = match self.execute_once(&views) {
                Ok(round) => round,
                Err(e) => {
                    // Only the requests of this round fail: the others have their answers (a
                    // decoupled one has already sent its final flag).
                    for &i in &again {
                        results[i] = Err(e.clone());
                    }
                    break;
                }
            };
            timings.infer += more.input + more.infer + more.output;
            for (k, answer) in answers.into_iter().enumerate() {
                results[again[k]] = answer;
            }
            again = next.into_iter().filter_map(|k| again.get(k).copied()).collect();
        }
        Ok((results, timings))
    }
}

/// The places of the requests a model rescheduled, from its reply.
fn rescheduled(reply: &Value, count: usize) -> Vec<usize> {
    let list = reply["reschedule"].as_array().map(|v| v.as_slice()).unwrap_or_default();
    let mut places: Vec<usize> = list
        .iter()
        .filter_map(|i| i.as_u64())
        .map(|i| i as usize)
        .filter(|&i| i < count)
        .collect();
    places.sort_unstable();
    places.dedup();
    places
}

impl PythonBackend {
    /// One execution of the model: each request's answer, and the requests it rescheduled.
    fn execute_once(&mut self, requests: &[RequestView<'_>]) -> Result<(PerRequest, Timings, Vec<usize>)> {
        if let Some(why) = &self.dead {
            return Err(Error::unavailable(why.clone()));
        }
        if self.decoupled {
            return self.execute_decoupled(requests);
        }
        let t0 = Instant::now();
        self.stub.shm.reset();
        let (encoded, blob) = self.encode_requests(requests);
        self.seq += 1;
        let header = json!({"op": "execute", "seq": self.seq, "requests": encoded});
        let t1 = Instant::now();
        let (reply, reply_blob) = self.exchange(&header, &blob, requests)?;
        let t2 = Instant::now();
        let responses = reply["responses"]
            .as_array()
            .filter(|r| r.len() == requests.len())
            .ok_or_else(|| {
                Error::internal(format!(
                    "python stub answered {} responses for {} requests",
                    reply["responses"].as_array().map_or(0, |r| r.len()),
                    requests.len()
                ))
            })?;
        let again = rescheduled(&reply, requests.len());
        let results = responses
            .iter()
            .map(|resp| self.response_from(resp, &reply_blob))
            .collect();
        let timings = Timings {
            input: t1 - t0,
            infer: t2 - t1,
            output: t2.elapsed(),
        };
        Ok((results, timings, again))
    }
}

impl Drop for PythonBackend {
    fn drop(&mut self) {
        // An unloaded instance's finalize() has `--exit-timeout-secs`, as in a stop (where the
        // stop's own deadline may end it sooner).
        let finalize = self.dead.is_none();
        self.stub.stop(finalize, self.ctx.live.grace);
    }
}
