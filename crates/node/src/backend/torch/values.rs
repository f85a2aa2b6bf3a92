//! Conversions between the mesh's tensors and torch values (tensors, scalars, string lists, dicts).
use bytes::Bytes;
use mesh::{DataType, Error, Result, Tensor};
use tch::{IValue, Kind};

use super::binding::Produced;
use super::signature::ArgType;

/// The torch element kind of a mesh dtype (torch has no unsigned kinds past uint8).
pub fn kind_of(d: DataType) -> Option<Kind> {
    Some(match d {
        DataType::Bool => Kind::Bool,
        DataType::Uint8 => Kind::Uint8,
        DataType::Int8 => Kind::Int8,
        DataType::Int16 => Kind::Int16,
        DataType::Int32 => Kind::Int,
        DataType::Int64 => Kind::Int64,
        DataType::Fp16 => Kind::Half,
        DataType::Fp32 => Kind::Float,
        DataType::Fp64 => Kind::Double,
        DataType::Bf16 => Kind::BFloat16,
        DataType::Uint16 | DataType::Uint32 | DataType::Uint64 | DataType::Bytes => return None,
    })
}

/// The mesh dtype of a torch element kind: `kind_of` read backwards, so the two cannot disagree.
pub fn dtype_of(k: Kind) -> Option<DataType> {
    DataType::ALL.into_iter().find(|&d| kind_of(d) == Some(k))
}

/// Copies a request tensor into a torch tensor on `device`.
pub fn to_torch(name: &str, t: &Tensor, device: tch::Device) -> Result<tch::Tensor> {
    let kind = kind_of(t.dtype).ok_or_else(|| {
        Error::invalid(format!(
            "input '{name}' is {}, which torch has no tensor kind for",
            t.dtype
        ))
    })?;
    // torch copies as many bytes as the shape says, so the length is checked here, not trusted.
    if Some(t.data.len()) != t.element_count().checked_mul(kind.elt_size_in_bytes()) {
        return Err(Error::internal(format!(
            "input '{name}' has {} bytes, which does not match its shape {:?}",
            t.data.len(),
            t.shape
        )));
    }
    // The request's bytes are copied once: into a new host tensor, or for a GPU into pinned memory
    // (torch's caching host allocator, which also keeps the block until the copy to the device is
    // done with it); typed there, aligned whatever the offset of the request's bytes. To a GPU they
    // then go on the current stream without waiting; forward() runs after them on that stream.
    let moved = |e: tch::TchError| Error::internal(format!("input '{name}' could not move to {device:?}: {e}"));
    let len = i64::try_from(t.data.len()).map_err(|_| Error::invalid(format!("input '{name}' is too large")))?;
    // SAFETY: `view` covers exactly the `len` bytes of `t.data`, read as bytes (no alignment), and
    // is dropped before this returns; the copy and _pin_memory read it synchronously.
    let view = unsafe { tch::Tensor::f_from_blob(t.data.as_ptr(), &[len], &[], tch::Kind::Uint8, tch::Device::Cpu) }
        .map_err(|e| Error::invalid(format!("input '{name}': {e}")))?;
    let typed = |c: tch::Tensor| c.f_view_dtype(kind)?.f_reshape(t.shape.as_slice());
    if device == tch::Device::Cpu {
        let mut copy = tch::Tensor::f_empty([len], (tch::Kind::Uint8, device)).map_err(moved)?;
        return copy.f_copy_(&view).and_then(|()| typed(copy)).map_err(moved);
    }
    view.f_internal_pin_memory(device)
        .and_then(typed)
        .and_then(|pinned| pinned.f_to_device_(device, kind, true, false))
        .map_err(moved)
}

/// Queues the copy of a device tensor to pinned host memory on the current stream (contiguous),
/// for `from_torch` to read once the stream is synchronised. A host tensor is returned as it is.
pub fn stage_to_host(name: &str, t: &tch::Tensor) -> Result<tch::Tensor> {
    if t.device() == tch::Device::Cpu {
        return Ok(t.shallow_clone());
    }
    let fail = |e: tch::TchError| Error::internal(format!("output '{name}': {e}"));
    let kind = t.f_kind().map_err(fail)?;
    t.f_contiguous()
        .and_then(|c| c.f_to_device_(tch::Device::Cpu, kind, true, false))
        .map_err(fail)
}

/// Reads the one element of an input bound to a scalar argument (int, float, bool or str).
pub fn to_scalar(name: &str, t: &Tensor, ty: &ArgType) -> Result<IValue> {
    if t.element_count() != 1 {
        return Err(Error::invalid(format!(
            "input '{name}' feeds an argument that takes one value, but has shape {:?}",
            t.shape
        )));
    }
    let b = &t.data[..];
    let int = || -> Option<i64> {
        Some(match t.dtype {
            DataType::Int8 => b[0] as i8 as i64,
            DataType::Uint8 => b[0] as i64,
            DataType::Int16 => i16::from_le_bytes(b.try_into().ok()?) as i64,
            DataType::Int32 => i32::from_le_bytes(b.try_into().ok()?) as i64,
            DataType::Int64 => i64::from_le_bytes(b.try_into().ok()?),
            _ => return None,
        })
    };
    let float = || -> Option<f64> {
        Some(match t.dtype {
            DataType::Fp16 => half::f16::from_le_bytes(b.try_into().ok()?).to_f64(),
            DataType::Bf16 => half::bf16::from_le_bytes(b.try_into().ok()?).to_f64(),
            DataType::Fp32 => f32::from_le_bytes(b.try_into().ok()?) as f64,
            DataType::Fp64 => f64::from_le_bytes(b.try_into().ok()?),
            _ => int()? as f64,
        })
    };
    let value = match ty {
        ArgType::Int => int().map(IValue::Int),
        ArgType::Float => float().map(IValue::Double),
        ArgType::Bool if t.dtype == DataType::Bool => Some(IValue::Bool(b[0] != 0)),
        ArgType::Str => strings(name, t)?.pop().map(IValue::String),
        _ => None,
    };
    value.ok_or_else(|| Error::invalid(format!("input '{name}' ({}) cannot be read as {ty:?}", t.dtype)))
}

/// The elements of a BYTES input as strings (TorchScript's `str` is UTF-8).
pub fn strings(name: &str, t: &Tensor) -> Result<Vec<String>> {
    t.bytes_elements()
        .map(|e| {
            if e.contains(&0) {
                // libtorch takes C strings, which end at the first NUL.
                return Err(Error::invalid(format!("input '{name}' has an element with a NUL byte")));
            }
            String::from_utf8(e.to_vec())
                .map_err(|_| Error::invalid(format!("input '{name}' has an element that is not UTF-8")))
        })
        .collect()
}

/// A value forward() returned, at the bottom of its tuples, lists and dicts.
pub enum Leaf {
    Tensor(tch::Tensor),
    Strings(Vec<String>),
}

/// Splits a returned value into its leaves and the shape that holds them.
pub fn walk(value: IValue, leaves: &mut Vec<Leaf>) -> Result<Produced> {
    let mut leaf = |l: Leaf| {
        leaves.push(l);
        Produced::Leaf(leaves.len() - 1)
    };
    Ok(match value {
        IValue::Tensor(t) => leaf(Leaf::Tensor(t)),
        IValue::StringList(s) => leaf(Leaf::Strings(s)),
        // An empty List[str] comes back as an empty generic list (an empty List[Tensor] is a TensorList).
        IValue::GenericList(items) if items.iter().all(|i| matches!(i, IValue::String(_))) => {
            let s = items
                .into_iter()
                .filter_map(|i| match i {
                    IValue::String(s) => Some(s),
                    _ => None,
                })
                .collect();
            leaf(Leaf::Strings(s))
        }
        IValue::TensorList(ts) => Produced::Seq(ts.into_iter().map(|t| leaf(Leaf::Tensor(t))).collect()),
        IValue::Tuple(items) | IValue::GenericList(items) => {
            Produced::Seq(items.into_iter().map(|i| walk(i, leaves)).collect::<Result<_>>()?)
        }
        IValue::GenericDict(entries) => {
            let mut out = Vec::with_capacity(entries.len());
            for (k, v) in entries {
                let key = match k {
                    IValue::String(s) => s,
                    IValue::Int(i) => i.to_string(),
                    other => {
                        return Err(Error::internal(format!(
                            "the model returned a dict keyed by {}, which cannot name an output",
                            kind_name(&other)
                        )))
                    }
                };
                out.push((key, walk(v, leaves)?));
            }
            Produced::Map(out)
        }
        other => {
            return Err(Error::internal(format!(
                "the model returned {}, which is not a tensor, List[str], tuple, list or dict",
                kind_name(&other)
            )))
        }
    })
}

fn kind_name(v: &IValue) -> &'static str {
    match v {
        IValue::None => "None",
        IValue::Double(_) => "a float",
        IValue::Int(_) => "an int",
        IValue::Bool(_) => "a bool",
        IValue::String(_) => "a str",
        IValue::Object(_) => "an object",
        IValue::Device(_) => "a device",
        IValue::IntList(_) | IValue::DoubleList(_) | IValue::BoolList(_) => "a list of numbers",
        _ => "a container",
    }
}

/// Copies a returned tensor out as output `name`, checking its dtype against config's.
pub fn from_torch(name: &str, t: &tch::Tensor, want: DataType) -> Result<Tensor> {
    let kind = t
        .f_kind()
        .map_err(|e| Error::internal(format!("output '{name}': {e}")))?;
    let got = dtype_of(kind);
    if got != Some(want) {
        return Err(Error::internal(format!(
            "output '{name}' is {} from the model but {want} in config.pbtxt",
            got.map_or_else(|| format!("{kind:?}"), |d| d.to_string())
        )));
    }
    let fail = |e: tch::TchError| Error::internal(format!("output '{name}': {e}"));
    let cpu = t
        .f_to_device(tch::Device::Cpu)
        .map_err(fail)?
        .f_contiguous()
        .map_err(fail)?;
    let n = cpu.numel();
    let mut buf = vec![0u8; n * kind.elt_size_in_bytes()];
    cpu.f_copy_data_u8(&mut buf, n).map_err(fail)?;
    Ok(Tensor {
        dtype: want,
        shape: cpu.size(),
        data: Bytes::from(buf),
    })
}

/// A returned List[str] as a BYTES output shaped by config's dims (batch first when batching).
pub fn from_strings(name: &str, s: &[String], want: DataType, batch: Option<i64>, dims: &[i64]) -> Result<Tensor> {
    if want != DataType::Bytes {
        return Err(Error::internal(format!(
            "output '{name}' is List[str] from the model but {want} in config.pbtxt (strings need TYPE_STRING)"
        )));
    }
    let n = s.len() as i64;
    let shape = strings_shape(batch, dims, n).ok_or_else(|| {
        Error::internal(format!(
            "output '{name}': the model returned {n} strings, which do not fit dims {dims:?}{}",
            batch.map_or_else(String::new, |b| format!(" for a batch of {b}"))
        ))
    })?;
    Ok(Tensor::from_bytes_elements(shape, s))
}

/// The shape of `n` strings under config dims with at most one -1. When batching, the dims must be
/// fixed: a flat list cannot say which strings belong to which request of the batch.
fn strings_shape(batch: Option<i64>, dims: &[i64], n: i64) -> Option<Vec<i64>> {
    let mut shape: Vec<i64> = batch.into_iter().chain(dims.iter().copied()).collect();
    let known: i64 = shape.iter().filter(|&&d| d >= 0).product();
    let wild = shape.iter().filter(|&&d| d < 0).count();
    match wild {
        0 if known == n => Some(shape),
        _ if batch.is_some() => None,
        1 if known > 0 && n % known == 0 => {
            if let Some(d) = shape.iter_mut().find(|d| **d < 0) {
                *d = n / known;
            }
            Some(shape)
        }
        _ if wild > 1 => Some(vec![n]),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_typed_on_an_aligned_copy_whatever_the_offset_of_their_bytes() {
        // The request's bytes start one byte into their buffer, as a binary HTTP tensor may.
        let values = [1.5f32, -2.0, 3.25, 8.0, 0.5, -0.25];
        let mut raw = vec![0u8];
        raw.extend(values.iter().flat_map(|v| v.to_le_bytes()));
        let data = Bytes::from(raw).slice(1..);
        let t = Tensor {
            dtype: DataType::Fp32,
            shape: vec![2, 3],
            data,
        };
        let out = to_torch("x", &t, tch::Device::Cpu).unwrap();
        assert_eq!(out.size(), vec![2, 3]);
        assert_eq!(Vec::<f32>::try_from(out.flatten(0, -1)).unwrap(), values);
        // A copy: the tensor does not point into the request's bytes.
        assert_ne!(out.data_ptr() as usize, t.data.as_ptr() as usize);
        let short = Tensor { shape: vec![2, 4], ..t };
        let err = to_torch("x", &short, tch::Device::Cpu).unwrap_err().to_string();
        assert!(err.contains("does not match its shape"), "{err}");
    }

    #[test]
    fn returned_values_split_into_leaves_and_shape() {
        let t = || IValue::Tensor(tch::Tensor::from_slice(&[1.0f32, 2.0]));
        let value = IValue::Tuple(vec![
            t(),
            IValue::GenericDict(vec![
                (
                    IValue::String("labels".into()),
                    IValue::StringList(vec!["a".into(), "b".into()]),
                ),
                (
                    IValue::String("more".into()),
                    IValue::TensorList(vec![tch::Tensor::from_slice(&[3i64])]),
                ),
            ]),
        ]);
        let mut leaves = Vec::new();
        let produced = walk(value, &mut leaves).unwrap();
        assert_eq!(
            produced,
            Produced::Seq(vec![
                Produced::Leaf(0),
                Produced::Map(vec![
                    ("labels".into(), Produced::Leaf(1)),
                    ("more".into(), Produced::Seq(vec![Produced::Leaf(2)])),
                ]),
            ])
        );
        assert!(matches!(&leaves[1], Leaf::Strings(s) if s == &["a", "b"]));
        let mut empty = Vec::new();
        assert_eq!(
            walk(IValue::GenericList(vec![]), &mut empty).unwrap(),
            Produced::Leaf(0)
        );
        assert!(
            matches!(&empty[0], Leaf::Strings(s) if s.is_empty()),
            "an empty List[str]"
        );
        let err = walk(IValue::Double(1.0), &mut Vec::new()).err().unwrap();
        assert!(err.message.contains("a float"), "{err:?}");
    }

    #[test]
    fn tensors_round_trip_and_dtypes_are_checked_not_cast() {
        let mesh_t = Tensor::from_values(vec![2, 2], &[1.0f32, -2.0, 3.5, 4.0]);
        let torch_t = to_torch("x", &mesh_t, tch::Device::Cpu).unwrap();
        assert_eq!(torch_t.size(), vec![2, 2]);
        assert_eq!(from_torch("y", &torch_t, DataType::Fp32).unwrap(), mesh_t);
        let err = from_torch("y", &torch_t, DataType::Fp64).unwrap_err();
        assert!(
            err.message.contains("output 'y' is FP32 from the model but FP64"),
            "{err:?}"
        );
        let strided = torch_t.transpose(0, 1);
        let back = from_torch("t", &strided, DataType::Fp32).unwrap();
        assert_eq!(back, Tensor::from_values(vec![2, 2], &[1.0f32, 3.5, -2.0, 4.0]));
        let unsigned = Tensor::from_values(vec![1], &[7u32]);
        assert!(to_torch("u", &unsigned, tch::Device::Cpu).is_err());
    }

    #[test]
    fn scalars_read_one_element() {
        let sr = Tensor::from_values(vec![1], &[16000i64]);
        assert!(matches!(
            to_scalar("sr", &sr, &ArgType::Int).unwrap(),
            IValue::Int(16000)
        ));
        let half = Tensor::from_values(vec![1], &[half::f16::from_f32(0.5)]);
        assert!(matches!(to_scalar("s", &half, &ArgType::Float).unwrap(), IValue::Double(v) if v == 0.5));
        let two = Tensor::from_values(vec![2], &[1i64, 2]);
        assert!(to_scalar("sr", &two, &ArgType::Int)
            .unwrap_err()
            .message
            .contains("one value"));
        let word = Tensor::from_bytes_elements(vec![1], ["héllo"]);
        assert!(matches!(to_scalar("w", &word, &ArgType::Str).unwrap(), IValue::String(s) if s == "héllo"));
        let bad = Tensor::from_bytes_elements(vec![1], [[0xffu8, 0xfe]]);
        assert!(strings("w", &bad).unwrap_err().message.contains("not UTF-8"));
        let nul = Tensor::from_bytes_elements(vec![1], [b"a\0b"]);
        assert!(strings("w", &nul).unwrap_err().message.contains("NUL"));
        let short = Tensor {
            dtype: DataType::Fp32,
            shape: vec![4],
            data: Bytes::from_static(&[0; 8]),
        };
        assert!(to_torch("x", &short, tch::Device::Cpu)
            .unwrap_err()
            .message
            .contains("8 bytes"));
    }

    #[test]
    fn string_lists_take_config_dims() {
        assert_eq!(strings_shape(None, &[-1], 3), Some(vec![3]));
        assert_eq!(strings_shape(None, &[-1], 0), Some(vec![0]));
        assert_eq!(strings_shape(Some(2), &[-1], 6), None, "rows may hold different counts");
        assert_eq!(strings_shape(Some(2), &[1], 2), Some(vec![2, 1]));
        assert_eq!(strings_shape(Some(2), &[1], 3), None);
        assert_eq!(strings_shape(None, &[2], 3), None);
        assert_eq!(strings_shape(None, &[-1, -1], 3), Some(vec![3]));
    }
}
