//! Mesh extensions for bindings (the Python package): a request's answers and release delivered to a queue its caller waits on, with no callback into the caller's interpreter, and a plain CPU allocator.
//!
//! A binding passes `MESH_ResponseQueueComplete` and `MESH_ResponseQueueReleased` as a request's
//! callbacks with a queue as their user pointer, then pops events (blocking with a timeout, or
//! woken through an eventfd). The queue lives until its owner deletes it and every request sent
//! with it was released: a binding that stops reading leaks nothing and frees nothing early.
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::allocator::TRITONSERVER_ResponseAllocator;
use crate::callbacks::{Events, MESH_ResponseQueue, EVENT_NONE, EVENT_RESPONSE};
use crate::error::{Failure, FailureExt};
use crate::response::{TRITONSERVER_InferenceResponse, RESPONSES};
use crate::types::MEMORY_CPU;
use crate::{ffi, out, TRITONSERVER_Error};

impl Drop for MESH_ResponseQueue {
    fn drop(&mut self) {
        let e = self.events.get_mut().unwrap_or_else(|p| p.into_inner());
        for (kind, handle, _) in e.queue.drain(..) {
            if kind == EVENT_RESPONSE && handle != 0 {
                // Responses nobody popped are deleted with the queue (their buffers released).
                let _ = RESPONSES.take(handle as *mut TRITONSERVER_InferenceResponse);
            }
        }
        if let Some(fd) = e.fd.take() {
            // SAFETY: the queue's own eventfd, closed once.
            unsafe { libc::close(fd) };
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn MESH_ResponseQueueNew(queue: *mut *mut MESH_ResponseQueue) -> *mut TRITONSERVER_Error {
    ffi(|| {
        let q = Arc::new(MESH_ResponseQueue {
            events: Mutex::default(),
            ready: Condvar::new(),
        });
        *out(queue, "queue")? = Arc::into_raw(q) as *mut _;
        Ok(())
    })
}

/// Gives up the owner's reference; the queue goes once no request holds it.
#[no_mangle]
pub unsafe extern "C" fn MESH_ResponseQueueDelete(queue: *mut MESH_ResponseQueue) -> *mut TRITONSERVER_Error {
    if !queue.is_null() {
        // SAFETY: the owner's reference, from MESH_ResponseQueueNew, given up once.
        drop(unsafe { Arc::from_raw(queue) });
    }
    std::ptr::null_mut()
}

impl MESH_ResponseQueue {
    /// The queue's events once at least one waits, or after `timeout_us` (negative: without
    /// end, 0: not at all) with none.
    fn wait(&self, timeout_us: i64) -> MutexGuard<'_, Events> {
        let mut e = self.lock();
        let deadline = (timeout_us > 0).then(|| std::time::Instant::now() + Duration::from_micros(timeout_us as u64));
        while e.queue.is_empty() {
            match (timeout_us, deadline) {
                (0, _) => break,
                (_, None) => e = self.ready.wait(e).unwrap_or_else(|p| p.into_inner()),
                (_, Some(d)) => {
                    let left = d.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    e = self.ready.wait_timeout(e, left).unwrap_or_else(|p| p.into_inner()).0;
                }
            }
        }
        e
    }

    /// Up to `max` events, oldest first, once at least one waits or the time ran out (see `wait`).
    pub(crate) fn take(&self, timeout_us: i64, max: usize) -> Vec<(u32, usize, u32)> {
        let mut e = self.wait(timeout_us);
        let n = e.queue.len().min(max);
        e.queue.drain(..n).collect()
    }
}

/// Takes the oldest event, waiting up to `timeout_us` (negative: without end, 0: not at all).
/// `kind` is 0 when none came, 1 for a response (`handle` may be null with the final flag),
/// 2 for a request's release (`handle` is the request).
#[no_mangle]
pub unsafe extern "C" fn MESH_ResponseQueuePop(
    queue: *mut MESH_ResponseQueue,
    timeout_us: i64,
    kind: *mut u32,
    handle: *mut *mut c_void,
    flags: *mut u32,
) -> *mut TRITONSERVER_Error {
    ffi(|| {
        // SAFETY: a queue the caller owns.
        let q = unsafe { queue.as_ref() }.ok_or_else(|| Failure::invalid("queue is null"))?;
        let (kind, handle, flags) = (out(kind, "kind")?, out(handle, "handle")?, out(flags, "flags")?);
        let (k, h, f) = q.wait(timeout_us).queue.pop_front().unwrap_or((EVENT_NONE, 0, 0));
        (*kind, *handle, *flags) = (k, h as *mut c_void, f);
        Ok(())
    })
}

/// An eventfd that is readable while events wait (read it to reset, then pop until none).
#[no_mangle]
pub unsafe extern "C" fn MESH_ResponseQueueFd(
    queue: *mut MESH_ResponseQueue,
    fd: *mut c_int,
) -> *mut TRITONSERVER_Error {
    ffi(|| {
        // SAFETY: a queue the caller owns.
        let q = unsafe { queue.as_ref() }.ok_or_else(|| Failure::invalid("queue is null"))?;
        let fd = out(fd, "fd")?;
        let mut e = q.lock();
        if e.fd.is_none() {
            // SAFETY: a plain eventfd, owned by the queue.
            let made = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
            if made < 0 {
                return Err(Failure::internal(format!(
                    "eventfd: {}",
                    std::io::Error::last_os_error()
                )));
            }
            if !e.queue.is_empty() {
                let one: u64 = 1;
                // SAFETY: 8 bytes to the eventfd just made.
                unsafe { libc::write(made, (&one as *const u64).cast(), 8) };
            }
            e.fd = Some(made);
        }
        *fd = e.fd.unwrap_or(-1);
        Ok(())
    })
}

/// An allocator function (`TRITONSERVER_ResponseAllocatorAllocFn_t`): CPU memory from malloc, 64-byte aligned.
#[no_mangle]
pub unsafe extern "C" fn MESH_CpuAlloc(
    _allocator: *mut TRITONSERVER_ResponseAllocator,
    _tensor_name: *const std::ffi::c_char,
    byte_size: usize,
    _memory_type: u32,
    _memory_type_id: i64,
    _userp: *mut c_void,
    buffer: *mut *mut c_void,
    buffer_userp: *mut *mut c_void,
    actual_memory_type: *mut u32,
    actual_memory_type_id: *mut i64,
) -> *mut TRITONSERVER_Error {
    ffi(|| {
        let mut p = std::ptr::null_mut();
        // SAFETY: posix_memalign writes the new block's address to `p`.
        if unsafe { libc::posix_memalign(&mut p, 64, byte_size.max(1)) } != 0 {
            return Err(Failure::internal(format!(
                "cannot allocate {byte_size} bytes for an output"
            )));
        }
        *out(buffer, "buffer")? = p;
        *out(buffer_userp, "buffer_userp")? = std::ptr::null_mut();
        *out(actual_memory_type, "actual_memory_type")? = MEMORY_CPU;
        *out(actual_memory_type_id, "actual_memory_type_id")? = 0;
        Ok(())
    })
}

/// The release function (`TRITONSERVER_ResponseAllocatorReleaseFn_t`) of `MESH_CpuAlloc`'s buffers.
#[no_mangle]
pub unsafe extern "C" fn MESH_CpuRelease(
    _allocator: *mut TRITONSERVER_ResponseAllocator,
    buffer: *mut c_void,
    _buffer_userp: *mut c_void,
    _byte_size: usize,
    _memory_type: u32,
    _memory_type_id: i64,
) -> *mut TRITONSERVER_Error {
    // SAFETY: a block MESH_CpuAlloc made (or null).
    unsafe { libc::free(buffer) };
    std::ptr::null_mut()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::callbacks::{keep_alive, MESH_ResponseQueueComplete, MESH_ResponseQueueReleased, EVENT_RELEASED};

    fn pop(q: *mut MESH_ResponseQueue, timeout_us: i64) -> (u32, usize, u32) {
        let (mut kind, mut handle, mut flags) = (9, std::ptr::null_mut(), 9);
        // SAFETY: a live queue and out-pointers to locals.
        assert!(unsafe { MESH_ResponseQueuePop(q, timeout_us, &mut kind, &mut handle, &mut flags) }.is_null());
        (kind, handle as usize, flags)
    }

    #[test]
    fn events_come_out_in_order_and_a_timeout_answers_none() {
        let mut q = std::ptr::null_mut();
        // SAFETY: out-pointer; the callbacks get the queue as their user pointer.
        unsafe {
            assert!(MESH_ResponseQueueNew(&mut q).is_null());
            MESH_ResponseQueueComplete(std::ptr::null_mut(), 1, q.cast());
            MESH_ResponseQueueReleased(0x10 as *mut _, 1, q.cast());
        }
        assert_eq!(pop(q, 0), (EVENT_RESPONSE, 0, 1));
        assert_eq!(pop(q, -1), (EVENT_RELEASED, 0x10, 1));
        let t0 = std::time::Instant::now();
        assert_eq!(pop(q, 2_000), (EVENT_NONE, 0, 0));
        assert!(t0.elapsed() >= Duration::from_micros(2_000));
        let mut fd = -1;
        // SAFETY: a live queue.
        unsafe {
            assert!(MESH_ResponseQueueFd(q, &mut fd).is_null());
            MESH_ResponseQueueComplete(std::ptr::null_mut(), 0, q.cast());
            let mut n = 0u64;
            assert_eq!(
                libc::read(fd, (&mut n as *mut u64).cast(), 8),
                8,
                "the eventfd is readable"
            );
            MESH_ResponseQueueDelete(q);
        }
    }

    #[test]
    fn a_request_keeps_its_queue_after_the_owner_deleted_it() {
        let mut q = std::ptr::null_mut();
        // SAFETY: out-pointer.
        assert!(unsafe { MESH_ResponseQueueNew(&mut q) }.is_null());
        let kept = keep_alive(Some(MESH_ResponseQueueComplete), None, q as usize).expect("the queue's own callback");
        assert!(keep_alive(None, None, q as usize).is_none());
        // SAFETY: the owner's reference, given up; `kept` still holds the queue.
        unsafe { MESH_ResponseQueueDelete(q) };
        assert_eq!(Arc::strong_count(&kept), 1);
        kept.push(EVENT_RESPONSE, 0, 1); // what a late answer does: no use after free
        drop(kept);
    }
}
