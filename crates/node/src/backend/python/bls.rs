//! BLS calls from a Python model: decoded from the stub's frame, run through the node's Dispatch (the
//! same seam clients use, so a router can later send them to other nodes), answered on the socket.
use mesh::sync::Locked;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};

use mesh::{Error, InferRequest, NamedTensor, Param, Params, RequestedOutput, Result};
use serde_json::{json, Value};

use super::ipc::{decode_tensor, encode_tensor, write_frame, Shm};
use super::{triton_code, PythonContext};

/// Turns the stub's description of `pb_utils.InferenceRequest` into a request.
fn request_from(frame: &Value, blob: &[u8], shm: &Shm) -> Result<InferRequest> {
    let model_name = frame["model"].as_str().unwrap_or_default().to_string();
    if model_name.is_empty() {
        return Err(Error::invalid("BLS request names no model"));
    }
    let inputs = frame["inputs"]
        .as_array()
        .map(|v| {
            v.iter()
                .map(|d| decode_tensor(shm, d, blob))
                .collect::<Result<Vec<NamedTensor>>>()
        })
        .transpose()?
        .unwrap_or_default();
    let outputs = frame["outputs"]
        .as_array()
        .map(|v| {
            v.iter()
                .filter_map(|n| n.as_str())
                .map(|n| RequestedOutput::named(n.to_string()))
                .collect()
        })
        .unwrap_or_default();
    let mut parameters = Params::new();
    if let Some(text) = frame["parameters"].as_str() {
        let parsed: Value = serde_json::from_str(text)
            .map_err(|e| Error::invalid(format!("BLS parameters are not a JSON object: {e}")))?;
        for (k, v) in parsed.as_object().into_iter().flatten() {
            let p = match v {
                Value::Bool(b) => Param::Bool(*b),
                Value::Number(n) if n.is_u64() => Param::Uint(n.as_u64().unwrap_or_default()),
                Value::Number(n) if n.is_i64() => Param::Int(n.as_i64().unwrap_or_default()),
                Value::Number(n) => Param::Double(n.as_f64().unwrap_or_default()),
                Value::String(s) => Param::String(s.clone()),
                other => {
                    return Err(Error::invalid(format!(
                        "BLS parameter '{k}' has unsupported value {other}"
                    )))
                }
            };
            parameters.push((k.clone(), p));
        }
    }
    if let Some(t) = frame["timeout"].as_u64().filter(|&t| t > 0) {
        parameters.push(("timeout".into(), Param::Uint(t)));
    }
    // An integer or a string id, as Triton's InferenceRequest takes it (0 and "" mean none).
    let correlation = match &frame["correlation_id"] {
        Value::Number(n) => n.as_u64().filter(|&c| c > 0).map(Param::Uint),
        Value::String(s) if !s.is_empty() => Some(Param::String(s.clone())),
        _ => None,
    };
    if let Some(c) = correlation {
        parameters.push(("sequence_id".into(), c));
        // Triton's TRITONSERVER_REQUEST_FLAG_SEQUENCE_START (1) and _END (2).
        let flags = frame["flags"].as_u64().unwrap_or(0);
        for (bit, name) in [(1, "sequence_start"), (2, "sequence_end")] {
            if flags & bit != 0 {
                parameters.push((name.into(), Param::Bool(true)));
            }
        }
    }
    Ok(InferRequest {
        model_name,
        model_version: frame["version"].as_str().unwrap_or_default().to_string(),
        id: frame["id"].as_str().unwrap_or_default().to_string(),
        inputs,
        outputs,
        parameters,
        client: mesh::Client::Local,
    })
}

pub(super) fn reply(writer: &Mutex<UnixStream>, header: &Value, blob: &[u8]) {
    let mut w = writer.locked();
    if let Err(e) = write_frame(&mut *w, header, blob) {
        tracing::warn!("cannot answer a BLS call: {e}");
    }
}

/// Where a stub's BLS answers go.
#[derive(Clone)]
pub struct Answers {
    pub writer: Arc<Mutex<UnixStream>>,
    pub shm: Arc<Shm>,
    /// A decoupled model's stub, read by its own thread: answers travel inline (its shared memory
    /// is reused by executions they may outlive) and no call runs on the reading thread.
    pub routed: bool,
    /// Who holds the custom metrics this stub makes (its label and process id).
    pub holder: Arc<str>,
    /// The stub's decoupled calls still streaming.
    pub streaming: Arc<Streaming>,
}

/// A stub's decoupled BLS calls that are still streaming, by call id, each with the switch its
/// `cancel()` throws. At most one per call the stub made and has not seen end.
#[derive(Default)]
pub struct Streaming(Mutex<std::collections::HashMap<u64, tokio::sync::oneshot::Sender<()>>>);

/// `cancel()` on a decoupled call's response iterator: the called model sees `is_cancelled()`
/// and the iterator ends with a CANCELLED error. A call that already ended is left alone.
pub fn cancel(to: &Answers, frame: &Value) {
    let switch = frame["call_id"]
        .as_u64()
        .and_then(|id| to.streaming.0.locked().remove(&id));
    if let Some(switch) = switch {
        let _ = switch.send(());
    }
}

impl Answers {
    fn encode(&self, outputs: &[NamedTensor], blob: &mut Vec<u8>) -> Vec<Value> {
        outputs
            .iter()
            .map(|t| {
                if self.routed {
                    encode_inline(t, blob)
                } else {
                    encode_tensor(&self.shm, t, blob)
                }
            })
            .collect()
    }

    /// Writes the answer of one call: its outputs, or the error.
    fn answer(&self, call_id: Value, result: Result<mesh::InferResponse>) {
        let mut blob = Vec::new();
        let header = match result {
            Ok(response) => {
                let outputs = self.encode(&response.outputs, &mut blob);
                json!({"op": "bls_response", "call_id": call_id, "outputs": outputs, "error": null})
            }
            Err(e) => failure("bls_response", &call_id, &e),
        };
        reply(&self.writer, &header, &blob);
    }

    /// Writes one answer of a decoupled call, with its final flag (`empty`: the flag alone).
    fn stream(&self, call_id: &Value, item: mesh::StreamItem) {
        let mut blob = Vec::new();
        let last = item.last;
        let header = match item.response {
            None => json!({"op": "bls_stream", "call_id": call_id, "last": last, "empty": true}),
            Some(Ok(response)) => {
                let outputs = self.encode(&response.outputs, &mut blob);
                json!({"op": "bls_stream", "call_id": call_id, "last": last, "outputs": outputs, "error": null})
            }
            Some(Err(e)) => {
                let mut header = failure("bls_stream", call_id, &e);
                header["last"] = last.into();
                header
            }
        };
        reply(&self.writer, &header, &blob);
    }
}

/// The header of a reply that carries an error (its message and Triton's code name).
fn failure(op: &str, call_id: &Value, e: &Error) -> Value {
    json!({"op": op, "call_id": call_id, "error": e.message, "code": triton_code(e.code)})
}

/// A tensor in the frame's blob, never in shared memory.
fn encode_inline(t: &NamedTensor, blob: &mut Vec<u8>) -> Value {
    let desc = json!({
        "name": t.name, "datatype": t.tensor.dtype.wire_name(), "shape": t.tensor.shape,
        "inline": [blob.len(), t.tensor.data.len()],
    });
    blob.extend_from_slice(&t.tensor.data);
    desc
}

/// `pb_utils.load_model`, `unload_model` and `is_model_ready` from a model's `execute`: the
/// repository calls clients make (so explicit model control applies, with its errors), run on the
/// runtime, never on the instance's thread, and answered to the waiting stub. `load` may carry a
/// config (JSON) and `file:` overrides whose bytes are in the frame's blob.
fn control(ctx: &Arc<PythonContext>, to: &Answers, frame: Value, blob: &[u8]) {
    let call_id = frame["call_id"].clone();
    let to = to.clone();
    let answer = move |result: Result<Value>| {
        let header = match result {
            Ok(value) => json!({"op": "model_control_reply", "call_id": call_id, "value": value}),
            Err(e) => failure("model_control_reply", &call_id, &e),
        };
        reply(&to.writer, &header, &[]);
    };
    let Some(dispatch) = ctx.dispatch.get().and_then(|w| w.upgrade()) else {
        return answer(Err(Error::unavailable(
            "the node is not serving (starting or shutting down)",
        )));
    };
    let name = frame["model"].as_str().unwrap_or_default().to_string();
    let mut files = Vec::new();
    for f in frame["files"].as_array().into_iter().flatten() {
        let (path, at, len) = (f[0].as_str(), f[1].as_u64(), f[2].as_u64());
        let bytes = match (path, at, len) {
            (Some(path), Some(at), Some(len)) => usize::try_from(at)
                .ok()
                .zip(usize::try_from(len).ok())
                .and_then(|(at, len)| blob.get(at..at.checked_add(len)?))
                .map(|b| (path.to_string(), bytes::Bytes::copy_from_slice(b))),
            _ => None,
        };
        match bytes {
            Some(file) => files.push(file),
            None => {
                return answer(Err(Error::invalid(
                    "load_model: a file override lies outside its frame",
                )))
            }
        }
    }
    ctx.runtime.spawn(async move {
        let result = match frame["action"].as_str() {
            Some("load") => {
                let config = frame["config"].as_str().filter(|c| !c.is_empty()).map(str::to_string);
                let options = mesh::LoadOptions { config, files };
                dispatch.load_model(&name, options).await.map(|()| Value::Null)
            }
            Some("unload") => {
                let dependents = frame["unload_dependents"].as_bool().unwrap_or(false);
                dispatch.unload_model(&name, dependents).await.map(|()| Value::Null)
            }
            // Triton's ServerModelIsReady: false, not an error, for a model it does not know.
            Some("ready") => {
                let version = frame["version"].as_str().unwrap_or_default();
                Ok(Value::Bool(dispatch.model(&name, version).is_ok_and(|v| v.ready)))
            }
            other => Err(Error::invalid(format!("unknown model-control action {other:?}"))),
        };
        answer(result);
    });
}

/// Runs one BLS call through the node's Dispatch. The inputs are copied out of shared memory now.
/// A blocking `exec()` of a model that is not routed runs right here on the instance's thread,
/// which waits for it anyway: the model it calls (ONNX, or Python when its instance is idle) then
/// runs on this thread too, with no hand-off. Other calls go to the runtime so they overlap. A
/// decoupled call (`exec(decoupled=True)`) streams each answer back as it comes.
pub fn start(ctx: &Arc<PythonContext>, to: &Answers, frame: Value, blob: &[u8]) {
    if frame["op"] == "model_control" {
        return control(ctx, to, frame, blob);
    }
    let call_id = frame["call_id"].clone();
    // Made with `trace=request.trace()` of a traced request: traced as its child.
    let parent = frame["trace"].as_u64();
    let to = to.clone();
    let request = match request_from(&frame, blob, &to.shm) {
        Ok(r) => r,
        Err(e) => return to.answer(call_id, Err(e)),
    };
    let dispatch = ctx.dispatch.get().and_then(|w| w.upgrade());
    let Some(dispatch) = dispatch else {
        return to.answer(
            call_id,
            Err(Error::unavailable(
                "the node is not serving (starting or shutting down)",
            )),
        );
    };
    if frame["decoupled"].as_bool() == Some(true) {
        let (switch, cancelled) = tokio::sync::oneshot::channel();
        let id = call_id.as_u64();
        if let Some(id) = id {
            to.streaming.0.locked().insert(id, switch);
        }
        ctx.runtime.spawn(async move {
            let (sink, mut answers) = mesh::stream::stream_channel(mesh::stream::Window::for_stream());
            let run = mesh::trace::child(parent, dispatch.infer_stream(request, sink));
            let forward = async {
                let ended = async {
                    while let Some(item) = answers.recv().await {
                        to.stream(&call_id, item);
                    }
                };
                // Only a thrown switch cancels; one dropped unthrown (its stub gone) leaves the
                // stream to end by itself.
                let cancel = async {
                    if cancelled.await.is_err() {
                        std::future::pending::<()>().await;
                    }
                };
                let was_cancelled = tokio::select! {
                    () = ended => false,
                    () = cancel => true,
                };
                if was_cancelled {
                    // Nobody takes the called model's answers now: it sees is_cancelled().
                    drop(answers);
                    let why = Error::new(
                        mesh::Code::Cancelled,
                        "the decoupled BLS request was cancelled (cancel() on its response iterator)",
                    );
                    to.stream(&call_id, mesh::StreamItem::new(Some(Err(why)), true));
                } else if let Some(id) = id {
                    to.streaming.0.locked().remove(&id);
                }
            };
            tokio::join!(run, forward);
        });
        return;
    }
    let sync = frame["sync"].as_bool() == Some(true) && !to.routed;
    let call = async move {
        let result = mesh::trace::child(parent, dispatch.infer(request)).await;
        to.answer(call_id, result);
    };
    if sync {
        // This thread may already wait in a blocking BLS call whose target runs inline here and
        // calls BLS in turn, so the wait must nest; unconstrained: no task budget runs out.
        let _runtime = ctx.runtime.enter();
        wait_here(tokio::task::unconstrained(call));
    } else {
        ctx.runtime.spawn(call);
    }
}

/// Wakes the thread that waits in `wait_here`.
struct Unpark(std::thread::Thread);

impl std::task::Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs `future` to completion on this (non-runtime) thread, parked between wake-ups. Unlike
/// `Runtime::block_on` and `futures::executor::block_on`, one call may run inside another.
fn wait_here<F: std::future::Future>(future: F) -> F::Output {
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let std::task::Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park(); // a stray unpark only costs one more poll
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_nest_and_finish() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let _entered = rt.enter();
        let out = wait_here(async {
            let inner = wait_here(async {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                2
            });
            let (tx, rx) = tokio::sync::oneshot::channel();
            std::thread::spawn(move || tx.send(inner * 10).unwrap());
            rx.await.unwrap() + 1
        });
        assert_eq!(out, 21);
    }

    #[test]
    fn a_bls_frame_becomes_a_request_with_its_parameters() {
        let path = std::env::temp_dir().join(format!("mesh-bls-test-{}", std::process::id()));
        let shm = Shm::create(&path, 4096).unwrap();
        let frame = json!({
            "model": "m", "version": "2", "id": "r1", "outputs": ["y"], "inputs": [],
            "parameters": "{\"k\": \"v\", \"n\": 3}", "timeout": 500, "correlation_id": 0,
        });
        let r = request_from(&frame, &[], &shm).unwrap();
        assert_eq!(
            (r.model_name.as_str(), r.model_version.as_str(), r.id.as_str()),
            ("m", "2", "r1")
        );
        assert_eq!(r.outputs[0].name, "y");
        assert!(r.parameters.contains(&("k".into(), Param::String("v".into()))));
        assert!(r.parameters.contains(&("timeout".into(), Param::Uint(500))));
        let bad = json!({"model": "m", "parameters": "[1]"});
        assert!(
            request_from(&bad, &[], &shm).is_ok(),
            "a non-object is ignored, not a panic"
        );
        assert!(request_from(&json!({"model": ""}), &[], &shm).is_err());
    }
}
