//! CUDA shared memory: device memory another process exported with `cudaIpcGetMemHandle`, opened
//! here with the CUDA driver (loaded at run time, so this compiles and runs without CUDA; a server
//! without a driver or device answers a clear error at registration).
use std::panic::{catch_unwind, AssertUnwindSafe};

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys;

use crate::error::{Error, Result};

/// The size of a `cudaIpcMemHandle_t`.
pub const HANDLE_SIZE: usize = sys::CU_IPC_HANDLE_SIZE as usize;

/// One registered CUDA region: `byte_size` bytes of device memory on `device_id`.
pub struct CudaRegion {
    pub device_id: i64,
    pub byte_size: u64,
    device: sys::CUdevice,
    context: sys::CUcontext,
    pointer: sys::CUdeviceptr,
}

// SAFETY: the context and device pointer are process-wide driver handles, valid on any thread once
// the context is made current there (every use does so first).
unsafe impl Send for CudaRegion {}
// SAFETY: as for Send; the region is only read through driver calls, which the driver serialises.
unsafe impl Sync for CudaRegion {}

fn driver_error(name: &str, what: &str, e: DriverError) -> Error {
    Error::invalid(format!("CUDA shared memory region '{name}': {what} failed ({e:?})"))
}

/// Runs driver calls, turning a missing driver (or a missing symbol, which cudarc's loader
/// reports by panicking) into an error that says so.
fn with_driver<T>(name: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    // SAFETY: only tries to dlopen the libcuda candidates.
    if !unsafe { sys::is_culib_present() } {
        return Err(Error::invalid(format!(
            "cannot register CUDA shared memory region '{name}': this server has no CUDA driver (libcuda not found); use system shared memory"
        )));
    }
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        Err(Error::invalid(format!(
            "CUDA shared memory region '{name}': the CUDA driver lacks a function this needs"
        )))
    })
}

impl CudaRegion {
    /// Opens the exported memory on `device_id` (the device ordinal as this server sees it).
    pub fn open(name: &str, raw_handle: &[u8], device_id: i64, byte_size: u64) -> Result<CudaRegion> {
        if raw_handle.len() != HANDLE_SIZE {
            return Err(Error::invalid(format!(
                "failed to register shared memory region '{name}': invalid args (raw_handle must be the {HANDLE_SIZE} bytes of a cudaIpcMemHandle_t, got {})",
                raw_handle.len()
            )));
        }
        if byte_size == 0 {
            return Err(Error::invalid(format!(
                "CUDA shared memory region '{name}': byte_size must be positive"
            )));
        }
        let ordinal = i32::try_from(device_id)
            .ok()
            .filter(|d| *d >= 0)
            .ok_or_else(|| Error::invalid(format!("CUDA shared memory region '{name}': bad device_id {device_id}")))?;
        let mut handle = sys::CUipcMemHandle_st {
            reserved: [0; HANDLE_SIZE],
        };
        for (dst, src) in handle.reserved.iter_mut().zip(raw_handle) {
            *dst = *src as std::ffi::c_char;
        }
        with_driver(name, || {
            result::init().map_err(|e| driver_error(name, "initialising the CUDA driver", e))?;
            let count = result::device::get_count().map_err(|e| driver_error(name, "counting devices", e))?;
            if ordinal >= count {
                return Err(Error::invalid(format!(
                    "CUDA shared memory region '{name}': device_id {device_id} does not exist (this server sees {count} CUDA devices)"
                )));
            }
            let device = result::device::get(ordinal).map_err(|e| driver_error(name, "getting the device", e))?;
            // SAFETY: `device` came from device::get; the context is released in Drop or below.
            let context = unsafe { result::primary_ctx::retain(device) }
                .map_err(|e| driver_error(name, "creating a context", e))?;
            // SAFETY: `context` was retained above and `handle` is the client's IPC handle, which the driver
            // validates; the pointer it opens is closed in Drop.
            let opened = unsafe {
                result::ctx::set_current(context).map_err(|e| driver_error(name, "using the context", e))?;
                let mut pointer: sys::CUdeviceptr = 0;
                sys::cuIpcOpenMemHandle_v2(
                    &mut pointer,
                    handle,
                    sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
                )
                .result()
                .map(|()| pointer)
                .map_err(|e| driver_error(name, "opening the IPC handle", e))
            };
            // The claimed size must lie within the exported allocation.
            let opened = opened.and_then(|pointer| {
                let (mut base, mut size) = (0, 0usize);
                // SAFETY: queries the allocation that contains the pointer just opened.
                let r = unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, pointer) }.result();
                let fits = r.is_ok() && (pointer - base).checked_add(byte_size).is_some_and(|end| end <= size as u64);
                if fits {
                    return Ok(pointer);
                }
                // SAFETY: closes the mapping opened above, used by nothing else.
                let _ = unsafe { sys::cuIpcCloseMemHandle(pointer) }.result();
                Err(Error::invalid(format!(
                    "CUDA shared memory region '{name}': byte_size {byte_size} is beyond the {size} bytes of the exported allocation"
                )))
            });
            match opened {
                Ok(pointer) => Ok(CudaRegion {
                    device_id,
                    byte_size,
                    device,
                    context,
                    pointer,
                }),
                Err(e) => {
                    // SAFETY: releases the reference retained above.
                    let _ = unsafe { result::primary_ctx::release(device) };
                    Err(e)
                }
            }
        })
    }

    /// Copies `len` bytes at `at` to the host (the caller checked the bounds).
    pub fn read(&self, name: &str, at: usize, len: usize) -> Result<Vec<u8>> {
        let mut out = super::system::buffer(name, len)?;
        // SAFETY: the pointer is an open IPC mapping of at least byte_size bytes; at + len <= byte_size.
        unsafe {
            result::ctx::set_current(self.context).map_err(|e| driver_error(name, "using the context", e))?;
            result::memcpy_dtoh_sync(&mut out, self.pointer + at as u64)
                .map_err(|e| driver_error(name, "copying from the device", e))?;
        }
        Ok(out)
    }

    /// Copies `data` to `at` on the device (the caller checked the bounds).
    pub fn write(&self, name: &str, at: usize, data: &[u8]) -> Result<()> {
        // SAFETY: as in `read`.
        unsafe {
            result::ctx::set_current(self.context).map_err(|e| driver_error(name, "using the context", e))?;
            result::memcpy_htod_sync(self.pointer + at as u64, data)
                .map_err(|e| driver_error(name, "copying to the device", e))?;
        }
        Ok(())
    }
}

impl Drop for CudaRegion {
    fn drop(&mut self) {
        // SAFETY: closes the mapping opened in `open` and releases its context reference; nothing
        // uses the region any more (it is dropped with its last Arc).
        unsafe {
            let _ = result::ctx::set_current(self.context);
            let _ = sys::cuIpcCloseMemHandle(self.pointer).result();
            let _ = result::primary_ctx::release(self.device);
        }
    }
}
