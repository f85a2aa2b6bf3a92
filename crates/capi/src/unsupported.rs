//! The header's functions the mesh does not serve in process: each returns UNSUPPORTED naming itself (or, where the header returns no error, a neutral value).
use std::ffi::{c_char, c_void};

use crate::error::{Failure, FailureExt};
use crate::TRITONSERVER_Error;

/// The error every function here returns.
fn unsupported(name: &str, instead: &str) -> *mut TRITONSERVER_Error {
    Failure::unsupported(format!(
        "{name} is not supported by the mesh's libtritonserver{instead}"
    ))
    .into_raw()
}

/// Exported functions that take any arguments and answer UNSUPPORTED. Their parameters are
/// declared as the header declares them, so callers see the same ABI.
macro_rules! unsupported {
    ($($name:ident($($arg:ident: $ty:ty),*) $instead:literal;)*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> *mut TRITONSERVER_Error {
            $(let _ = $arg;)*
            unsupported(stringify!($name), $instead)
        }
    )*};
}

type P = *mut c_void;
type S = *const c_char;

unsupported! {
    TRITONSERVER_InferenceTraceNew(trace: *mut P, level: u32, parent_id: u64, activity_fn: P, release_fn: P, userp: P) "";
    TRITONSERVER_InferenceTraceTensorNew(trace: *mut P, level: u32, parent_id: u64, activity_fn: P, tensor_activity_fn: P, release_fn: P, userp: P) "";
    TRITONSERVER_InferenceTraceReportActivity(trace: P, timestamp: u64, activity_name: S) "";
    TRITONSERVER_InferenceTraceDelete(trace: P) "";
    TRITONSERVER_InferenceTraceId(trace: P, id: *mut u64) "";
    TRITONSERVER_InferenceTraceParentId(trace: P, parent_id: *mut u64) "";
    TRITONSERVER_InferenceTraceModelName(trace: P, model_name: *mut S) "";
    TRITONSERVER_InferenceTraceModelVersion(trace: P, model_version: *mut i64) "";
    TRITONSERVER_InferenceTraceRequestId(trace: P, request_id: *mut S) "";
    TRITONSERVER_InferenceTraceSpawnChildTrace(trace: P, child_trace: *mut P) "";
    TRITONSERVER_InferenceTraceSetContext(trace: P, trace_context: S) "";
    TRITONSERVER_InferenceTraceContext(trace: P, trace_context: *mut S) "";
    TRITONSERVER_InferenceRequestCancel(request: P) " (a request runs to its end once sent)";
    TRITONSERVER_InferenceRequestIsCancelled(request: P, is_cancelled: *mut bool) "";
    TRITONSERVER_InferenceRequestAddRawInput(request: P, name: S) " (add the input with its datatype and shape: TRITONSERVER_InferenceRequestAddInput)";
    TRITONSERVER_InferenceRequestAppendInputDataWithBufferAttributes(request: P, name: S, base: *const c_void, attributes: P) " (use TRITONSERVER_InferenceRequestAppendInputData with CPU memory)";
    TRITONSERVER_ServerSetExitTimeout(server: P, timeout: u32) " after start (use TRITONSERVER_ServerOptionsSetExitTimeout)";
    TRITONSERVER_ServerRegisterModelRepository(server: P, repository_path: S, name_mapping: *const P, mapping_count: u32) " (name the repositories in the options)";
    TRITONSERVER_ServerUnregisterModelRepository(server: P, repository_path: S) "";
    TRITONSERVER_ServerPollModelRepository(server: P) " (use the EXPLICIT control mode and load models)";
    TRITONSERVER_MetricFamilyNew(family: *mut P, kind: u32, name: S, description: S) " (custom metrics come from Python models' pb_utils.MetricFamily)";
    TRITONSERVER_MetricFamilyDelete(family: P) "";
    TRITONSERVER_GetMetricFamilyKind(family: P, kind: *mut u32) "";
    TRITONSERVER_MetricArgsNew(args: *mut P) "";
    TRITONSERVER_MetricArgsSetHistogram(args: P, buckets: *const f64, buckets_count: u64) "";
    TRITONSERVER_MetricArgsDelete(args: P) "";
    TRITONSERVER_MetricNew(metric: *mut P, family: P, labels: *const P, label_count: u64) "";
    TRITONSERVER_MetricNewWithArgs(metric: *mut P, family: P, labels: *const P, label_count: u64, args: *const c_void) "";
    TRITONSERVER_MetricDelete(metric: P) "";
    TRITONSERVER_MetricValue(metric: P, value: *mut f64) "";
    TRITONSERVER_MetricIncrement(metric: P, value: f64) "";
    TRITONSERVER_MetricSet(metric: P, value: f64) "";
    TRITONSERVER_MetricObserve(metric: P, value: f64) "";
    TRITONSERVER_GetMetricKind(metric: P, kind: *mut u32) "";
    TRITONSERVER_BufferAttributesNew(attributes: *mut P) " (buffers are plain CPU memory here)";
    TRITONSERVER_BufferAttributesDelete(attributes: P) "";
    TRITONSERVER_BufferAttributesSetMemoryTypeId(attributes: P, memory_type_id: i64) "";
    TRITONSERVER_BufferAttributesSetMemoryType(attributes: P, memory_type: u32) "";
    TRITONSERVER_BufferAttributesSetCudaIpcHandle(attributes: P, cuda_ipc_handle: P) "";
    TRITONSERVER_BufferAttributesSetByteSize(attributes: P, byte_size: usize) "";
    TRITONSERVER_BufferAttributesMemoryTypeId(attributes: P, memory_type_id: *mut i64) "";
    TRITONSERVER_BufferAttributesMemoryType(attributes: P, memory_type: *mut u32) "";
    TRITONSERVER_BufferAttributesCudaIpcHandle(attributes: P, cuda_ipc_handle: *mut P) "";
    TRITONSERVER_BufferAttributesByteSize(attributes: P, byte_size: *mut usize) "";
}

/// The names of the trace levels and activities, which the header returns without an error.
#[no_mangle]
pub extern "C" fn TRITONSERVER_InferenceTraceLevelString(level: u32) -> *const c_char {
    match level {
        0 => c"DISABLED",
        1 => c"MIN",
        2 => c"MAX",
        4 => c"TIMESTAMPS",
        8 => c"TENSORS",
        _ => c"<unknown>",
    }
    .as_ptr()
}

#[no_mangle]
pub extern "C" fn TRITONSERVER_InferenceTraceActivityString(activity: u32) -> *const c_char {
    match activity {
        0 => c"REQUEST_START",
        1 => c"QUEUE_START",
        2 => c"COMPUTE_START",
        3 => c"COMPUTE_INPUT_END",
        4 => c"COMPUTE_OUTPUT_START",
        5 => c"COMPUTE_END",
        6 => c"REQUEST_END",
        7 => c"TENSOR_QUEUE_INPUT",
        8 => c"TENSOR_BACKEND_INPUT",
        9 => c"TENSOR_BACKEND_OUTPUT",
        10 => c"CUSTOM_ACTIVITY",
        _ => c"<unknown>",
    }
    .as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    #[test]
    fn an_unsupported_function_names_itself_and_crashes_nothing() {
        // SAFETY: every argument is ignored.
        let e = unsafe { TRITONSERVER_ServerPollModelRepository(std::ptr::null_mut()) };
        // SAFETY: `e` is an error this library made.
        unsafe {
            assert_eq!(crate::error::TRITONSERVER_ErrorCode(e), 5);
            let m = CStr::from_ptr(crate::error::TRITONSERVER_ErrorMessage(e))
                .to_str()
                .unwrap();
            assert!(
                m.starts_with("TRITONSERVER_ServerPollModelRepository is not supported"),
                "{m}"
            );
            crate::error::TRITONSERVER_ErrorDelete(e);
        }
    }
}
