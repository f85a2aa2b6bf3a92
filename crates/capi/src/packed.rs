//! Mesh extensions for bindings: a request's inputs added and the request sent in one call, and its events popped with each response whole, through packed little-endian records.
//!
//! Each C call costs a binding such as Python's ctypes a microsecond or more, so the usual way
//! (AddInput, AppendInputData, two callbacks, InferAsync and Delete per request; Id,
//! ParameterCount, OutputCount and Output per response) cost more than the model. A tensor
//! record, used both ways, is
//!
//! ```text
//! u32 name_len, u32 datatype, u32 dim_count, u32 memory_type, i64 memory_type_id,
//! u64 base, u64 byte_size, i64 dims[dim_count], u8 name[name_len]   (UTF-8, no NUL)
//! ```
//!
//! and a response record is
//!
//! ```text
//! i32 error_code (-1: none), u32 error_len, u32 id_len, u32 parameter_count, u32 output_count,
//! u8 error[error_len], u8 id[id_len],
//! parameter_count × (u32 type, u32 name_len, u32 value_len, u8 name[name_len], u8 value[value_len]),
//! output_count × tensor record
//! ```
//!
//! A parameter's value is its UTF-8 text (STRING), an i64 (INT), one byte (BOOL), an f64
//! (DOUBLE) or its bytes (BYTES). Records from the caller are read with every length checked.
use std::ffi::c_void;

use crate::allocator::TRITONSERVER_ResponseAllocator;
use crate::callbacks::{
    MESH_ResponseQueue, MESH_ResponseQueueComplete, MESH_ResponseQueueReleased, Target, EVENT_RESPONSE,
};
use crate::error::{take, Failure, FailureExt};
use crate::message::ParameterValue;
use crate::queue::{MESH_CpuAlloc, MESH_CpuRelease};
use crate::request::{with_request, TRITONSERVER_InferenceRequest, MAX_DIMS};
use crate::response::{TRITONSERVER_InferenceResponse, RESPONSES};
use crate::server::TRITONSERVER_Server;
use crate::{ffi, out, TRITONSERVER_Error};

/// The fixed part of a tensor record.
pub const TENSOR_HEADER: usize = 40;

/// The allocator of requests sent with `MESH_ServerInferPacked`: the library's CPU allocator.
static CPU_ALLOCATOR: TRITONSERVER_ResponseAllocator =
    TRITONSERVER_ResponseAllocator::plain(MESH_CpuAlloc, MESH_CpuRelease);

/// One tensor record read from the caller's bytes.
#[derive(Debug, PartialEq)]
pub struct TensorRecord<'a> {
    pub name: &'a str,
    pub datatype: u32,
    pub memory_type: u32,
    pub memory_type_id: i64,
    pub base: u64,
    pub byte_size: u64,
    pub shape: Vec<i64>,
}

/// Reads little-endian fields off a byte slice, refusing to run past its end.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], Failure> {
        let end = self
            .at
            .checked_add(n)
            .filter(|e| *e <= self.bytes.len())
            .ok_or_else(|| {
                Failure::invalid(format!(
                    "packed inputs: {what} at byte {} runs past their end ({} bytes)",
                    self.at,
                    self.bytes.len()
                ))
            })?;
        let part = &self.bytes[self.at..end];
        self.at = end;
        Ok(part)
    }

    fn u32(&mut self, what: &str) -> Result<u32, Failure> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().unwrap_or_default()))
    }

    fn u64(&mut self, what: &str) -> Result<u64, Failure> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().unwrap_or_default()))
    }

    fn tensor(&mut self) -> Result<TensorRecord<'a>, Failure> {
        let name_len = self.u32("a name's length")? as usize;
        let datatype = self.u32("a datatype")?;
        let dim_count = self.u32("a dim count")? as usize;
        let memory_type = self.u32("a memory type")?;
        let memory_type_id = self.u64("a memory type id")? as i64;
        let base = self.u64("a base")?;
        let byte_size = self.u64("a byte size")?;
        if dim_count > MAX_DIMS {
            return Err(Failure::invalid(format!(
                "packed inputs: an input has {dim_count} dims, more than {MAX_DIMS}"
            )));
        }
        let shape = self
            .take(dim_count * 8, "a shape")?
            .chunks_exact(8)
            .map(|d| i64::from_le_bytes(d.try_into().unwrap_or_default()))
            .collect();
        let name = std::str::from_utf8(self.take(name_len, "a name")?)
            .map_err(|_| Failure::invalid("packed inputs: an input's name is not UTF-8"))?;
        Ok(TensorRecord {
            name,
            datatype,
            memory_type,
            memory_type_id,
            base,
            byte_size,
            shape,
        })
    }
}

/// Every tensor record of `bytes`, or the first problem found.
pub fn read_tensors(bytes: &[u8]) -> Result<Vec<TensorRecord<'_>>, Failure> {
    let mut r = Reader { bytes, at: 0 };
    let mut all = Vec::new();
    while r.at < bytes.len() {
        all.push(r.tensor()?);
    }
    Ok(all)
}

/// Appends one tensor record.
pub fn write_tensor(to: &mut Vec<u8>, t: &TensorRecord<'_>) {
    for v in [t.name.len() as u32, t.datatype, t.shape.len() as u32, t.memory_type] {
        to.extend_from_slice(&v.to_le_bytes());
    }
    for v in [t.memory_type_id as u64, t.base, t.byte_size] {
        to.extend_from_slice(&v.to_le_bytes());
    }
    for d in &t.shape {
        to.extend_from_slice(&d.to_le_bytes());
    }
    to.extend_from_slice(t.name.as_bytes());
}

/// A response as one record (see the module's text).
pub(crate) fn pack_response(r: &TRITONSERVER_InferenceResponse) -> Vec<u8> {
    let mut to = Vec::with_capacity(64 + r.outputs.len() * (TENSOR_HEADER + 48));
    let error = r.error.as_ref().map(|e| (e.code as i32, e.message.as_bytes()));
    let (code, message) = error.unwrap_or((-1, &[]));
    let id = r.id.as_bytes();
    to.extend_from_slice(&code.to_le_bytes());
    for v in [message.len(), id.len(), r.parameters.len(), r.outputs.len()] {
        to.extend_from_slice(&(v as u32).to_le_bytes());
    }
    to.extend_from_slice(message);
    to.extend_from_slice(id);
    for p in &r.parameters {
        let (kind, _) = p.value.raw();
        let value: Vec<u8> = match &p.value {
            ParameterValue::String(s) => s.as_bytes().to_vec(),
            ParameterValue::Int(v) => v.to_le_bytes().to_vec(),
            ParameterValue::Bool(v) => vec![u8::from(*v)],
            ParameterValue::Double(v) => v.to_le_bytes().to_vec(),
            ParameterValue::Bytes(v) => v.clone(),
        };
        let name = p.name.as_bytes();
        for v in [kind, name.len() as u32, value.len() as u32] {
            to.extend_from_slice(&v.to_le_bytes());
        }
        to.extend_from_slice(name);
        to.extend_from_slice(&value);
    }
    for o in &r.outputs {
        let record = TensorRecord {
            name: o.name.to_str().unwrap_or_default(),
            datatype: o.dtype,
            memory_type: o.memory_type,
            memory_type_id: o.memory_type_id,
            base: o.base as u64,
            byte_size: o.size as u64,
            shape: o.shape.clone(),
        };
        write_tensor(&mut to, &record);
    }
    to
}

/// Adds every input of `packed` (tensor records) to a request.
fn add_inputs(r: &mut TRITONSERVER_InferenceRequest, bytes: &[u8]) -> Result<(), Failure> {
    let records = read_tensors(bytes)?;
    let before = r.input_count();
    let added = records.into_iter().try_for_each(|t| {
        let size = usize::try_from(t.byte_size)
            .map_err(|_| Failure::invalid(format!("input '{}': byte size too large", t.name)))?;
        r.add_input(t.name, t.datatype, t.shape)?;
        r.append_input_data(
            t.name,
            t.base as usize as *const c_void,
            size,
            t.memory_type,
            t.memory_type_id,
        )
    });
    if added.is_err() {
        r.drop_inputs_after(before);
    }
    added
}

/// The caller's bytes (`byte_size` readable at `packed`, the extension's contract).
unsafe fn bytes<'a>(packed: *const c_void, byte_size: usize) -> Result<&'a [u8], Failure> {
    match byte_size {
        0 => Ok(&[]),
        _ if packed.is_null() => Err(Failure::invalid("packed is null")),
        // SAFETY: the caller's contract above.
        _ => Ok(unsafe { std::slice::from_raw_parts(packed.cast::<u8>(), byte_size) }),
    }
}

/// Adds every input of `packed` (tensor records) with its one buffer, as `AddInput` and
/// `AppendInputData` would, borrowing the buffers; a refused record adds none of them.
#[no_mangle]
pub unsafe extern "C" fn MESH_InferenceRequestAddInputsPacked(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    packed: *const c_void,
    byte_size: usize,
) -> *mut TRITONSERVER_Error {
    // SAFETY: see `bytes`; handles are checked alive first.
    unsafe { with_request(inference_request, |r| add_inputs(r, bytes(packed, byte_size)?)) }
}

/// Adds the inputs of `packed` (as `MESH_InferenceRequestAddInputsPacked`), sends the request with
/// its answers and release going to `queue` (outputs in memory of `MESH_CpuAlloc`), and deletes
/// the request itself once it is released: the caller must not delete or reuse it after that
/// event. Refused (an error returned), the request stays the caller's, as after a refused
/// `TRITONSERVER_ServerInferAsync`, with the inputs of `packed` added if they were well formed and
/// no callbacks set.
#[no_mangle]
pub unsafe extern "C" fn MESH_ServerInferPacked(
    server: *mut TRITONSERVER_Server,
    inference_request: *mut TRITONSERVER_InferenceRequest,
    packed: *const c_void,
    byte_size: usize,
    queue: *mut MESH_ResponseQueue,
) -> *mut TRITONSERVER_Error {
    // SAFETY: the caller's contract, as above.
    unsafe { send(server, inference_request, packed, byte_size, queue, false) }
}

/// `MESH_ServerInferPacked`, and with `hold_outputs` its form whose responses hold their outputs
/// until the binding places them (`held.rs`).
pub(crate) unsafe fn send(
    server: *mut TRITONSERVER_Server,
    inference_request: *mut TRITONSERVER_InferenceRequest,
    packed: *const c_void,
    byte_size: usize,
    queue: *mut MESH_ResponseQueue,
    hold_outputs: bool,
) -> *mut TRITONSERVER_Error {
    let target = Target {
        allocator: Some(CPU_ALLOCATOR),
        allocator_raw: &CPU_ALLOCATOR as *const _ as usize,
        allocator_userp: 0,
        complete: MESH_ResponseQueueComplete,
        userp: queue as usize,
        hold_outputs,
    };
    // SAFETY: see `bytes`; handles are checked alive first; the queue is the caller's, alive.
    let set = unsafe {
        with_request(inference_request, |r| {
            if queue.is_null() {
                return Err(Failure::invalid("queue is null"));
            }
            add_inputs(r, bytes(packed, byte_size)?)?;
            r.set_callbacks((MESH_ResponseQueueReleased, queue as usize), target, true);
            Ok(())
        })
    };
    if !set.is_null() {
        return set;
    }
    // SAFETY: the caller's server and request, as for TRITONSERVER_ServerInferAsync. Accepted, the
    // request may be released and deleted before this returns: it is not touched after.
    let sent =
        unsafe { crate::response::TRITONSERVER_ServerInferAsync(server, inference_request, std::ptr::null_mut()) };
    if !sent.is_null() {
        // Refused: still the caller's, with the inputs of `packed` and no callbacks (the queue's
        // are undone, so a queue the caller deletes is never reached through it).
        // SAFETY: see `with_request`; an error it made (a dead handle) is dropped here.
        unsafe {
            drop(take(with_request(inference_request, |r| {
                r.forget_callbacks();
                Ok(())
            })))
        };
    }
    sent
}

/// One event as `MESH_ResponseQueuePopMany` writes it: for a response, also the whole response
/// as one record (owned by the response, valid until it is deleted or its outputs are placed).
#[repr(C)]
pub struct MESH_ResponseEvent {
    pub kind: u32,
    pub flags: u32,
    pub handle: *mut c_void,
    pub packed: *const c_void,
    pub packed_size: usize,
}

/// Takes up to `capacity` events at once, oldest first, waiting as `MESH_ResponseQueuePop` does
/// for the first; `count` says how many were written (0: the time ran out).
#[no_mangle]
pub unsafe extern "C" fn MESH_ResponseQueuePopMany(
    queue: *mut MESH_ResponseQueue,
    timeout_us: i64,
    events: *mut MESH_ResponseEvent,
    capacity: u32,
    count: *mut u32,
) -> *mut TRITONSERVER_Error {
    ffi(|| {
        // SAFETY: a queue the caller owns.
        let q = unsafe { queue.as_ref() }.ok_or_else(|| Failure::invalid("queue is null"))?;
        let count = out(count, "count")?;
        if events.is_null() || capacity == 0 {
            return Err(Failure::invalid("events is null or capacity is 0"));
        }
        // SAFETY: `capacity` writable events at `events` (the extension's contract).
        let slots = unsafe { std::slice::from_raw_parts_mut(events, capacity as usize) };
        let taken = q.take(timeout_us, slots.len());
        for (slot, (kind, handle, flags)) in slots.iter_mut().zip(&taken) {
            let response = (*kind == EVENT_RESPONSE)
                .then(|| RESPONSES.get(*handle as *mut TRITONSERVER_InferenceResponse).ok())
                .flatten();
            let (packed, packed_size) = match response {
                Some(r) => {
                    let r: &TRITONSERVER_InferenceResponse = r;
                    let bytes = r.packed.get_or_init(|| pack_response(r));
                    (bytes.as_ptr().cast(), bytes.len())
                }
                None => (std::ptr::null(), 0),
            };
            *slot = MESH_ResponseEvent {
                kind: *kind,
                flags: *flags,
                handle: *handle as *mut c_void,
                packed,
                packed_size,
            };
        }
        *count = taken.len() as u32;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(name: &str, shape: Vec<i64>) -> TensorRecord<'_> {
        TensorRecord {
            name,
            datatype: 11,
            memory_type: 0,
            memory_type_id: 0,
            base: 0x1000,
            byte_size: 256,
            shape,
        }
    }

    #[test]
    fn tensor_records_read_back_what_was_written() {
        let mut bytes = Vec::new();
        write_tensor(&mut bytes, &record("x", vec![1, 64]));
        write_tensor(&mut bytes, &record("ünïcode", vec![]));
        assert_eq!(bytes.len(), 2 * TENSOR_HEADER + 16 + 1 + "ünïcode".len());
        let read = read_tensors(&bytes).expect("well formed");
        assert_eq!(read, vec![record("x", vec![1, 64]), record("ünïcode", vec![])]);
    }

    #[test]
    fn a_record_cut_short_or_lying_about_its_lengths_is_refused_by_name() {
        let mut bytes = Vec::new();
        write_tensor(&mut bytes, &record("input", vec![4, 4]));
        for cut in [1, 39, 40, 55, bytes.len() - 1] {
            let e = read_tensors(&bytes[..cut]).expect_err("cut short");
            assert!(e.message.to_str().unwrap().contains("runs past their end"), "{e:?}");
        }
        let mut many_dims = bytes.clone();
        many_dims[8..12].copy_from_slice(&65u32.to_le_bytes());
        let e = read_tensors(&many_dims).expect_err("too many dims");
        assert!(e.message.to_str().unwrap().contains("65 dims"), "{e:?}");
        let mut huge_name = bytes.clone();
        huge_name[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(read_tensors(&huge_name).is_err());
        let mut bad_utf8 = bytes;
        let last = bad_utf8.len() - 1;
        bad_utf8[last] = 0xff;
        let e = read_tensors(&bad_utf8).expect_err("not UTF-8");
        assert!(e.message.to_str().unwrap().contains("not UTF-8"), "{e:?}");
        assert_eq!(read_tensors(&[]).expect("no inputs").len(), 0);
    }
}
