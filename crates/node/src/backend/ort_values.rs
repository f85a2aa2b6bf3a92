//! Conversions between mesh tensors and ONNX Runtime values, without copies where the layout allows.
use std::borrow::Cow;

use bytes::Bytes;
use mesh::{DataType, Error, Result, Tensor};
use ort::memory::Allocator;
use ort::session::SessionInputValue;
use ort::value::{DynTensor, DynTensorValueType, DynValue, TensorElementType, TensorRef, ValueType};
use ort::AsPointer;

/// The ONNX element type for a mesh data type.
pub fn ort_type(d: DataType) -> TensorElementType {
    match d {
        DataType::Bool => TensorElementType::Bool,
        DataType::Uint8 => TensorElementType::Uint8,
        DataType::Uint16 => TensorElementType::Uint16,
        DataType::Uint32 => TensorElementType::Uint32,
        DataType::Uint64 => TensorElementType::Uint64,
        DataType::Int8 => TensorElementType::Int8,
        DataType::Int16 => TensorElementType::Int16,
        DataType::Int32 => TensorElementType::Int32,
        DataType::Int64 => TensorElementType::Int64,
        DataType::Fp16 => TensorElementType::Float16,
        DataType::Fp32 => TensorElementType::Float32,
        DataType::Fp64 => TensorElementType::Float64,
        DataType::Bytes => TensorElementType::String,
        DataType::Bf16 => TensorElementType::Bfloat16,
    }
}

/// The mesh data type for an ONNX element type, if Triton has one.
pub fn mesh_type(t: TensorElementType) -> Option<DataType> {
    DataType::ALL.into_iter().find(|&d| ort_type(d) == t)
}

fn ort_err(what: &str) -> impl Fn(ort::Error) -> Error + '_ {
    move |e| Error::internal(format!("{what}: {e}"))
}

/// Reinterprets little-endian bytes as `T` when aligned; None when a copy is needed.
fn aligned<T: Copy>(data: &[u8]) -> Option<&[T]> {
    let size = std::mem::size_of::<T>();
    if !(data.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>()) || !data.len().is_multiple_of(size) {
        return None;
    }
    // SAFETY: alignment and length were checked above, and T is only ever a plain numeric type
    // for which every bit pattern is valid (the caller's macro restricts it so).
    Some(unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<T>(), data.len() / size) })
}

/// Makes an input value; borrows the tensor's bytes when they are aligned for the element type.
pub fn to_input<'a>(name: &str, t: &'a Tensor, shape: Vec<i64>) -> Result<SessionInputValue<'a>> {
    let err = ort_err(name);
    macro_rules! numeric {
        ($ty:ty) => {{
            match aligned::<$ty>(&t.data) {
                Some(view) => TensorRef::from_array_view((shape, view)).map_err(&err)?.into(),
                None => {
                    let owned: Vec<$ty> = t
                        .data
                        .chunks_exact(std::mem::size_of::<$ty>())
                        .map(|c| <$ty>::from_le_bytes(c.try_into().expect("chunk size")))
                        .collect();
                    ort::value::Tensor::from_array((shape, owned)).map_err(&err)?.into()
                }
            }
        }};
    }
    Ok(match t.dtype {
        DataType::Uint8 => numeric!(u8),
        DataType::Int8 => numeric!(i8),
        DataType::Uint16 => numeric!(u16),
        DataType::Int16 => numeric!(i16),
        DataType::Uint32 => numeric!(u32),
        DataType::Int32 => numeric!(i32),
        DataType::Uint64 => numeric!(u64),
        DataType::Int64 => numeric!(i64),
        DataType::Fp32 => numeric!(f32),
        DataType::Fp64 => numeric!(f64),
        DataType::Bool => {
            let bools: Vec<bool> = t.data.iter().map(|&b| b != 0).collect();
            ort::value::Tensor::from_array((shape, bools)).map_err(&err)?.into()
        }
        DataType::Fp16 | DataType::Bf16 => {
            let mut v = DynTensor::new(&Allocator::default(), ort_type(t.dtype), shape).map_err(&err)?;
            // SAFETY: the tensor was just allocated with exactly this many bytes (2 per element,
            // and Tensor::check guaranteed the byte length matches the shape).
            unsafe { std::ptr::copy_nonoverlapping(t.data.as_ptr(), v.data_ptr_mut().cast::<u8>(), t.data.len()) };
            v.into()
        }
        DataType::Bytes => string_tensor(t, shape).map_err(&err)?.into(),
    })
}

/// Builds a string tensor element by element, so NUL and non-UTF-8 bytes survive.
fn string_tensor(t: &Tensor, shape: Vec<i64>) -> ort::Result<DynTensor> {
    let mut v = DynTensor::new(&Allocator::default(), TensorElementType::String, shape)?;
    let api = ort::api();
    for (i, e) in t.bytes_elements().enumerate() {
        let mut buf: *mut std::ffi::c_char = std::ptr::null_mut();
        // SAFETY: `v` is a string tensor with at least i+1 elements; ORT resizes element i to
        // e.len() bytes and returns a writable buffer of that size.
        let status = unsafe { (api.GetResizedStringTensorElementBuffer)(v.ptr_mut(), i, e.len(), &mut buf) };
        // SAFETY: `status` is the one ORT just returned; result_from_status releases it.
        unsafe { ort::Error::result_from_status(status) }?;
        if !e.is_empty() {
            // SAFETY: buf points to e.len() writable bytes (see above).
            unsafe { std::ptr::copy_nonoverlapping(e.as_ptr(), buf.cast::<u8>(), e.len()) };
        }
    }
    Ok(v)
}

/// Copies an output value into a mesh tensor with the given shape.
pub fn from_output(name: &str, value: DynValue, shape_override: Option<Vec<i64>>) -> Result<Tensor> {
    let err = ort_err(name);
    let (ty, shape) = match value.dtype() {
        ValueType::Tensor { ty, shape, .. } => (*ty, shape.to_vec()),
        other => {
            return Err(Error::internal(format!(
                "output '{name}' is not a tensor but {other:?}"
            )))
        }
    };
    let dtype = mesh_type(ty).ok_or_else(|| {
        Error::unsupported(format!(
            "output '{name}' has ONNX type {ty:?}, which Triton's protocol cannot carry"
        ))
    })?;
    let tensor = value.downcast::<DynTensorValueType>().map_err(&err)?;
    let data = if dtype == DataType::Bytes {
        read_strings(&tensor).map_err(&err)?
    } else {
        let n = mesh::tensor::byte_size(dtype, &shape)?.unwrap_or(0);
        if n == 0 {
            Bytes::new()
        } else {
            // SAFETY: ORT owns a contiguous CPU buffer of exactly n bytes for this tensor.
            Bytes::copy_from_slice(unsafe { std::slice::from_raw_parts(tensor.data_ptr().cast::<u8>(), n) })
        }
    };
    Ok(Tensor {
        dtype,
        shape: shape_override.unwrap_or(shape),
        data,
    })
}

/// Reads every string element with its exact bytes into Triton's length-prefixed layout.
fn read_strings(t: &DynTensor) -> ort::Result<Bytes> {
    let api = ort::api();
    let count = match t.dtype() {
        ValueType::Tensor { shape, .. } => shape.iter().product::<i64>().max(0) as usize,
        _ => 0,
    };
    let mut total = 0usize;
    // SAFETY: t is a valid string tensor; ORT writes its total byte length.
    unsafe { ort::Error::result_from_status((api.GetStringTensorDataLength)(t.ptr(), &mut total)) }?;
    let mut content = vec![0u8; total];
    let mut offsets = vec![0usize; count];
    // SAFETY: buffers are sized as ORT reported (total bytes, one offset per element).
    unsafe {
        ort::Error::result_from_status((api.GetStringTensorContent)(
            t.ptr(),
            content.as_mut_ptr().cast(),
            total,
            offsets.as_mut_ptr(),
            count,
        ))
    }?;
    let mut out = Vec::with_capacity(total + 4 * count);
    for i in 0..count {
        let end = offsets.get(i + 1).copied().unwrap_or(total);
        let e = &content[offsets[i]..end];
        out.extend_from_slice(&(e.len() as u32).to_le_bytes());
        out.extend_from_slice(e);
    }
    Ok(Bytes::from(out))
}

/// Shape of an outlet with dynamic dims as -1.
pub fn outlet_shape(t: &ValueType) -> Option<(TensorElementType, Vec<i64>)> {
    match t {
        ValueType::Tensor { ty, shape, .. } => Some((*ty, shape.iter().map(|&d| if d < 0 { -1 } else { d }).collect())),
        _ => None,
    }
}

pub type InputList<'a> = Vec<(Cow<'a, str>, SessionInputValue<'a>)>;
