//! What a request's callbacks are, below the request, its responses and the response queues that
//! use them: the C callback types, where a request's answers go (`Target`), and the response queue
//! a binding passes as their user pointer, with the two callbacks that fill it (the queue's own
//! calls are in `queue.rs`).
//!
//! The callbacks take the request or the response as an untyped pointer here: C sees the typed
//! declarations of tritonserver.h, and the address is the same.
use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::allocator::TRITONSERVER_ResponseAllocator;

/// `TRITONSERVER_InferenceRequestReleaseFn_t`.
pub type ReleaseFn = unsafe extern "C" fn(*mut c_void /* TRITONSERVER_InferenceRequest */, u32, *mut c_void);
/// `TRITONSERVER_InferenceResponseCompleteFn_t`.
pub type CompleteFn = unsafe extern "C" fn(*mut c_void /* TRITONSERVER_InferenceResponse */, u32, *mut c_void);

/// Where a request's answers go: the allocator (copied when the callback was set) and the callback.
#[derive(Clone, Copy)]
pub struct Target {
    pub allocator: Option<TRITONSERVER_ResponseAllocator>,
    pub allocator_raw: usize,
    pub allocator_userp: usize,
    pub complete: CompleteFn,
    pub userp: usize,
    /// The outputs stay in the library's memory, held by the response, until the binding places
    /// them (`MESH_ServerInferPackedHeld`, `held.rs`); the allocator is not called.
    pub hold_outputs: bool,
}

/// What a pop answers: nothing (timed out), a response (possibly null, with its flags), a release.
pub(crate) const EVENT_NONE: u32 = 0;
pub(crate) const EVENT_RESPONSE: u32 = 1;
pub(crate) const EVENT_RELEASED: u32 = 2;

/// A queue of one or more requests' events.
pub struct MESH_ResponseQueue {
    pub(crate) events: Mutex<Events>,
    pub(crate) ready: Condvar,
}

#[derive(Default)]
pub(crate) struct Events {
    pub(crate) queue: VecDeque<(u32, usize, u32)>,
    /// An eventfd that is readable while events wait (made when a binding asks for it).
    pub(crate) fd: Option<c_int>,
}

impl MESH_ResponseQueue {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Events> {
        self.events.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn push(&self, kind: u32, handle: usize, flags: u32) {
        let mut e = self.lock();
        e.queue.push_back((kind, handle, flags));
        if let Some(fd) = e.fd {
            let one: u64 = 1;
            // SAFETY: writing 8 bytes to the queue's own eventfd.
            unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
        }
        drop(e);
        self.ready.notify_all();
    }
}

/// A reference that keeps a queue alive while a request may still call into it, when the
/// request's callbacks are the queue's.
pub(crate) fn keep_alive(
    complete: Option<CompleteFn>,
    release: Option<ReleaseFn>,
    userp: usize,
) -> Option<Arc<MESH_ResponseQueue>> {
    let ours = complete.is_some_and(|f| std::ptr::eq(f as *const (), MESH_ResponseQueueComplete as *const ()))
        || release.is_some_and(|f| std::ptr::eq(f as *const (), MESH_ResponseQueueReleased as *const ()));
    if !ours || userp == 0 {
        return None;
    }
    let raw = userp as *const MESH_ResponseQueue;
    // SAFETY: the user pointer of the queue's callbacks is a queue made by MESH_ResponseQueueNew
    // and not deleted (the owner's reference is held until it calls MESH_ResponseQueueDelete).
    unsafe {
        Arc::increment_strong_count(raw);
        Some(Arc::from_raw(raw))
    }
}

/// A response callback (`TRITONSERVER_InferenceResponseCompleteFn_t`) whose user pointer is a queue.
#[no_mangle]
pub unsafe extern "C" fn MESH_ResponseQueueComplete(response: *mut c_void, flags: u32, userp: *mut c_void) {
    // SAFETY: the request that calls this holds a reference to the queue (`keep_alive`).
    if let Some(q) = unsafe { userp.cast::<MESH_ResponseQueue>().as_ref() } {
        q.push(EVENT_RESPONSE, response as usize, flags);
    }
}

/// A release callback (`TRITONSERVER_InferenceRequestReleaseFn_t`) whose user pointer is a queue.
#[no_mangle]
pub unsafe extern "C" fn MESH_ResponseQueueReleased(request: *mut c_void, flags: u32, userp: *mut c_void) {
    // SAFETY: as MESH_ResponseQueueComplete.
    if let Some(q) = unsafe { userp.cast::<MESH_ResponseQueue>().as_ref() } {
        q.push(EVENT_RELEASED, request as usize, flags);
    }
}
