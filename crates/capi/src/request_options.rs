//! A request's id, flags, correlation id, priority, timeout and parameters (`TRITONSERVER_InferenceRequest*` getters and setters).
use std::ffi::c_char;

use mesh::Param;

use crate::error::{Failure, FailureExt};
use crate::message::c_string;
use crate::request::{with_request, Correlation, TRITONSERVER_InferenceRequest};
use crate::{out, text, TRITONSERVER_Error};

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestId(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    id: *mut *const c_char,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `with_request`.
    unsafe {
        with_request(inference_request, |r| {
            *out(id, "id")? = r.id.as_ptr();
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestSetId(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    id: *const c_char,
) -> *mut TRITONSERVER_Error {
    // SAFETY: a NUL-terminated string (the header's contract); see `with_request`.
    let id = unsafe { text(id, "id") };
    // SAFETY: the pointers are the caller's, under the header's contract; handles are checked alive first.
    unsafe {
        with_request(inference_request, |r| {
            r.id = c_string(id?);
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestFlags(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    flags: *mut u32,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `with_request`.
    unsafe {
        with_request(inference_request, |r| {
            *out(flags, "flags")? = r.flags;
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestSetFlags(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    flags: u32,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `with_request`.
    unsafe {
        with_request(inference_request, |r| {
            r.flags = flags;
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestCorrelationId(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    correlation_id: *mut u64,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `with_request`.
    unsafe {
        with_request(inference_request, |r| match r.correlation {
            Correlation::Str(_) => Err(Failure::invalid("the correlation id of this request is a string")),
            Correlation::Int(v) => {
                *out(correlation_id, "correlation_id")? = v;
                Ok(())
            }
            Correlation::None => {
                *out(correlation_id, "correlation_id")? = 0;
                Ok(())
            }
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestCorrelationIdString(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    correlation_id: *mut *const c_char,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `with_request`.
    unsafe {
        with_request(inference_request, |r| match &r.correlation {
            Correlation::Str(s) => {
                *out(correlation_id, "correlation_id")? = s.as_ptr();
                Ok(())
            }
            _ => Err(Failure::invalid("the correlation id of this request is not a string")),
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestSetCorrelationId(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    correlation_id: u64,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `with_request`.
    unsafe {
        with_request(inference_request, |r| {
            r.correlation = Correlation::Int(correlation_id);
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestSetCorrelationIdString(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    correlation_id: *const c_char,
) -> *mut TRITONSERVER_Error {
    // SAFETY: a NUL-terminated string (the header's contract); see `with_request`.
    let id = unsafe { text(correlation_id, "correlation_id") };
    // SAFETY: the pointers are the caller's, under the header's contract; handles are checked alive first.
    unsafe {
        with_request(inference_request, |r| {
            r.correlation = Correlation::Str(c_string(id?));
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestPriority(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    priority: *mut u32,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `with_request`.
    unsafe {
        with_request(inference_request, |r| {
            *out(priority, "priority")? = r.priority as u32;
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestPriorityUInt64(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    priority: *mut u64,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `with_request`.
    unsafe {
        with_request(inference_request, |r| {
            *out(priority, "priority")? = r.priority;
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestSetPriority(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    priority: u32,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `with_request`.
    unsafe {
        with_request(inference_request, |r| {
            r.priority = u64::from(priority);
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestSetPriorityUInt64(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    priority: u64,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `with_request`.
    unsafe {
        with_request(inference_request, |r| {
            r.priority = priority;
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestTimeoutMicroseconds(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    timeout_us: *mut u64,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `with_request`.
    unsafe {
        with_request(inference_request, |r| {
            *out(timeout_us, "timeout_us")? = r.timeout_us;
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestSetTimeoutMicroseconds(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    timeout_us: u64,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `with_request`.
    unsafe {
        with_request(inference_request, |r| {
            r.timeout_us = timeout_us;
            Ok(())
        })
    }
}

/// `Set*Parameter`: request parameters, as a client's `parameters`.
unsafe fn set_parameter(
    request: *mut TRITONSERVER_InferenceRequest,
    key: *const c_char,
    value: Result<Param, Failure>,
) -> *mut TRITONSERVER_Error {
    // SAFETY: a NUL-terminated string (the header's contract); see `with_request`.
    let key = unsafe { text(key, "key") };
    // SAFETY: the pointers are the caller's, under the header's contract; handles are checked alive first.
    unsafe {
        with_request(request, |r| {
            let (key, value) = (key?, value?);
            r.params.retain(|(k, _)| k != key);
            r.params.push((key.to_string(), value));
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestSetStringParameter(
    request: *mut TRITONSERVER_InferenceRequest,
    key: *const c_char,
    value: *const c_char,
) -> *mut TRITONSERVER_Error {
    // SAFETY: a NUL-terminated string (the header's contract).
    let value = unsafe { text(value, "value") }.map(|v| Param::String(v.to_string()));
    // SAFETY: the pointers are the caller's, under the header's contract; handles are checked alive first.
    unsafe { set_parameter(request, key, value) }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestSetIntParameter(
    request: *mut TRITONSERVER_InferenceRequest,
    key: *const c_char,
    value: i64,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `set_parameter`.
    unsafe { set_parameter(request, key, Ok(Param::Int(value))) }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestSetBoolParameter(
    request: *mut TRITONSERVER_InferenceRequest,
    key: *const c_char,
    value: bool,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `set_parameter`.
    unsafe { set_parameter(request, key, Ok(Param::Bool(value))) }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestSetDoubleParameter(
    request: *mut TRITONSERVER_InferenceRequest,
    key: *const c_char,
    value: f64,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `set_parameter`.
    unsafe { set_parameter(request, key, Ok(Param::Double(value))) }
}
