//! Merging the inputs of batched requests into one execution and splitting the outputs back, without IO.
use std::hash::{Hash, Hasher};

use bytes::{Bytes, BytesMut};
use mesh::{DataType, Error, NamedTensor, Result, Tensor};

/// Signature of everything but the batch dimension (and the shapes of `ragged` inputs): only
/// requests with equal keys may share a batch.
pub fn shape_key(inputs: &[NamedTensor], ragged: impl Fn(&str) -> bool) -> u64 {
    let mut parts: Vec<(&str, DataType, &[i64])> = inputs
        .iter()
        .map(|i| {
            let dims = if ragged(&i.name) {
                &[]
            } else {
                i.tensor.shape.get(1..).unwrap_or(&[])
            };
            (i.name.as_str(), i.tensor.dtype, dims)
        })
        .collect();
    parts.sort_unstable_by(|a, b| a.0.cmp(b.0));
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for (name, dtype, dims) in parts {
        name.hash(&mut h);
        dtype.wire_name().hash(&mut h);
        dims.hash(&mut h);
    }
    h.finish()
}

/// Concatenates each input along the batch dimension, in request order.
pub fn merge(requests: &[&[NamedTensor]]) -> Result<Vec<NamedTensor>> {
    let Some(first) = requests.first() else {
        return Ok(Vec::new());
    };
    let mut merged = Vec::with_capacity(first.len());
    for input in first.iter() {
        let mut rows = 0i64;
        let mut data = BytesMut::new();
        for req in requests {
            let t = &req
                .iter()
                .find(|i| i.name == input.name)
                .ok_or_else(|| Error::internal(format!("batched requests disagree on input '{}'", input.name)))?
                .tensor;
            rows += t.shape.first().copied().unwrap_or(1);
            data.extend_from_slice(&t.data);
        }
        let mut shape = input.tensor.shape.clone();
        if let Some(b) = shape.first_mut() {
            *b = rows;
        }
        merged.push(NamedTensor {
            name: input.name.clone(),
            tensor: Tensor {
                dtype: input.tensor.dtype,
                shape,
                data: data.freeze(),
            },
        });
    }
    Ok(merged)
}

/// Splits each output's rows back to the requests, `rows[i]` rows for request i; slices share the output's bytes.
pub fn split(outputs: Vec<NamedTensor>, rows: &[usize]) -> Result<Vec<Vec<NamedTensor>>> {
    let total: usize = rows.iter().sum();
    let mut per_request: Vec<Vec<NamedTensor>> = rows.iter().map(|_| Vec::with_capacity(outputs.len())).collect();
    for out in outputs {
        let t = &out.tensor;
        if t.shape.first().copied() != Some(total as i64) {
            return Err(Error::internal(format!(
                "output '{}' has shape {:?}, which does not split into the batch of {total}",
                out.name, t.shape
            )));
        }
        let cuts = row_offsets(t, total)?;
        let mut row = 0;
        for (i, &n) in rows.iter().enumerate() {
            let mut shape = t.shape.clone();
            shape[0] = n as i64;
            let data: Bytes = t.data.slice(cuts[row]..cuts[row + n]);
            per_request[i].push(NamedTensor {
                name: out.name.clone(),
                tensor: Tensor {
                    dtype: t.dtype,
                    shape,
                    data,
                },
            });
            row += n;
        }
    }
    Ok(per_request)
}

/// Byte offset where each of `total` rows starts, plus the end.
fn row_offsets(t: &Tensor, total: usize) -> Result<Vec<usize>> {
    if total == 0 {
        return Ok(vec![0]);
    }
    let per_row_elems = t.element_count() / total;
    match t.dtype.element_size() {
        Some(size) => Ok((0..=total).map(|r| r * per_row_elems * size).collect()),
        None => {
            let mut offsets = vec![0];
            let mut pos = 0usize;
            let mut in_row = 0;
            let data = &t.data[..];
            while pos < data.len() {
                let len = u32::from_le_bytes(
                    data.get(pos..pos + 4)
                        .and_then(|b| b.try_into().ok())
                        .ok_or_else(|| Error::internal("truncated BYTES output"))?,
                ) as usize;
                pos += 4 + len;
                in_row += 1;
                if in_row == per_row_elems {
                    offsets.push(pos.min(data.len()));
                    in_row = 0;
                }
            }
            if per_row_elems == 0 {
                offsets.resize(total + 1, 0);
            }
            if offsets.len() != total + 1 {
                return Err(Error::internal("BYTES output does not split evenly into the batch"));
            }
            Ok(offsets)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nt(name: &str, t: Tensor) -> NamedTensor {
        NamedTensor {
            name: name.into(),
            tensor: t,
        }
    }

    #[test]
    fn merge_then_split_round_trips_fixed_and_bytes() {
        let a = vec![
            nt("x", Tensor::from_values(vec![1, 2], &[1i32, 2])),
            nt("s", Tensor::from_bytes_elements(vec![1, 1], [b"a"])),
        ];
        let b = vec![
            nt("x", Tensor::from_values(vec![2, 2], &[3i32, 4, 5, 6])),
            nt("s", Tensor::from_bytes_elements(vec![2, 1], [&b""[..], b"ccc"])),
        ];
        let merged = merge(&[&a, &b]).unwrap();
        assert_eq!(merged[0].tensor.shape, vec![3, 2]);
        assert_eq!(
            merged[0].tensor,
            Tensor::from_values(vec![3, 2], &[1i32, 2, 3, 4, 5, 6])
        );
        assert_eq!(merged[1].tensor.shape, vec![3, 1]);
        let parts = split(merged, &[1, 2]).unwrap();
        assert_eq!(parts[0], a);
        assert_eq!(parts[1], b);
    }

    #[test]
    fn shape_keys_ignore_batch_and_order_but_not_inner_dims() {
        let x = |b: i64, w: i64| nt("x", Tensor::from_values(vec![b, w], &vec![0f32; (b * w) as usize]));
        let y = nt("y", Tensor::from_values(vec![1], &[0u8]));
        let none = |_: &str| false;
        assert_eq!(
            shape_key(&[x(1, 3), y.clone()], none),
            shape_key(&[y.clone(), x(4, 3)], none)
        );
        assert_ne!(shape_key(&[x(1, 3)], none), shape_key(&[x(1, 4)], none));
        // Ragged inputs batch whatever their shape.
        assert_eq!(shape_key(&[x(1, 3)], |n| n == "x"), shape_key(&[x(1, 4)], |n| n == "x"));
    }

    #[test]
    fn split_rejects_outputs_without_the_batch() {
        let out = vec![nt("y", Tensor::from_values(vec![2], &[1f32, 2.0]))];
        assert!(split(out, &[1, 2]).unwrap_err().message.contains("does not split"));
    }
}
