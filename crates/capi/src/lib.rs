//! libtritonserver.so: Triton's in-process C API (`tritonserver.h`, API version 1.34) over a mesh node embedded in the calling process.
//!
//! Every `TRITONSERVER_*` function of the header is exported. The ones an embedding application
//! needs (options, server, metadata, load/unload, requests, allocators, responses, statistics,
//! metrics, errors) work; the rest return `TRITONSERVER_ERROR_UNSUPPORTED` naming themselves
//! (`unsupported.rs`). Safety contract: every pointer an application passes follows the header's
//! rules (valid, and alive for as long as the header says); null pointers and objects used after
//! they were deleted (servers, requests and responses) are caught and answered with an error.
#![allow(non_camel_case_types, non_snake_case, clippy::missing_safety_doc)]

pub mod allocator;
pub mod callbacks;
pub mod error;
pub mod held;
pub mod message;
pub mod options;
pub mod packed;
pub mod queue;
pub mod request;
pub mod request_options;
pub mod response;
pub mod server;
mod task;
pub mod types;
pub mod unsupported;

mod live;

use std::ffi::{c_char, CStr};

pub use error::TRITONSERVER_Error;
use error::{Code, Failure, FailureExt};

/// The header's version this library implements.
pub const API_VERSION: (u32, u32) = (1, 34);

/// Runs an exported function's body: a failure becomes a `TRITONSERVER_Error` the caller owns,
/// and a panic (a bug) becomes an INTERNAL error instead of unwinding into C.
pub(crate) fn ffi(body: impl FnOnce() -> Result<(), Failure>) -> *mut TRITONSERVER_Error {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(())) => std::ptr::null_mut(),
        Ok(Err(f)) => f.into_raw(),
        Err(_) => Failure::of(Code::Internal, "the mesh's C API panicked (a bug); see the log").into_raw(),
    }
}

/// A C string argument as UTF-8; null or invalid is an INVALID_ARG naming `what`.
pub(crate) unsafe fn text<'a>(p: *const c_char, what: &str) -> Result<&'a str, Failure> {
    if p.is_null() {
        return Err(Failure::invalid(format!("{what} is null")));
    }
    // SAFETY: the caller passes a NUL-terminated string (the header's contract).
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| Failure::invalid(format!("{what} is not UTF-8")))
}

/// An out-pointer argument; null is an INVALID_ARG naming `what`.
pub(crate) fn out<'a, T>(p: *mut T, what: &str) -> Result<&'a mut T, Failure> {
    // SAFETY: non-null out-pointers point at writable storage of their type (the header's contract).
    unsafe { p.as_mut() }.ok_or_else(|| Failure::invalid(format!("{what} is null")))
}

/// `TRITONSERVER_ApiVersion`: the header version this library implements.
#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ApiVersion(major: *mut u32, minor: *mut u32) -> *mut TRITONSERVER_Error {
    ffi(|| {
        *out(major, "major")? = API_VERSION.0;
        *out(minor, "minor")? = API_VERSION.1;
        Ok(())
    })
}
