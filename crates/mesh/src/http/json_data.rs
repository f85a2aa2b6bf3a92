//! JSON `data` arrays (flat or nested) to and from tensor bytes, without building a JSON tree.
use std::fmt;

use bytes::{BufMut, BytesMut};
use serde::de::{self, DeserializeSeed, SeqAccess, Visitor};

use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Parses a JSON `data` value for an input of `dtype` into wire-layout bytes; more than
/// `max_elements` values (what the input's shape holds) is refused as soon as the next one is read,
/// so a long array never grows a buffer past the shape.
pub fn parse_data(
    input: &str,
    dtype: DataType,
    raw: &serde_json::value::RawValue,
    max_elements: usize,
) -> Result<BytesMut> {
    if dtype == DataType::Bf16 {
        return Err(Error::invalid(format!(
            "input '{input}': BF16 data cannot be sent as JSON; use the binary tensor extension"
        )));
    }
    let mut sink = Sink {
        dtype,
        out: BytesMut::new(),
        depth: 0,
        left: max_elements,
    };
    let mut de = serde_json::Deserializer::from_str(raw.get());
    de::DeserializeSeed::deserialize(&mut sink, &mut de)
        .map_err(|e| Error::invalid(format!("input '{input}': invalid {dtype} data: {e}")))?;
    Ok(sink.out)
}

struct Sink {
    dtype: DataType,
    out: BytesMut,
    depth: usize,
    /// Values still allowed by the input's shape.
    left: usize,
}

impl Sink {
    fn count<E: de::Error>(&mut self) -> Result<(), E> {
        match self.left.checked_sub(1) {
            Some(left) => {
                self.left = left;
                Ok(())
            }
            None => Err(E::custom("more values than the input's shape holds")),
        }
    }

    /// Writes a number of a float type (a JSON integer in float data comes here too).
    fn put_f64<E: de::Error>(&mut self, v: f64) -> Result<(), E> {
        match self.dtype {
            DataType::Fp32 => self.out.put_f32_le(v as f32),
            DataType::Fp64 => self.out.put_f64_le(v),
            DataType::Fp16 => self.out.put_u16_le(half::f16::from_f64(v).to_bits()),
            d => return Err(E::custom(format!("number {v} is not a valid {d} value"))),
        }
        Ok(())
    }
}

const MAX_DEPTH: usize = 64;

impl<'de> DeserializeSeed<'de> for &mut Sink {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

macro_rules! put_int {
    ($self:ident, $v:expr, $E:ty) => {{
        let v = $v;
        let ok = match $self.dtype {
            DataType::Uint8 => u8::try_from(v).map(|x| $self.out.put_u8(x)).is_ok(),
            DataType::Uint16 => u16::try_from(v).map(|x| $self.out.put_u16_le(x)).is_ok(),
            DataType::Uint32 => u32::try_from(v).map(|x| $self.out.put_u32_le(x)).is_ok(),
            DataType::Uint64 => u64::try_from(v).map(|x| $self.out.put_u64_le(x)).is_ok(),
            DataType::Int8 => i8::try_from(v).map(|x| $self.out.put_i8(x)).is_ok(),
            DataType::Int16 => i16::try_from(v).map(|x| $self.out.put_i16_le(x)).is_ok(),
            DataType::Int32 => i32::try_from(v).map(|x| $self.out.put_i32_le(x)).is_ok(),
            DataType::Int64 => i64::try_from(v).map(|x| $self.out.put_i64_le(x)).is_ok(),
            _ => return $self.put_f64(v as f64),
        };
        if ok {
            Ok(())
        } else {
            Err(<$E>::custom(format!("{v} is out of range for {}", $self.dtype)))
        }
    }};
}

impl<'de> Visitor<'de> for &mut Sink {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{} values in a (possibly nested) array", self.dtype)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.count()?;
        if self.dtype != DataType::Bool {
            return Err(E::custom(format!("boolean value in {} data", self.dtype)));
        }
        self.out.put_u8(v as u8);
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.count()?;
        put_int!(self, v, E)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.count()?;
        put_int!(self, v, E)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.count()?;
        self.put_f64(v)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.count()?;
        if self.dtype != DataType::Bytes {
            return Err(E::custom(format!("string value in {} data", self.dtype)));
        }
        let len = u32::try_from(v.len()).map_err(|_| E::custom("string element longer than 4 GiB"))?;
        self.out.put_u32_le(len);
        self.out.put_slice(v.as_bytes());
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(de::Error::custom("data is nested too deeply"));
        }
        while seq.next_element_seed(&mut *self)?.is_some() {}
        self.depth -= 1;
        Ok(())
    }
}

/// Renders a tensor as a flat JSON array for a JSON (non-binary) response.
pub fn to_json_array(name: &str, t: &Tensor) -> Result<serde_json::Value> {
    use serde_json::Value as V;
    let d = &t.data[..];
    macro_rules! nums {
        ($ty:ty, $n:expr) => {
            d.chunks_exact($n)
                .map(|c| V::from(<$ty>::from_le_bytes(c.try_into().unwrap())))
                .collect()
        };
    }
    let values: Vec<V> = match t.dtype {
        DataType::Bool => d.iter().map(|&b| V::Bool(b != 0)).collect(),
        DataType::Uint8 => d.iter().map(|&b| V::from(b)).collect(),
        DataType::Int8 => d.iter().map(|&b| V::from(b as i8)).collect(),
        DataType::Uint16 => nums!(u16, 2),
        DataType::Int16 => nums!(i16, 2),
        DataType::Uint32 => nums!(u32, 4),
        DataType::Int32 => nums!(i32, 4),
        DataType::Uint64 => nums!(u64, 8),
        DataType::Int64 => nums!(i64, 8),
        DataType::Fp32 => nums!(f32, 4),
        DataType::Fp64 => nums!(f64, 8),
        DataType::Fp16 => d
            .chunks_exact(2)
            .map(|c| V::from(half::f16::from_le_bytes([c[0], c[1]]).to_f32()))
            .collect(),
        DataType::Bf16 => d
            .chunks_exact(2)
            .map(|c| V::from(half::bf16::from_le_bytes([c[0], c[1]]).to_f32()))
            .collect(),
        DataType::Bytes => {
            let mut out = Vec::new();
            for e in t.bytes_elements() {
                let s = std::str::from_utf8(e).map_err(|_| {
                    Error::invalid(format!(
                        "output '{name}' holds non-UTF-8 bytes that JSON cannot carry; request it with binary_data"
                    ))
                })?;
                out.push(V::from(s));
            }
            out
        }
    };
    Ok(V::Array(values))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::value::RawValue;

    fn parse(dtype: DataType, json: &str) -> Result<Vec<u8>> {
        let raw: Box<RawValue> = serde_json::from_str(json).unwrap();
        parse_data("x", dtype, &raw, 64).map(|b| b.to_vec())
    }

    #[test]
    fn more_values_than_the_shape_holds_are_refused() {
        let raw: Box<RawValue> = serde_json::from_str("[[1, 2], [3, 4]]").unwrap();
        assert_eq!(parse_data("x", DataType::Fp32, &raw, 4).unwrap().len(), 16);
        let e = parse_data("x", DataType::Fp32, &raw, 3).unwrap_err();
        assert!(
            e.message.contains("more values than the input's shape holds"),
            "{}",
            e.message
        );
        let raw: Box<RawValue> = serde_json::from_str(r#"["a", "b"]"#).unwrap();
        assert!(parse_data("x", DataType::Bytes, &raw, 1).is_err());
    }

    #[test]
    fn flat_and_nested_arrays() {
        assert_eq!(parse(DataType::Int16, "[1, -2]").unwrap(), vec![1, 0, 0xfe, 0xff]);
        assert_eq!(parse(DataType::Uint8, "[[1,2],[3,4]]").unwrap(), vec![1, 2, 3, 4]);
        assert_eq!(parse(DataType::Bool, "[true,false]").unwrap(), vec![1, 0]);
        assert_eq!(
            parse(DataType::Fp32, "[1, 2.5]").unwrap(),
            [1f32.to_le_bytes(), 2.5f32.to_le_bytes()].concat()
        );
        assert_eq!(
            parse(DataType::Fp16, "[1.0]").unwrap(),
            half::f16::from_f32(1.0).to_le_bytes().to_vec()
        );
        let b = parse(DataType::Bytes, r#"["", "a\u0000b"]"#).unwrap();
        assert_eq!(b, vec![0, 0, 0, 0, 3, 0, 0, 0, b'a', 0, b'b']);
    }

    #[test]
    fn type_and_range_errors_are_named() {
        assert!(parse(DataType::Uint8, "[256]")
            .unwrap_err()
            .message
            .contains("out of range for UINT8"));
        assert!(parse(DataType::Uint32, "[-1]")
            .unwrap_err()
            .message
            .contains("out of range"));
        assert!(parse(DataType::Int32, "[1.5]")
            .unwrap_err()
            .message
            .contains("not a valid INT32"));
        assert!(parse(DataType::Fp32, "[\"a\"]")
            .unwrap_err()
            .message
            .contains("string value"));
        assert!(parse(DataType::Bool, "[1]").is_err());
        assert!(parse(DataType::Bytes, "[1]").is_err());
        assert!(parse(DataType::Fp32, "[null]").is_err());
        assert!(parse(DataType::Fp32, "{\"a\":1}").is_err());
        assert!(parse(DataType::Bf16, "[1]").unwrap_err().message.contains("binary"));
        let deep = format!("{}1{}", "[".repeat(100), "]".repeat(100));
        assert!(parse(DataType::Int8, &deep).is_err());
    }

    #[test]
    fn json_output_round_trip_and_non_utf8() {
        let t = Tensor::from_values(vec![2], &[-1i64, 7]);
        assert_eq!(to_json_array("y", &t).unwrap(), serde_json::json!([-1, 7]));
        let b = Tensor::from_bytes_elements(vec![1], [[0xffu8]]);
        assert!(to_json_array("y", &b).unwrap_err().message.contains("non-UTF-8"));
        let h = Tensor::from_values(vec![1], &[half::bf16::from_f32(2.0)]);
        assert_eq!(to_json_array("y", &h).unwrap(), serde_json::json!([2.0]));
    }
}
