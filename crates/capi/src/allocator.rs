//! `TRITONSERVER_ResponseAllocator`: the application's callbacks that give (and take back) the memory a response's outputs are written to.
use std::ffi::{c_char, c_void};

use crate::error::{Failure, FailureExt};
use crate::{ffi, out, TRITONSERVER_Error};

pub type AllocFn = unsafe extern "C" fn(
    *mut TRITONSERVER_ResponseAllocator,
    *const c_char,
    usize,
    u32,
    i64,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
    *mut u32,
    *mut i64,
) -> *mut TRITONSERVER_Error;
pub type ReleaseBufferFn = unsafe extern "C" fn(
    *mut TRITONSERVER_ResponseAllocator,
    *mut c_void,
    *mut c_void,
    usize,
    u32,
    i64,
) -> *mut TRITONSERVER_Error;
pub type StartFn = unsafe extern "C" fn(*mut TRITONSERVER_ResponseAllocator, *mut c_void) -> *mut TRITONSERVER_Error;
pub type QueryFn = unsafe extern "C" fn(
    *mut TRITONSERVER_ResponseAllocator,
    *mut c_void,
    *const c_char,
    *mut usize,
    *mut u32,
    *mut i64,
) -> *mut TRITONSERVER_Error;
pub type BufferAttributesFn = unsafe extern "C" fn(
    *mut TRITONSERVER_ResponseAllocator,
    *const c_char,
    *mut c_void,
    *mut c_void,
    *mut c_void,
) -> *mut TRITONSERVER_Error;

/// The application's allocation callbacks.
#[derive(Clone, Copy)]
pub struct TRITONSERVER_ResponseAllocator {
    pub(crate) alloc: AllocFn,
    pub(crate) release: ReleaseBufferFn,
    pub(crate) start: Option<StartFn>,
    pub(crate) query: Option<QueryFn>,
    pub(crate) attributes: Option<BufferAttributesFn>,
}

impl TRITONSERVER_ResponseAllocator {
    /// An allocator of the library's own, with no start, query or attributes function.
    pub(crate) const fn plain(alloc: AllocFn, release: ReleaseBufferFn) -> Self {
        TRITONSERVER_ResponseAllocator {
            alloc,
            release,
            start: None,
            query: None,
            attributes: None,
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ResponseAllocatorNew(
    allocator: *mut *mut TRITONSERVER_ResponseAllocator,
    alloc_fn: Option<AllocFn>,
    release_fn: Option<ReleaseBufferFn>,
    start_fn: Option<StartFn>,
) -> *mut TRITONSERVER_Error {
    ffi(|| {
        let to = out(allocator, "allocator")?;
        let alloc = alloc_fn.ok_or_else(|| Failure::invalid("alloc_fn is null"))?;
        let release = release_fn.ok_or_else(|| Failure::invalid("release_fn is null"))?;
        *to = Box::into_raw(Box::new(TRITONSERVER_ResponseAllocator {
            alloc,
            release,
            start: start_fn,
            query: None,
            attributes: None,
        }));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ResponseAllocatorSetQueryFunction(
    allocator: *mut TRITONSERVER_ResponseAllocator,
    query_fn: Option<QueryFn>,
) -> *mut TRITONSERVER_Error {
    ffi(|| {
        // SAFETY: an allocator this library made and the caller has not deleted.
        let a = unsafe { allocator.as_mut() }.ok_or_else(|| Failure::invalid("allocator is null"))?;
        a.query = query_fn;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ResponseAllocatorSetBufferAttributesFunction(
    allocator: *mut TRITONSERVER_ResponseAllocator,
    buffer_attributes_fn: Option<BufferAttributesFn>,
) -> *mut TRITONSERVER_Error {
    ffi(|| {
        // SAFETY: an allocator this library made and the caller has not deleted.
        let a = unsafe { allocator.as_mut() }.ok_or_else(|| Failure::invalid("allocator is null"))?;
        a.attributes = buffer_attributes_fn;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ResponseAllocatorDelete(
    allocator: *mut TRITONSERVER_ResponseAllocator,
) -> *mut TRITONSERVER_Error {
    if !allocator.is_null() {
        // SAFETY: an allocator this library made; requests copied what they need of it.
        drop(unsafe { Box::from_raw(allocator) });
    }
    std::ptr::null_mut()
}
