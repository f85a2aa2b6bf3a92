//! `TRITONSERVER_InferenceRequest`: a request an application builds, and the mesh request it becomes, borrowing the application's input buffers.
use std::ffi::{c_char, c_void, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use mesh::{DataType, InferRequest, NamedTensor, Param, RequestedOutput, Tensor};

use crate::allocator::TRITONSERVER_ResponseAllocator;
use crate::callbacks::{keep_alive, CompleteFn, MESH_ResponseQueue, ReleaseFn, Target};
use crate::error::{Failure, FailureExt};
use crate::live::Live;
use crate::server::{Core, TRITONSERVER_Server, SERVERS};
use crate::types::{dtype_from_raw, memory_type_name, MEMORY_CPU, MEMORY_CPU_PINNED};
use crate::{ffi, out, text, TRITONSERVER_Error};

pub(crate) static REQUESTS: Live = Live::new("inference request");

/// `TRITONSERVER_REQUEST_RELEASE_ALL`.
const RELEASE_ALL: u32 = 1;
/// `TRITONSERVER_REQUEST_FLAG_SEQUENCE_START` / `_END`.
const FLAG_SEQUENCE_START: u32 = 1;
const FLAG_SEQUENCE_END: u32 = 2;
/// The most dims an input may have.
pub(crate) const MAX_DIMS: usize = 64;

/// An input: its description and the application's buffers (not copied).
struct Input {
    name: String,
    dtype: DataType,
    shape: Vec<i64>,
    buffers: Vec<(*const u8, usize)>,
}

/// The correlation id, as a number or a string.
pub(crate) enum Correlation {
    None,
    Int(u64),
    Str(CString),
}

pub struct TRITONSERVER_InferenceRequest {
    core: Arc<Core>,
    model: String,
    version: i64,
    pub(crate) id: CString,
    pub(crate) flags: u32,
    pub(crate) correlation: Correlation,
    pub(crate) priority: u64,
    pub(crate) timeout_us: u64,
    inputs: Vec<Input>,
    outputs: Vec<String>,
    pub(crate) params: Vec<(String, Param)>,
    release: Option<(ReleaseFn, usize)>,
    pub(crate) target: Option<Target>,
    /// The library deletes the request itself once released (`MESH_ServerInferPacked`).
    delete_on_release: bool,
}

/// Gives the request back to the application once nothing of the mesh holds its buffers any more
/// (the last borrowed input dropped): the release callback, called exactly once.
pub(crate) struct Release {
    request: usize,
    callback: Option<(ReleaseFn, usize)>,
    /// Set once the request was accepted: a request refused by `TRITONSERVER_ServerInferAsync`
    /// stays the application's, unreleased.
    armed: AtomicBool,
    /// The response queues the request's callbacks deliver to, kept alive until after the release.
    _queues: Vec<Arc<MESH_ResponseQueue>>,
    /// Deletes the request after its release callback.
    delete: bool,
}

impl Release {
    /// The request was accepted: its release callback will run.
    pub(crate) fn arm(&self) {
        self.armed.store(true, Ordering::Release);
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        if !self.armed.load(Ordering::Acquire) {
            return;
        }
        if let Some((f, userp)) = self.callback {
            // SAFETY: the application's callback with the request and user pointer it registered.
            unsafe { f(self.request as *mut c_void, RELEASE_ALL, userp as *mut c_void) };
        }
        if self.delete {
            let _ = REQUESTS.take(self.request as *mut TRITONSERVER_InferenceRequest);
        }
    }
}

/// A mesh request from the application's, its release kept until the borrowed buffers are dropped
/// (unarmed: the caller arms it once the request is accepted).
pub(crate) fn prepare(
    raw: *mut TRITONSERVER_InferenceRequest,
) -> Result<(InferRequest, Arc<Release>, Target), Failure> {
    let r = REQUESTS.get(raw)?;
    let target = r.target.ok_or_else(|| {
        Failure::invalid("the request has no response callback (TRITONSERVER_InferenceRequestSetResponseCallback)")
    })?;
    if r.release.is_none() {
        return Err(Failure::invalid(
            "the request has no release callback (TRITONSERVER_InferenceRequestSetReleaseCallback)",
        ));
    }
    let release = Arc::new(Release {
        request: raw as usize,
        callback: r.release,
        armed: AtomicBool::new(false),
        _queues: [
            keep_alive(Some(target.complete), None, target.userp),
            r.release.and_then(|(f, userp)| keep_alive(None, Some(f), userp)),
        ]
        .into_iter()
        .flatten()
        .collect(),
        delete: r.delete_on_release,
    });
    let mut inputs = Vec::with_capacity(r.inputs.len());
    for input in &r.inputs {
        let data = match input.buffers.as_slice() {
            [] => Bytes::new(),
            // SAFETY: the application keeps the buffer valid and unchanged until the request's
            // release callback (the header's contract), which runs only once `release` is dropped.
            [(base, len)] => unsafe { mesh_node::embed::lent_bytes(*base, *len, release.clone()) },
            many => {
                // Several pieces become one tensor: copied once, here.
                let mut all = Vec::with_capacity(many.iter().map(|(_, l)| l).sum());
                for (base, len) in many {
                    // SAFETY: the application keeps its buffers valid until the release callback (the header's contract).
                    all.extend_from_slice(unsafe { std::slice::from_raw_parts(*base, *len) });
                }
                Bytes::from(all)
            }
        };
        inputs.push(NamedTensor {
            name: input.name.clone(),
            tensor: Tensor {
                dtype: input.dtype,
                shape: input.shape.clone(),
                data,
            },
        });
    }
    let mut parameters = r.params.clone();
    match &r.correlation {
        Correlation::None => {}
        Correlation::Int(v) => parameters.push(("sequence_id".into(), Param::Uint(*v))),
        Correlation::Str(s) => parameters.push(("sequence_id".into(), Param::String(s.to_string_lossy().into_owned()))),
    }
    if r.flags & FLAG_SEQUENCE_START != 0 {
        parameters.push(("sequence_start".into(), Param::Bool(true)));
    }
    if r.flags & FLAG_SEQUENCE_END != 0 {
        parameters.push(("sequence_end".into(), Param::Bool(true)));
    }
    if r.priority != 0 {
        parameters.push(("priority".into(), Param::Uint(r.priority)));
    }
    if r.timeout_us != 0 {
        parameters.push(("timeout".into(), Param::Uint(r.timeout_us)));
    }
    let request = InferRequest {
        model_name: r.model.clone(),
        model_version: crate::server::version_text(r.version),
        id: r.id.to_string_lossy().into_owned(),
        inputs,
        outputs: r.outputs.iter().map(RequestedOutput::named).collect(),
        parameters,
        client: mesh::Client::Local,
    };
    Ok((request, release, target))
}

/// Runs a setter on a live request.
pub(crate) unsafe fn with_request(
    request: *mut TRITONSERVER_InferenceRequest,
    f: impl FnOnce(&mut TRITONSERVER_InferenceRequest) -> Result<(), Failure>,
) -> *mut TRITONSERVER_Error {
    ffi(|| f(REQUESTS.get(request)?))
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestNew(
    inference_request: *mut *mut TRITONSERVER_InferenceRequest,
    server: *mut TRITONSERVER_Server,
    model_name: *const c_char,
    model_version: i64,
) -> *mut TRITONSERVER_Error {
    ffi(|| {
        let to = out(inference_request, "inference_request")?;
        let core = SERVERS.get(server)?.core.clone();
        core.check_running()?;
        // SAFETY: a NUL-terminated string (the header's contract).
        let model = unsafe { text(model_name, "model_name") }?.to_string();
        *to = REQUESTS.add(Box::new(TRITONSERVER_InferenceRequest {
            core,
            model,
            version: model_version,
            id: CString::default(),
            flags: 0,
            correlation: Correlation::None,
            priority: 0,
            timeout_us: 0,
            inputs: Vec::new(),
            outputs: Vec::new(),
            params: Vec::new(),
            release: None,
            target: None,
            delete_on_release: false,
        }));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestDelete(
    inference_request: *mut TRITONSERVER_InferenceRequest,
) -> *mut TRITONSERVER_Error {
    ffi(|| REQUESTS.take(inference_request).map(drop))
}

impl TRITONSERVER_InferenceRequest {
    /// The server this request was made for.
    pub(crate) fn core(&self) -> &Arc<Core> {
        &self.core
    }

    /// `TRITONSERVER_InferenceRequestAddInput` once its arguments are read.
    pub(crate) fn add_input(&mut self, name: &str, datatype: u32, shape: Vec<i64>) -> Result<(), Failure> {
        let dtype = dtype_from_raw(datatype)
            .ok_or_else(|| Failure::invalid(format!("input '{name}' has an invalid datatype {datatype}")))?;
        if shape.len() > MAX_DIMS {
            return Err(Failure::invalid(format!(
                "input '{name}' has {} dims, more than {MAX_DIMS}",
                shape.len()
            )));
        }
        if self.inputs.iter().any(|i| i.name == name) {
            return Err(Failure::invalid(format!(
                "input '{name}' already exists in request for model '{}'",
                self.model
            )));
        }
        self.inputs.push(Input {
            name: name.to_string(),
            dtype,
            shape,
            buffers: Vec::new(),
        });
        Ok(())
    }

    /// `TRITONSERVER_InferenceRequestAppendInputData` once its arguments are read: the buffer is
    /// borrowed, not copied (the application keeps it until the release callback).
    pub(crate) fn append_input_data(
        &mut self,
        name: &str,
        base: *const c_void,
        byte_size: usize,
        memory_type: u32,
        memory_type_id: i64,
    ) -> Result<(), Failure> {
        if memory_type != MEMORY_CPU && memory_type != MEMORY_CPU_PINNED {
            return Err(Failure::unsupported(format!(
                "input '{name}': {} memory (id {memory_type_id}) is not supported by the mesh's in-process API; \
                 pass CPU memory",
                memory_type_name(memory_type).to_string_lossy()
            )));
        }
        if base.is_null() && byte_size > 0 {
            return Err(Failure::invalid(format!("input '{name}': base is null")));
        }
        let input = self.input(name)?;
        if byte_size > 0 {
            input.buffers.push((base.cast(), byte_size));
        }
        Ok(())
    }

    /// Removes an input added by a call that then failed (so a refused call leaves no half of itself).
    pub(crate) fn drop_inputs_after(&mut self, count: usize) {
        self.inputs.truncate(count);
    }

    pub(crate) fn input_count(&self) -> usize {
        self.inputs.len()
    }

    /// Sets both callbacks at once, and whether the request deletes itself once released (the
    /// one-call send of `packed.rs`).
    pub(crate) fn set_callbacks(&mut self, release: (ReleaseFn, usize), target: Target, delete_on_release: bool) {
        self.release = Some(release);
        self.target = Some(target);
        self.delete_on_release = delete_on_release;
    }

    /// Undoes `set_callbacks` after a refusal: no callbacks, and the request is the application's.
    pub(crate) fn forget_callbacks(&mut self) {
        self.release = None;
        self.target = None;
        self.delete_on_release = false;
    }

    fn input(&mut self, name: &str) -> Result<&mut Input, Failure> {
        let model = &self.model;
        self.inputs.iter_mut().find(|i| i.name == name).ok_or_else(|| {
            Failure::invalid(format!(
                "input '{name}' does not exist in request for model '{model}' (add it with TRITONSERVER_InferenceRequestAddInput)"
            ))
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestAddInput(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    name: *const c_char,
    datatype: u32,
    shape: *const i64,
    dim_count: u64,
) -> *mut TRITONSERVER_Error {
    // SAFETY: a NUL-terminated string and `dim_count` dims at `shape` (the header's contract).
    let name = unsafe { text(name, "name") };
    // SAFETY: the pointers are the caller's, under the header's contract; handles are checked alive first.
    unsafe {
        with_request(inference_request, |r| {
            let name = name?;
            let dims = usize::try_from(dim_count)
                .ok()
                .filter(|d| *d <= MAX_DIMS)
                .ok_or_else(|| {
                    Failure::invalid(format!("input '{name}' has {dim_count} dims, more than {MAX_DIMS}"))
                })?;
            let shape = match dims {
                0 => Vec::new(),
                _ if shape.is_null() => return Err(Failure::invalid(format!("the shape of input '{name}' is null"))),
                _ => std::slice::from_raw_parts(shape, dims).to_vec(),
            };
            r.add_input(name, datatype, shape)
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestRemoveInput(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    name: *const c_char,
) -> *mut TRITONSERVER_Error {
    // SAFETY: a NUL-terminated string (the header's contract); see `with_request`.
    let name = unsafe { text(name, "name") };
    // SAFETY: the pointers are the caller's, under the header's contract; handles are checked alive first.
    unsafe {
        with_request(inference_request, |r| {
            let name = name?;
            r.input(name)?;
            r.inputs.retain(|i| i.name != name);
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestRemoveAllInputs(
    inference_request: *mut TRITONSERVER_InferenceRequest,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `with_request`.
    unsafe {
        with_request(inference_request, |r| {
            r.inputs.clear();
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestAppendInputData(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    name: *const c_char,
    base: *const c_void,
    byte_size: usize,
    memory_type: u32,
    memory_type_id: i64,
) -> *mut TRITONSERVER_Error {
    // SAFETY: a NUL-terminated string (the header's contract); see `with_request`.
    let name = unsafe { text(name, "name") };
    // SAFETY: the pointers are the caller's, under the header's contract; handles are checked alive first.
    unsafe {
        with_request(inference_request, |r| {
            r.append_input_data(name?, base, byte_size, memory_type, memory_type_id)
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestAppendInputDataWithHostPolicy(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    name: *const c_char,
    base: *const c_void,
    byte_size: usize,
    memory_type: u32,
    memory_type_id: i64,
    _host_policy_name: *const c_char,
) -> *mut TRITONSERVER_Error {
    // Host policies place data for NUMA nodes; the mesh has one copy of each input.
    // SAFETY: as TRITONSERVER_InferenceRequestAppendInputData.
    unsafe {
        TRITONSERVER_InferenceRequestAppendInputData(
            inference_request,
            name,
            base,
            byte_size,
            memory_type,
            memory_type_id,
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestRemoveAllInputData(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    name: *const c_char,
) -> *mut TRITONSERVER_Error {
    // SAFETY: a NUL-terminated string (the header's contract); see `with_request`.
    let name = unsafe { text(name, "name") };
    // SAFETY: the pointers are the caller's, under the header's contract; handles are checked alive first.
    unsafe {
        with_request(inference_request, |r| {
            r.input(name?)?.buffers.clear();
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestAddRequestedOutput(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    name: *const c_char,
) -> *mut TRITONSERVER_Error {
    // SAFETY: a NUL-terminated string (the header's contract); see `with_request`.
    let name = unsafe { text(name, "name") };
    // SAFETY: the pointers are the caller's, under the header's contract; handles are checked alive first.
    unsafe {
        with_request(inference_request, |r| {
            let name = name?;
            if !r.outputs.iter().any(|o| o == name) {
                r.outputs.push(name.to_string());
            }
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestRemoveRequestedOutput(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    name: *const c_char,
) -> *mut TRITONSERVER_Error {
    // SAFETY: a NUL-terminated string (the header's contract); see `with_request`.
    let name = unsafe { text(name, "name") };
    // SAFETY: the pointers are the caller's, under the header's contract; handles are checked alive first.
    unsafe {
        with_request(inference_request, |r| {
            let name = name?;
            if !r.outputs.iter().any(|o| o == name) {
                return Err(Failure::invalid(format!(
                    "output '{name}' does not exist in request for model '{}'",
                    r.model
                )));
            }
            r.outputs.retain(|o| o != name);
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestRemoveAllRequestedOutputs(
    inference_request: *mut TRITONSERVER_InferenceRequest,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `with_request`.
    unsafe {
        with_request(inference_request, |r| {
            r.outputs.clear();
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestSetReleaseCallback(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    request_release_fn: Option<ReleaseFn>,
    request_release_userp: *mut c_void,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `with_request`.
    unsafe {
        with_request(inference_request, |r| {
            let f = request_release_fn.ok_or_else(|| Failure::invalid("request_release_fn is null"))?;
            r.release = Some((f, request_release_userp as usize));
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestSetResponseCallback(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    response_allocator: *mut TRITONSERVER_ResponseAllocator,
    response_allocator_userp: *mut c_void,
    response_fn: Option<CompleteFn>,
    response_userp: *mut c_void,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `with_request`.
    unsafe {
        with_request(inference_request, |r| {
            let complete = response_fn.ok_or_else(|| Failure::invalid("response_fn is null"))?;
            // SAFETY: an allocator this library made, alive while requests use it (the header's contract).
            let allocator = response_allocator.as_ref().copied();
            r.target = Some(Target {
                allocator,
                allocator_raw: response_allocator as usize,
                allocator_userp: response_allocator_userp as usize,
                complete,
                userp: response_userp as usize,
                hold_outputs: false,
            });
            Ok(())
        })
    }
}
