//! Raw binary infer requests: a body sent with `Inference-Header-Content-Length: 0` has no JSON
//! header at all and is the whole data of a one-input model's input, whose shape is deduced from
//! the model's config as Triton's binary data extension describes (at most one variable dimension,
//! sized from the byte count; a batch dimension of 1 for batching models; BYTES inputs of shape `[1]`
//! take the body as their one element).
use bytes::{BufMut, Bytes, BytesMut};

use crate::config::ModelConfig;
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::request::InferRequest;
use crate::tensor::{NamedTensor, Tensor};

/// Builds the request a raw body stands for, against the config of the model it is sent to.
/// Nothing is allocated from the deduced shape: fixed-size data stays a slice of the body, and its
/// byte count is checked against the shape before the tensor is made.
pub fn decode_raw(model: &str, version: &str, config: &ModelConfig, body: Bytes) -> Result<InferRequest> {
    let [spec] = config.input.as_slice() else {
        return Err(Error::invalid(format!(
            "Raw request must only have 1 input (found 1) to be deduced but got {} inputs in '{model}' model configuration",
            config.input.len()
        )));
    };
    let name = spec.name.as_str();
    let dtype = DataType::from_config(spec.data_type)
        .ok_or_else(|| Error::invalid(format!("input '{name}' of model '{model}' has no valid data type")))?;
    let batch: &[i64] = if config.max_batch_size > 0 { &[1] } else { &[] };
    let (dims, data) = if dtype == DataType::Bytes {
        if spec.dims != [1] {
            return Err(Error::invalid(format!(
                "For BYTE datatype raw input '{name}', the model must have input shape [1]"
            )));
        }
        let len = u32::try_from(body.len())
            .map_err(|_| Error::invalid(format!("raw input '{name}' is too large for one BYTES element")))?;
        let mut element = BytesMut::with_capacity(4 + body.len());
        element.put_u32_le(len);
        element.put_slice(&body);
        (vec![1], element.freeze())
    } else {
        (deduce_dims(model, name, dtype, &spec.dims, body.len())?, body)
    };
    let shape: Vec<i64> = batch.iter().chain(&dims).copied().collect();
    let tensor = Tensor::new(dtype, shape, data).map_err(|e| Error::invalid(format!("raw input '{name}': {e}")))?;
    Ok(InferRequest {
        model_name: model.to_string(),
        model_version: version.to_string(),
        inputs: vec![NamedTensor {
            name: name.to_string(),
            tensor,
        }],
        ..Default::default()
    })
}

/// The input's dims with its one variable dimension (if any) sized from `byte_len`, checked to
/// account for exactly `byte_len` bytes.
fn deduce_dims(model: &str, name: &str, dtype: DataType, spec: &[i64], byte_len: usize) -> Result<Vec<i64>> {
    let element = dtype.element_size().unwrap_or(1);
    let variable = spec.iter().filter(|&&d| d < 0).count();
    if variable > 1 {
        return Err(Error::invalid(format!(
            "The shape of the raw input '{name}' can not be deduced because there are more than one variable-sized dimension"
        )));
    }
    let too_large = || {
        Error::invalid(format!(
            "the shape of raw input '{name}' for model '{model}' is too large"
        ))
    };
    let fixed = spec
        .iter()
        .filter(|&&d| d >= 0)
        .try_fold(element as u64, |acc, &d| acc.checked_mul(d as u64))
        .ok_or_else(too_large)?;
    let dims: Vec<i64> = if variable == 1 {
        let size = (byte_len as u64).checked_div(fixed).unwrap_or(0);
        let size = i64::try_from(size).map_err(|_| too_large())?;
        spec.iter().map(|&d| if d < 0 { size } else { d }).collect()
    } else {
        spec.to_vec()
    };
    let expected = dims
        .iter()
        .try_fold(element as u64, |acc, &d| acc.checked_mul(d as u64))
        .ok_or_else(too_large)?;
    if expected != byte_len as u64 {
        return Err(Error::invalid(format!(
            "input byte size mismatch for input '{name}' for model '{model}'. Expected {expected}, got {byte_len}"
        )));
    }
    Ok(dims)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_pbtxt;

    fn cfg(text: &str) -> ModelConfig {
        parse_pbtxt(&format!(r#"name: "m" {text}"#)).unwrap()
    }

    fn f32s(n: usize) -> Bytes {
        Bytes::from(vec![0u8; 4 * n])
    }

    #[test]
    fn deduces_the_one_variable_dimension_and_the_batch() {
        let c = cfg(r#"input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2, -1 ] } ]"#);
        let r = decode_raw("m", "", &c, f32s(6)).unwrap();
        assert_eq!(r.inputs[0].tensor.shape, vec![2, 3]);
        assert_eq!(r.inputs[0].name, "IN");
        let r = decode_raw("m", "", &c, Bytes::new()).unwrap();
        assert_eq!(r.inputs[0].tensor.shape, vec![2, 0]);
        let c = cfg(r#"max_batch_size: 8 input [ { name: "IN" data_type: TYPE_INT32 dims: [ 3 ] } ]"#);
        assert_eq!(
            decode_raw("m", "1", &c, f32s(3)).unwrap().inputs[0].tensor.shape,
            vec![1, 3]
        );
    }

    #[test]
    fn bytes_inputs_take_the_body_as_their_one_element() {
        let c = cfg(r#"max_batch_size: 2 input [ { name: "S" data_type: TYPE_STRING dims: [ 1 ] } ]"#);
        let r = decode_raw("m", "", &c, Bytes::from_static(b"hi")).unwrap();
        assert_eq!(r.inputs[0].tensor.shape, vec![1, 1]);
        assert_eq!(r.inputs[0].tensor.data.as_ref(), b"\x02\0\0\0hi");
    }

    #[test]
    fn refuses_what_cannot_be_deduced_with_tritons_words() {
        let cases = [
            (
                r#"input [ { name: "A" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 1 ] } ]"#,
                f32s(1),
                "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'm' model configuration",
            ),
            (
                r#"input [ { name: "A" data_type: TYPE_FP32 dims: [ -1, -1 ] } ]"#,
                f32s(4),
                "The shape of the raw input 'A' can not be deduced because there are more than one variable-sized dimension",
            ),
            (
                r#"input [ { name: "A" data_type: TYPE_STRING dims: [ 2 ] } ]"#,
                f32s(1),
                "For BYTE datatype raw input 'A', the model must have input shape [1]",
            ),
            (
                r#"input [ { name: "A" data_type: TYPE_FP32 dims: [ 2, -1 ] } ]"#,
                f32s(5),
                "input byte size mismatch for input 'A' for model 'm'. Expected 16, got 20",
            ),
            (
                r#"max_batch_size: 4 input [ { name: "A" data_type: TYPE_INT32 dims: [ 3 ] } ]"#,
                f32s(6),
                "Expected 12, got 24",
            ),
            (
                r#"input [ { name: "A" data_type: TYPE_FP32 dims: [ 4611686018427387904, 4611686018427387904, -1 ] } ]"#,
                f32s(1),
                "too large",
            ),
        ];
        for (text, body, want) in cases {
            let e = decode_raw("m", "", &cfg(text), body).unwrap_err();
            assert!(e.message.contains(want), "want '{want}' in '{}'", e.message);
        }
    }

    #[test]
    fn a_zero_sized_fixed_dimension_does_not_divide_by_zero() {
        let c = cfg(r#"input [ { name: "A" data_type: TYPE_FP32 dims: [ 0, -1 ] } ]"#);
        assert_eq!(
            decode_raw("m", "", &c, Bytes::new()).unwrap().inputs[0].tensor.shape,
            vec![0, 0]
        );
        assert!(decode_raw("m", "", &c, f32s(1)).is_err());
    }
}
