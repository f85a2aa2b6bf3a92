//! The one tensor type used by HTTP, gRPC, the cluster link and the backends.
use bytes::{BufMut, Bytes, BytesMut};

use crate::dtype::DataType;
use crate::error::{Error, Result};

/// A tensor: element type, shape, and reference-counted bytes in Triton's wire layout
/// (little-endian, row-major; BYTES elements as a u32 LE length followed by the bytes).
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub dtype: DataType,
    pub shape: Vec<i64>,
    pub data: Bytes,
}

/// A tensor with the name it carries in a request or response.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedTensor {
    pub name: String,
    pub tensor: Tensor,
}

/// Number of elements of a shape; rejects negative dims and overflow instead of trusting them.
pub fn element_count(shape: &[i64]) -> Result<usize> {
    let mut n: usize = 1;
    for &d in shape {
        if d < 0 {
            return Err(Error::invalid(format!("shape {shape:?} has a negative dimension")));
        }
        n = usize::try_from(d)
            .ok()
            .and_then(|d| n.checked_mul(d))
            .ok_or_else(|| Error::invalid(format!("shape {shape:?} is too large")))?;
    }
    Ok(n)
}

/// Expected byte size of a fixed-size tensor, with overflow checked.
pub fn byte_size(dtype: DataType, shape: &[i64]) -> Result<Option<usize>> {
    let n = element_count(shape)?;
    match dtype.element_size() {
        None => Ok(None),
        Some(sz) => n
            .checked_mul(sz)
            .map(Some)
            .ok_or_else(|| Error::invalid(format!("shape {shape:?} is too large"))),
    }
}

impl Tensor {
    /// Builds a tensor after checking that the data matches dtype and shape.
    pub fn new(dtype: DataType, shape: Vec<i64>, data: Bytes) -> Result<Self> {
        let t = Tensor { dtype, shape, data };
        t.check()?;
        Ok(t)
    }

    /// Checks byte size (fixed types) or BYTES framing and element count.
    pub fn check(&self) -> Result<()> {
        let n = element_count(&self.shape)?;
        match byte_size(self.dtype, &self.shape)? {
            Some(expected) if expected != self.data.len() => Err(Error::invalid(format!(
                "{} tensor of shape {:?} needs {} bytes, got {}",
                self.dtype,
                self.shape,
                expected,
                self.data.len()
            ))),
            Some(_) => Ok(()),
            None => {
                let got = count_bytes_elements(&self.data)?;
                if got != n {
                    return Err(Error::invalid(format!(
                        "BYTES tensor of shape {:?} needs {} elements, got {}",
                        self.shape, n, got
                    )));
                }
                Ok(())
            }
        }
    }

    pub fn element_count(&self) -> usize {
        element_count(&self.shape).unwrap_or(0)
    }

    /// The largest absolute difference between this tensor's elements and `other`'s, read as f64
    /// (64-bit integers beyond 2^53 rounded), without copying either: 0 when equal (NaN against NaN
    /// and equal infinities too), infinite where one is NaN and the other not. None when they
    /// differ in type or size, or are BYTES.
    pub fn max_abs_diff(&self, other: &Tensor) -> Option<f64> {
        fn fold<const N: usize>(a: &[u8], b: &[u8], f: impl Fn([u8; N]) -> f64) -> f64 {
            let each = |c: &[u8]| f(c.try_into().expect("chunk of N bytes"));
            a.chunks_exact(N)
                .zip(b.chunks_exact(N))
                .map(|(x, y)| {
                    let (x, y) = (each(x), each(y));
                    match (x.is_nan(), y.is_nan()) {
                        (true, true) => 0.0,
                        (false, false) if x == y => 0.0,
                        (false, false) => (x - y).abs(),
                        _ => f64::INFINITY,
                    }
                })
                .fold(0.0, f64::max)
        }
        if self.dtype != other.dtype || self.data.len() != other.data.len() {
            return None;
        }
        let (a, b) = (&self.data[..], &other.data[..]);
        Some(match self.dtype {
            DataType::Bool | DataType::Uint8 => fold::<1>(a, b, |x| f64::from(x[0])),
            DataType::Int8 => fold::<1>(a, b, |x| f64::from(x[0] as i8)),
            DataType::Uint16 => fold(a, b, |x| f64::from(u16::from_le_bytes(x))),
            DataType::Int16 => fold(a, b, |x| f64::from(i16::from_le_bytes(x))),
            DataType::Uint32 => fold(a, b, |x| f64::from(u32::from_le_bytes(x))),
            DataType::Int32 => fold(a, b, |x| f64::from(i32::from_le_bytes(x))),
            DataType::Uint64 => fold(a, b, |x| u64::from_le_bytes(x) as f64),
            DataType::Int64 => fold(a, b, |x| i64::from_le_bytes(x) as f64),
            DataType::Fp16 => fold(a, b, |x| f64::from(half::f16::from_le_bytes(x))),
            DataType::Bf16 => fold(a, b, |x| f64::from(half::bf16::from_le_bytes(x))),
            DataType::Fp32 => fold(a, b, |x| f64::from(f32::from_le_bytes(x))),
            DataType::Fp64 => fold(a, b, f64::from_le_bytes),
            DataType::Bytes => return None,
        })
    }

    /// Iterates BYTES elements (call only on BYTES tensors that passed `check`).
    pub fn bytes_elements(&self) -> BytesElements<'_> {
        BytesElements { rest: &self.data }
    }

    /// Builds a BYTES tensor from elements.
    pub fn from_bytes_elements<I, B>(shape: Vec<i64>, elements: I) -> Self
    where
        I: IntoIterator<Item = B>,
        B: AsRef<[u8]>,
    {
        Tensor {
            dtype: DataType::Bytes,
            shape,
            data: encode_bytes_elements(elements),
        }
    }

    /// Builds a fixed-size tensor from plain values, copying them into little-endian bytes.
    pub fn from_values<T: WireValue>(shape: Vec<i64>, values: &[T]) -> Self {
        let mut buf = BytesMut::with_capacity(std::mem::size_of_val(values));
        for v in values {
            v.put(&mut buf);
        }
        Tensor {
            dtype: T::DTYPE,
            shape,
            data: buf.freeze(),
        }
    }
}

/// A plain element type with a little-endian wire form.
pub trait WireValue: Copy {
    const DTYPE: DataType;
    fn put(&self, buf: &mut BytesMut);
}

macro_rules! wire_value {
    ($t:ty, $d:expr) => {
        impl WireValue for $t {
            const DTYPE: DataType = $d;
            fn put(&self, buf: &mut BytesMut) {
                buf.put_slice(&self.to_le_bytes());
            }
        }
    };
}
wire_value!(u8, DataType::Uint8);
wire_value!(u16, DataType::Uint16);
wire_value!(u32, DataType::Uint32);
wire_value!(u64, DataType::Uint64);
wire_value!(i8, DataType::Int8);
wire_value!(i16, DataType::Int16);
wire_value!(i32, DataType::Int32);
wire_value!(i64, DataType::Int64);
wire_value!(f32, DataType::Fp32);
wire_value!(f64, DataType::Fp64);
wire_value!(half::f16, DataType::Fp16);
wire_value!(half::bf16, DataType::Bf16);

impl WireValue for bool {
    const DTYPE: DataType = DataType::Bool;
    fn put(&self, buf: &mut BytesMut) {
        buf.put_u8(*self as u8);
    }
}

/// Serializes BYTES elements with Triton's u32 little-endian length prefix.
pub fn encode_bytes_elements<I, B>(elements: I) -> Bytes
where
    I: IntoIterator<Item = B>,
    B: AsRef<[u8]>,
{
    let mut buf = BytesMut::new();
    for e in elements {
        let e = e.as_ref();
        buf.put_u32_le(e.len() as u32);
        buf.put_slice(e);
    }
    buf.freeze()
}

/// Counts length-prefixed elements, rejecting truncated framing.
pub fn count_bytes_elements(data: &[u8]) -> Result<usize> {
    let mut it = BytesElements { rest: data };
    let mut n = 0;
    while let Some(e) = it.next_checked() {
        e?;
        n += 1;
    }
    Ok(n)
}

/// Iterator over length-prefixed BYTES elements.
pub struct BytesElements<'a> {
    rest: &'a [u8],
}

impl<'a> BytesElements<'a> {
    /// Next element, or an error naming truncated framing.
    pub fn next_checked(&mut self) -> Option<Result<&'a [u8]>> {
        if self.rest.is_empty() {
            return None;
        }
        if self.rest.len() < 4 {
            self.rest = &[];
            return Some(Err(Error::invalid(
                "BYTES element has a truncated 4-byte length prefix",
            )));
        }
        let len = u32::from_le_bytes([self.rest[0], self.rest[1], self.rest[2], self.rest[3]]) as usize;
        let body = &self.rest[4..];
        if body.len() < len {
            self.rest = &[];
            return Some(Err(Error::invalid(format!(
                "BYTES element declares {len} bytes but only {} remain",
                body.len()
            ))));
        }
        self.rest = &body[len..];
        Some(Ok(&body[..len]))
    }
}

impl<'a> Iterator for BytesElements<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        self.next_checked().and_then(|r| r.ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_count_rejects_negative_and_overflow() {
        assert_eq!(element_count(&[2, 3]).unwrap(), 6);
        assert_eq!(element_count(&[]).unwrap(), 1);
        assert_eq!(element_count(&[0, 5]).unwrap(), 0);
        assert!(element_count(&[-1, 3]).unwrap_err().message.contains("negative"));
        assert!(element_count(&[1 << 40, 1 << 40])
            .unwrap_err()
            .message
            .contains("too large"));
        assert!(byte_size(DataType::Fp64, &[1 << 31, 1 << 31]).is_err());
    }

    #[test]
    fn fixed_size_check_names_sizes() {
        let t = Tensor::new(DataType::Fp32, vec![2], Bytes::from_static(&[0; 8]));
        assert!(t.is_ok());
        let e = Tensor::new(DataType::Fp32, vec![3], Bytes::from_static(&[0; 8])).unwrap_err();
        assert!(e.message.contains("needs 12 bytes, got 8"), "{e}");
    }

    #[test]
    fn bytes_round_trip_edge_cases() {
        let elems: Vec<&[u8]> = vec![b"", b"a\0b", &[0xff, 0xfe, 0x00], b"hello"];
        let t = Tensor::from_bytes_elements(vec![4], &elems);
        t.check().unwrap();
        let back: Vec<&[u8]> = t.bytes_elements().collect();
        assert_eq!(back, elems);
        assert_eq!(&t.data[..4], &[0, 0, 0, 0]);
    }

    #[test]
    fn bytes_framing_errors() {
        // truncated prefix
        assert!(count_bytes_elements(&[1, 0]).is_err());
        // length overruns
        let e = count_bytes_elements(&[5, 0, 0, 0, b'a']).unwrap_err();
        assert!(e.message.contains("declares 5 bytes"), "{e}");
        // element count mismatch
        let t = Tensor {
            dtype: DataType::Bytes,
            shape: vec![2],
            data: encode_bytes_elements([b"x"]),
        };
        assert!(t.check().unwrap_err().message.contains("needs 2 elements, got 1"));
        // huge declared length does not allocate
        assert!(count_bytes_elements(&[0xff, 0xff, 0xff, 0xff]).is_err());
    }

    #[test]
    fn the_largest_difference_reads_every_numeric_type_and_not_bytes() {
        let d = |a: Tensor, b: Tensor| a.max_abs_diff(&b);
        let v = Tensor::from_values::<i8>;
        assert_eq!(d(v(vec![2], &[-1, 7]), v(vec![2], &[1, 7])), Some(2.0));
        assert_eq!(
            d(
                Tensor::from_values(vec![1], &[-300i16]),
                Tensor::from_values(vec![1], &[300i16])
            ),
            Some(600.0)
        );
        assert_eq!(
            d(
                Tensor::from_values(vec![1], &[7u32]),
                Tensor::from_values(vec![1], &[70_000u32])
            ),
            Some(69_993.0)
        );
        assert_eq!(
            d(
                Tensor::from_values(vec![1], &[u64::MAX]),
                Tensor::from_values(vec![1], &[0u64])
            ),
            Some(u64::MAX as f64)
        );
        assert_eq!(
            d(
                Tensor::from_values(vec![2], &[true, false]),
                Tensor::from_values(vec![2], &[true, true])
            ),
            Some(1.0)
        );
        assert_eq!(
            d(
                Tensor::from_values(vec![1], &[1.5f32]),
                Tensor::from_values(vec![1], &[1.0f32])
            ),
            Some(0.5)
        );
        let h = |x: f32| Tensor::from_values(vec![1], &[half::f16::from_f32(x)]);
        assert_eq!(d(h(0.5), h(0.25)), Some(0.25));
        let f = |x: &[f64]| Tensor::from_values(vec![x.len() as i64], x);
        assert_eq!(d(f(&[f64::NAN, 1.0]), f(&[f64::NAN, 1.0])), Some(0.0));
        assert_eq!(d(f(&[f64::NAN]), f(&[1.0])), Some(f64::INFINITY));
        assert_eq!(d(f(&[f64::INFINITY]), f(&[f64::INFINITY])), Some(0.0));
        assert_eq!(d(f(&[1.0]), f(&[1.0, 2.0])), None, "sizes differ");
        assert_eq!(
            d(f(&[1.0]), Tensor::from_values(vec![1], &[1.0f32])),
            None,
            "types differ"
        );
        let text = Tensor::from_bytes_elements(vec![1], [b"x"]);
        assert_eq!(text.max_abs_diff(&text), None);
    }

    #[test]
    fn from_values_is_little_endian() {
        let t = Tensor::from_values(vec![2], &[1u16, 0x0203]);
        assert_eq!(&t.data[..], &[1, 0, 3, 2]);
        let b = Tensor::from_values(vec![2], &[true, false]);
        assert_eq!(b.dtype, DataType::Bool);
        assert_eq!(&b.data[..], &[1, 0]);
    }
}
