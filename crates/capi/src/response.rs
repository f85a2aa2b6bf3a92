//! Answers: `TRITONSERVER_ServerInferAsync` runs a request, and each answer becomes a `TRITONSERVER_InferenceResponse` whose outputs the application's allocator holds.
use std::ffi::{c_char, c_void, CString};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use mesh::stream::{stream_channel, Window};
use mesh::InferResponse;
use mesh_node::serving::admit::{Admission, Replies};
use mesh_node::serving::dispatch::NodeDispatch;

use crate::allocator::{ReleaseBufferFn, TRITONSERVER_ResponseAllocator};
use crate::callbacks::Target;
use crate::error::{from_mesh, take, Failure, FailureExt};
use crate::live::Live;
use crate::message::{c_string, ParameterValue, TRITONSERVER_Parameter};
use crate::request::{prepare, Release, TRITONSERVER_InferenceRequest};
use crate::server::{TRITONSERVER_Server, SERVERS};
use crate::task::{OnPanic, Task};
use crate::types::{dtype_to_raw, memory_type_name, MEMORY_CPU, MEMORY_CPU_PINNED};
use crate::{ffi, out, TRITONSERVER_Error};

pub(crate) static RESPONSES: Live = Live::new("inference response");

/// `TRITONSERVER_RESPONSE_COMPLETE_FINAL`.
const COMPLETE_FINAL: u32 = 1;

/// One output, in a buffer of the application's allocator.
pub(crate) struct Output {
    pub(crate) name: CString,
    pub(crate) dtype: u32,
    pub(crate) shape: Vec<i64>,
    pub(crate) base: usize,
    pub(crate) size: usize,
    pub(crate) memory_type: u32,
    pub(crate) memory_type_id: i64,
    buffer_userp: usize,
    /// The answer's own bytes (at `base`) while the output waits to be placed (`held.rs`).
    pub(crate) held: Option<bytes::Bytes>,
}

impl Output {
    /// An output left where the model's answer put it, held until it is placed.
    fn held(t: mesh::NamedTensor) -> Self {
        Output {
            name: c_string(&t.name),
            dtype: dtype_to_raw(t.tensor.dtype),
            shape: t.tensor.shape,
            base: t.tensor.data.as_ptr() as usize,
            size: t.tensor.data.len(),
            memory_type: MEMORY_CPU,
            memory_type_id: 0,
            buffer_userp: 0,
            held: Some(t.tensor.data),
        }
    }
}

pub struct TRITONSERVER_InferenceResponse {
    model: CString,
    version: i64,
    pub(crate) id: CString,
    pub(crate) error: Option<Failure>,
    pub(crate) outputs: Vec<Output>,
    pub(crate) parameters: Vec<TRITONSERVER_Parameter>,
    /// Gives the output buffers back when the response is deleted.
    release: Option<(ReleaseBufferFn, usize)>,
    /// The whole response as one record (`MESH_ResponseQueuePopMany` hands it out), made when first asked for.
    pub(crate) packed: std::sync::OnceLock<Vec<u8>>,
}

impl Drop for TRITONSERVER_InferenceResponse {
    fn drop(&mut self) {
        let Some((release, allocator)) = self.release else {
            return;
        };
        for o in self.outputs.drain(..) {
            // SAFETY: the application's release callback, with what its alloc callback answered.
            let e = unsafe {
                release(
                    allocator as *mut _,
                    o.base as *mut c_void,
                    o.buffer_userp as *mut c_void,
                    o.size,
                    o.memory_type,
                    o.memory_type_id,
                )
            };
            // SAFETY: an error the callback made with TRITONSERVER_ErrorNew.
            if let Some(e) = unsafe { take(e) } {
                tracing::warn!(
                    "the response allocator failed to release output '{}': {}",
                    o.name.to_string_lossy(),
                    e.message.to_string_lossy()
                );
            }
        }
    }
}

impl TRITONSERVER_InferenceResponse {
    fn failed(model: &str, id: &str, error: Failure) -> Self {
        TRITONSERVER_InferenceResponse {
            model: c_string(model),
            version: -1,
            id: c_string(id),
            error: Some(error),
            outputs: Vec::new(),
            parameters: Vec::new(),
            release: None,
            packed: Default::default(),
        }
    }

    /// A request's outcome as a response: its answer, or its error.
    fn of(result: mesh::Result<InferResponse>, target: &Target, model: &str, id: &str) -> Self {
        match result {
            Ok(answer) => Self::build(answer, target),
            Err(e) => Self::failed(model, id, from_mesh(e)),
        }
    }

    /// An answer with its outputs copied into buffers of the application's allocator (or held, for
    /// `hold_outputs`); an allocator error (or no allocator) makes it an error response, as in Triton.
    pub(crate) fn build(answer: InferResponse, target: &Target) -> Self {
        let mut response = TRITONSERVER_InferenceResponse {
            model: c_string(&answer.model_name),
            version: answer.model_version.parse().unwrap_or(-1),
            id: c_string(&answer.id),
            error: None,
            outputs: Vec::with_capacity(answer.outputs.len()),
            parameters: answer
                .parameters
                .iter()
                .map(|(k, v)| TRITONSERVER_Parameter {
                    name: c_string(k),
                    value: ParameterValue::from_param(v),
                })
                .collect(),
            release: None,
            packed: Default::default(),
        };
        if answer.outputs.is_empty() {
            return response;
        }
        if target.hold_outputs {
            response.outputs = answer.outputs.into_iter().map(Output::held).collect();
            return response;
        }
        let Some(allocator) = target.allocator else {
            response.error = Some(Failure::invalid("the request has outputs but no response allocator"));
            return response;
        };
        response.release = Some((allocator.release, target.allocator_raw));
        if let Err(e) = response.fill(&answer, &allocator, target) {
            response.error = Some(e);
        }
        response
    }

    fn fill(
        &mut self,
        answer: &InferResponse,
        allocator: &TRITONSERVER_ResponseAllocator,
        target: &Target,
    ) -> Result<(), Failure> {
        let raw = target.allocator_raw as *mut TRITONSERVER_ResponseAllocator;
        let userp = target.allocator_userp as *mut c_void;
        if let Some(start) = allocator.start {
            // SAFETY: the application's callback with its allocator and user pointer.
            if let Some(e) = unsafe { take(start(raw, userp)) } {
                return Err(e);
            }
        }
        for t in &answer.outputs {
            let name = c_string(&t.name);
            let data = &t.tensor.data;
            let (mut base, mut buffer_userp) = (std::ptr::null_mut::<c_void>(), std::ptr::null_mut::<c_void>());
            let (mut memory_type, mut memory_type_id) = (MEMORY_CPU, 0i64);
            // SAFETY: the application's alloc callback, with out-pointers to locals.
            let e = unsafe {
                (allocator.alloc)(
                    raw,
                    name.as_ptr(),
                    data.len(),
                    MEMORY_CPU,
                    0,
                    userp,
                    &mut base,
                    &mut buffer_userp,
                    &mut memory_type,
                    &mut memory_type_id,
                )
            };
            // SAFETY: an error the callback made with TRITONSERVER_ErrorNew.
            if let Some(e) = unsafe { take(e) } {
                return Err(e);
            }
            let output = Output {
                name,
                dtype: dtype_to_raw(t.tensor.dtype),
                shape: t.tensor.shape.clone(),
                base: base as usize,
                size: data.len(),
                memory_type,
                memory_type_id,
                buffer_userp: buffer_userp as usize,
                held: None,
            };
            let usable = memory_type == MEMORY_CPU || memory_type == MEMORY_CPU_PINNED;
            let missing = base.is_null() && !data.is_empty();
            let name = output.name.to_string_lossy().into_owned();
            self.outputs.push(output); // released with the response, whatever happens next
            if !usable {
                return Err(Failure::unsupported(format!(
                    "output '{name}': the allocator answered {} memory; the mesh's in-process API writes outputs to CPU memory",
                    memory_type_name(memory_type).to_string_lossy()
                )));
            }
            if missing {
                return Err(Failure::internal(format!(
                    "output '{name}': the allocator answered no buffer"
                )));
            }
            if !data.is_empty() {
                // SAFETY: the allocator answered a CPU buffer of at least `data.len()` bytes.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), base.cast::<u8>(), data.len()) };
            }
        }
        Ok(())
    }
}

/// Hands one answer to the application's callback (a null response: a decoupled model's end).
fn complete(target: &Target, response: Option<TRITONSERVER_InferenceResponse>, flags: u32) {
    let raw = response.map_or(std::ptr::null_mut(), |r| RESPONSES.add(Box::new(r)));
    // SAFETY: the application's callback, given the response (now the application's) and its user pointer.
    unsafe { (target.complete)(raw.cast(), flags, target.userp as *mut c_void) };
}

/// Where one request's answers go, and whether its final one went: shared by its task and by the
/// answer a panic inside the task still owes.
struct Answers {
    target: Target,
    model: String,
    id: String,
    finished: AtomicBool,
}

impl Answers {
    /// The request's outcome as a response.
    fn response(&self, result: mesh::Result<InferResponse>) -> TRITONSERVER_InferenceResponse {
        TRITONSERVER_InferenceResponse::of(result, &self.target, &self.model, &self.id)
    }

    /// Hands one answer to the application; a final one goes once at most.
    fn send(&self, response: Option<TRITONSERVER_InferenceResponse>, flags: u32) {
        if flags & COMPLETE_FINAL != 0 && self.finished.swap(true, Ordering::AcqRel) {
            return;
        }
        complete(&self.target, response, flags);
    }

    /// Ends the request with an INTERNAL error, unless its final answer went already.
    fn fail(&self, message: &str) {
        let e = Failure::internal(message);
        self.send(
            Some(TRITONSERVER_InferenceResponse::failed(&self.model, &self.id, e)),
            COMPLETE_FINAL,
        );
    }
}

/// A streamed request: each answer to the callback as it comes, the final flag last.
async fn stream(dispatch: Arc<NodeDispatch>, admission: Admission, answers: Arc<Answers>, release: Arc<Release>) {
    let (tx, mut rx) = stream_channel(Window::for_stream());
    let forward = async {
        while let Some(item) = rx.recv().await {
            let flags = if item.last { COMPLETE_FINAL } else { 0 };
            let response = item.response.map(|r| answers.response(r));
            if response.is_some() || item.last {
                answers.send(response, flags);
            }
            if item.last {
                return true;
            }
        }
        false
    };
    let (_, finished) = tokio::join!(dispatch.infer_stream_admitted(admission, tx), forward);
    if !finished {
        answers.fail("the request ended without a final answer (a bug)");
    }
    drop(release); // released now, unless an input is still borrowed somewhere
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerInferAsync(
    server: *mut TRITONSERVER_Server,
    inference_request: *mut TRITONSERVER_InferenceRequest,
    trace: *mut c_void,
) -> *mut TRITONSERVER_Error {
    ffi(|| {
        let core = SERVERS.get(server)?.core.clone();
        core.check_running()?;
        if !trace.is_null() {
            return Err(Failure::unsupported(
                "inference tracing through the C API (TRITONSERVER_InferenceTrace) is not supported by the mesh",
            ));
        }
        let (request, release, target) = prepare(inference_request)?;
        // SAFETY: `prepare` checked the request is alive.
        if !std::sync::Arc::ptr_eq(unsafe { (*inference_request).core() }, &core) {
            return Err(Failure::invalid("the request was made for another server"));
        }
        // As Triton does before it takes a request: the parameters, every input's bytes, the
        // model, every input's name, datatype and shape. Admitted here, once: the node runs the
        // admission as it is. A refused request stays the application's, unreleased.
        let admission = core.dispatch.admit_local(request, Replies::Stream).map_err(from_mesh)?;
        release.arm();
        // A decoupled model (or an ensemble with a decoupled step) answers through a stream; any
        // other model answers once.
        let streamed = admission.decoupled();
        let dispatch = core.dispatch.clone();
        let answers = Arc::new(Answers {
            target,
            model: admission.model_name().to_string(),
            id: admission.request_id().to_string(),
            finished: AtomicBool::new(false),
        });
        let on_panic: OnPanic = {
            let (answers, release) = (answers.clone(), release.clone()); // released after this answer
            Box::new(move || {
                answers.fail("the request failed inside the server (a bug); see the log");
                drop(release);
            })
        };
        let task: Task = if streamed {
            Box::pin(stream(dispatch, admission, answers, release))
        } else {
            Box::pin(async move {
                let response = answers.response(dispatch.infer_admitted(admission).await);
                answers.send(Some(response), COMPLETE_FINAL);
                drop(release); // released now, unless an input is still borrowed somewhere
            })
        };
        // Accepted: from here on, whatever happens is answered through the callbacks.
        crate::task::run(&core.runtime, task, on_panic);
        Ok(())
    })
}

/// The `index`-th of a response's parameters or outputs; past the end is INVALID_ARG.
fn nth<'a, T>(items: &'a [T], index: u32, what: &str) -> Result<&'a T, Failure> {
    items.get(index as usize).ok_or_else(|| {
        Failure::invalid(format!(
            "out of bounds index {index}: response has {} {what}",
            items.len()
        ))
    })
}

/// Runs a reader on a live response.
unsafe fn with_response(
    response: *mut TRITONSERVER_InferenceResponse,
    f: impl FnOnce(&TRITONSERVER_InferenceResponse) -> Result<(), Failure>,
) -> *mut TRITONSERVER_Error {
    ffi(|| f(RESPONSES.get(response)?))
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceResponseDelete(
    inference_response: *mut TRITONSERVER_InferenceResponse,
) -> *mut TRITONSERVER_Error {
    ffi(|| RESPONSES.take(inference_response).map(drop))
}

/// The response's error, owned by the response (the application must not delete it).
#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceResponseError(
    inference_response: *mut TRITONSERVER_InferenceResponse,
) -> *mut TRITONSERVER_Error {
    match RESPONSES.get(inference_response) {
        Ok(r) => r
            .error
            .as_deref()
            .map_or(std::ptr::null_mut(), |e| e as *const _ as *mut _),
        // A dead handle's "error" is a new one, which the application owns and deletes.
        Err(e) => e.into_raw(),
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceResponseModel(
    inference_response: *mut TRITONSERVER_InferenceResponse,
    model_name: *mut *const c_char,
    model_version: *mut i64,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `with_response`.
    unsafe {
        with_response(inference_response, |r| {
            *out(model_name, "model_name")? = r.model.as_ptr();
            *out(model_version, "model_version")? = r.version;
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceResponseId(
    inference_response: *mut TRITONSERVER_InferenceResponse,
    request_id: *mut *const c_char,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `with_response`.
    unsafe {
        with_response(inference_response, |r| {
            *out(request_id, "request_id")? = r.id.as_ptr();
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceResponseParameterCount(
    inference_response: *mut TRITONSERVER_InferenceResponse,
    count: *mut u32,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `with_response`.
    unsafe {
        with_response(inference_response, |r| {
            *out(count, "count")? = r.parameters.len() as u32;
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceResponseParameter(
    inference_response: *mut TRITONSERVER_InferenceResponse,
    index: u32,
    name: *mut *const c_char,
    kind: *mut u32,
    vvalue: *mut *const c_void,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `with_response`.
    unsafe {
        with_response(inference_response, |r| {
            let p = nth(&r.parameters, index, "parameters")?;
            let (t, v) = p.value.raw();
            *out(name, "name")? = p.name.as_ptr();
            *out(kind, "type")? = t;
            *out(vvalue, "vvalue")? = v;
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceResponseOutputCount(
    inference_response: *mut TRITONSERVER_InferenceResponse,
    count: *mut u32,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `with_response`.
    unsafe {
        with_response(inference_response, |r| {
            *out(count, "count")? = r.outputs.len() as u32;
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceResponseOutput(
    inference_response: *mut TRITONSERVER_InferenceResponse,
    index: u32,
    name: *mut *const c_char,
    datatype: *mut u32,
    shape: *mut *const i64,
    dim_count: *mut u64,
    base: *mut *const c_void,
    byte_size: *mut usize,
    memory_type: *mut u32,
    memory_type_id: *mut i64,
    userp: *mut *mut c_void,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `with_response`.
    unsafe {
        with_response(inference_response, |r| {
            let o = nth(&r.outputs, index, "outputs")?;
            *out(name, "name")? = o.name.as_ptr();
            *out(datatype, "datatype")? = o.dtype;
            *out(shape, "shape")? = o.shape.as_ptr();
            *out(dim_count, "dim_count")? = o.shape.len() as u64;
            *out(base, "base")? = o.base as *const c_void;
            *out(byte_size, "byte_size")? = o.size;
            *out(memory_type, "memory_type")? = o.memory_type;
            *out(memory_type_id, "memory_type_id")? = o.memory_type_id;
            *out(userp, "userp")? = o.buffer_userp as *mut c_void;
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceResponseOutputClassificationLabel(
    inference_response: *mut TRITONSERVER_InferenceResponse,
    index: u32,
    class_index: usize,
    label: *mut *const c_char,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `with_response`.
    unsafe {
        with_response(inference_response, |r| {
            nth(&r.outputs, index, "outputs")?;
            // The mesh keeps no label files per output here: no label, as Triton answers for an
            // output without labels.
            let _ = class_index;
            *out(label, "label")? = std::ptr::null();
            Ok(())
        })
    }
}
