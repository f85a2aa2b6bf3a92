//! Mesh extension for bindings: a response's outputs held in the library's memory until the binding places them, at once, in buffers its application's allocator gave on the binding's own thread.
//!
//! `MESH_ServerInferPackedHeld` sends a request as `MESH_ServerInferPacked` does, but its
//! responses keep each output where the model's answer left it (the library's memory, read-only)
//! instead of calling an allocator on the server's threads. The binding reads the outputs' sizes
//! from the response's record, asks its application for a buffer per output on the thread that
//! reads the answer (the Python package's `MemoryAllocator`: no interpreter callback on the
//! server's threads), and `MESH_InferenceResponsePlaceOutputs` checks every buffer, then copies
//! each output into its buffer: the one copy an allocator's buffers take in the C API, no more.
//! From then on the response names the caller's buffers, which stay the caller's (nothing is
//! released into them); its held bytes are freed.
use std::ffi::c_void;

use crate::callbacks::MESH_ResponseQueue;
use crate::error::{Failure, FailureExt};
use crate::request::TRITONSERVER_InferenceRequest;
use crate::response::{TRITONSERVER_InferenceResponse, RESPONSES};
use crate::server::TRITONSERVER_Server;
use crate::types::{memory_type_name, MEMORY_CPU, MEMORY_CPU_PINNED};
use crate::{ffi, TRITONSERVER_Error};

/// One output's buffer, given by the caller.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MESH_OutputBuffer {
    pub base: *mut c_void,
    pub byte_size: usize,
    pub memory_type: u32,
    pub memory_type_id: i64,
}

/// `MESH_ServerInferPacked` whose responses hold their outputs until
/// `MESH_InferenceResponsePlaceOutputs` (their records name the library's memory until then: read
/// it, never write it).
#[no_mangle]
pub unsafe extern "C" fn MESH_ServerInferPackedHeld(
    server: *mut TRITONSERVER_Server,
    inference_request: *mut TRITONSERVER_InferenceRequest,
    packed: *const c_void,
    byte_size: usize,
    queue: *mut MESH_ResponseQueue,
) -> *mut TRITONSERVER_Error {
    // SAFETY: the contract of MESH_ServerInferPacked.
    unsafe { crate::packed::send(server, inference_request, packed, byte_size, queue, true) }
}

/// Copies each held output of `response` into its buffer of `buffers` (one per output, in the
/// response's order). Every buffer is checked first: a refused call copies nothing and changes
/// nothing. The response's record is made afresh (an earlier one must not be read again).
#[no_mangle]
pub unsafe extern "C" fn MESH_InferenceResponsePlaceOutputs(
    inference_response: *mut TRITONSERVER_InferenceResponse,
    buffers: *const MESH_OutputBuffer,
    count: u32,
) -> *mut TRITONSERVER_Error {
    ffi(|| {
        let r = RESPONSES.get(inference_response)?;
        let given = match count {
            0 => &[][..],
            _ if buffers.is_null() => return Err(Failure::invalid("buffers is null")),
            // SAFETY: `count` readable buffers at `buffers` (the extension's contract).
            _ => unsafe { std::slice::from_raw_parts(buffers, count as usize) },
        };
        // SAFETY: each buffer is writable for its byte size (the extension's contract).
        unsafe { place(r, given) }
    })
}

/// Why `buffer` cannot take `output` (named `name`, `size` bytes, `held` or placed already).
fn refusal(name: &str, size: usize, held: bool, buffer: &MESH_OutputBuffer) -> Option<Failure> {
    if !held {
        return Some(Failure::invalid(format!(
            "output '{name}' is not held by the library: placed already, or its request was not sent with \
             MESH_ServerInferPackedHeld"
        )));
    }
    if buffer.memory_type != MEMORY_CPU && buffer.memory_type != MEMORY_CPU_PINNED {
        return Some(Failure::unsupported(format!(
            "output '{name}': the buffer is {} memory; the mesh's in-process API writes outputs to CPU memory",
            memory_type_name(buffer.memory_type).to_string_lossy()
        )));
    }
    if buffer.base.is_null() && size > 0 {
        return Some(Failure::internal(format!("output '{name}': the buffer is null")));
    }
    if buffer.byte_size < size {
        return Some(Failure::invalid(format!(
            "output '{name}' has {size} bytes, its buffer {}",
            buffer.byte_size
        )));
    }
    None
}

/// Checks every buffer, then places every output.
unsafe fn place(r: &mut TRITONSERVER_InferenceResponse, buffers: &[MESH_OutputBuffer]) -> Result<(), Failure> {
    if buffers.len() != r.outputs.len() {
        return Err(Failure::invalid(format!(
            "the response has {} outputs, {} buffers were given",
            r.outputs.len(),
            buffers.len()
        )));
    }
    for (o, b) in r.outputs.iter().zip(buffers) {
        if let Some(e) = refusal(&o.name.to_string_lossy(), o.size, o.held.is_some(), b) {
            return Err(e);
        }
    }
    for (o, b) in r.outputs.iter_mut().zip(buffers) {
        if let Some(data) = o.held.take() {
            if !data.is_empty() {
                // SAFETY: a CPU buffer of at least `data.len()` writable bytes (checked above and
                // the caller's contract); `copy` allows a caller that passes overlapping memory.
                unsafe { std::ptr::copy(data.as_ptr(), b.base.cast::<u8>(), data.len()) };
            }
        }
        (o.base, o.memory_type, o.memory_type_id) = (b.base as usize, b.memory_type, b.memory_type_id);
    }
    r.packed = Default::default();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::callbacks::Target;
    use crate::packed::pack_response;
    use mesh::{DataType, InferResponse, NamedTensor, Tensor};

    unsafe extern "C" fn nowhere(_: *mut c_void, _: u32, _: *mut c_void) {}

    fn held_response() -> TRITONSERVER_InferenceResponse {
        let tensor = |name: &str, values: &[f32]| NamedTensor {
            name: name.into(),
            tensor: Tensor {
                dtype: DataType::Fp32,
                shape: vec![1, values.len() as i64],
                data: values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>().into(),
            },
        };
        let answer = InferResponse {
            model_name: "m".into(),
            outputs: vec![tensor("a", &[1.0, 2.0]), tensor("b", &[3.0])],
            ..Default::default()
        };
        let target = Target {
            allocator: None,
            allocator_raw: 0,
            allocator_userp: 0,
            complete: nowhere,
            userp: 0,
            hold_outputs: true,
        };
        TRITONSERVER_InferenceResponse::build(answer, &target)
    }

    fn buffer(to: &mut [u8], memory_type: u32) -> MESH_OutputBuffer {
        MESH_OutputBuffer {
            base: to.as_mut_ptr().cast(),
            byte_size: to.len(),
            memory_type,
            memory_type_id: 0,
        }
    }

    fn message(e: &Failure) -> String {
        e.message.to_string_lossy().into_owned()
    }

    #[test]
    fn held_outputs_go_whole_into_the_callers_buffers_or_not_at_all() {
        let mut r = held_response();
        assert!(r.error.is_none() && r.outputs.iter().all(|o| o.held.is_some()));
        let before = pack_response(&r);
        let (mut a, mut b, mut small) = ([0u8; 8], [0u8; 4], [0u8; 3]);
        let refused = [
            (vec![buffer(&mut a, MEMORY_CPU)], "2 outputs, 1 buffers"),
            (
                vec![buffer(&mut a, MEMORY_CPU), buffer(&mut small, MEMORY_CPU)],
                "'b' has 4 bytes, its buffer 3",
            ),
            (vec![buffer(&mut a, MEMORY_CPU), buffer(&mut b, 2)], "GPU memory"),
            (
                vec![
                    buffer(&mut a, MEMORY_CPU),
                    MESH_OutputBuffer {
                        base: std::ptr::null_mut(),
                        ..buffer(&mut b, 0)
                    },
                ],
                "'b': the buffer is null",
            ),
        ];
        for (buffers, why) in refused {
            // SAFETY: buffers over live local arrays.
            let e = unsafe { place(&mut r, &buffers) }.expect_err(why);
            assert!(message(&e).contains(why), "{why}");
        }
        assert_eq!((a, b), ([0; 8], [0; 4]), "a refused call writes nothing");
        assert_eq!(pack_response(&r), before, "and changes nothing");

        let buffers = [buffer(&mut a, MEMORY_CPU), buffer(&mut b, MEMORY_CPU_PINNED)];
        // SAFETY: as above.
        unsafe { place(&mut r, &buffers) }.expect("placed");
        assert_eq!(a, [1.0f32.to_le_bytes(), 2.0f32.to_le_bytes()].concat()[..]);
        assert_eq!(b, 3.0f32.to_le_bytes());
        assert_eq!(r.outputs[0].base, a.as_ptr() as usize);
        assert_eq!(
            (r.outputs[1].base, r.outputs[1].memory_type),
            (b.as_ptr() as usize, MEMORY_CPU_PINNED)
        );
        assert!(r.outputs.iter().all(|o| o.held.is_none()), "the held bytes are freed");
        assert_ne!(pack_response(&r), before, "the record names the new buffers");
        // SAFETY: as above.
        let again = unsafe { place(&mut r, &buffers) }.expect_err("placed twice");
        assert!(message(&again).contains("not held"));
    }
}
