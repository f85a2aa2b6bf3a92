//! Converts gRPC ModelInfer messages to and from the mesh's request and response types.
use std::collections::HashMap;

use bytes::{BufMut, Bytes, BytesMut};

use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::proto::{self, infer_parameter::ParameterChoice, model_infer_response::InferOutputTensor};
use crate::request::{Client, InferRequest, InferResponse, Param, Params, RequestedOutput};
use crate::shm::{SharedMemory, ShmInUse};
use crate::tensor::{NamedTensor, Tensor};

fn params_in(map: HashMap<String, proto::InferParameter>) -> Params {
    map.into_iter()
        .filter_map(|(k, v)| Some((k, param_in(v.parameter_choice?))))
        .collect()
}

/// One parameter's value as the server reads it.
pub fn param_in(choice: ParameterChoice) -> Param {
    match choice {
        ParameterChoice::BoolParam(b) => Param::Bool(b),
        ParameterChoice::Int64Param(i) => Param::Int(i),
        ParameterChoice::Uint64Param(u) => Param::Uint(u),
        ParameterChoice::DoubleParam(d) => Param::Double(d),
        ParameterChoice::StringParam(s) => Param::String(s),
    }
}

fn params_out(params: &Params) -> HashMap<String, proto::InferParameter> {
    params
        .iter()
        .map(|(k, p)| {
            let c = match p {
                Param::Bool(b) => ParameterChoice::BoolParam(*b),
                Param::Int(i) => ParameterChoice::Int64Param(*i),
                Param::Uint(u) => ParameterChoice::Uint64Param(*u),
                Param::Double(d) => ParameterChoice::DoubleParam(*d),
                Param::String(s) => ParameterChoice::StringParam(s.clone()),
            };
            (
                k.clone(),
                proto::InferParameter {
                    parameter_choice: Some(c),
                },
            )
        })
        .collect()
}

/// Builds an InferRequest; inputs come from a shared-memory region their parameters name, from
/// `raw_input_contents` by position (the inputs without a region, in order), or from typed
/// `contents`. Also answers the regions it uses (outputs to write, inputs held until the answer is out).
pub fn decode_request(msg: proto::ModelInferRequest, shm: &SharedMemory) -> Result<(InferRequest, ShmInUse)> {
    let raw = msg.raw_input_contents;
    let mut inputs = Vec::with_capacity(msg.inputs.len());
    let mut regions = Vec::with_capacity(msg.inputs.len());
    for input in &msg.inputs {
        let mut params = if input.parameters.is_empty() {
            Vec::new()
        } else {
            params_in(input.parameters.clone())
        };
        regions.push(shm.take_ref("input", &input.name, &mut params)?);
    }
    let carried = regions.iter().filter(|r| r.is_none()).count();
    if !raw.is_empty() && raw.len() != carried {
        return Err(Error::invalid(format!(
            "{} raw_input_contents were given for {carried} inputs not in shared memory; give one per such input or none",
            raw.len(),
        )));
    }
    let mut raw = raw.into_iter();
    let mut in_use = ShmInUse::new();
    for (input, region) in msg.inputs.into_iter().zip(regions) {
        let name = input.name;
        let dtype = DataType::from_wire(&input.datatype).map_err(|e| Error::invalid(format!("input '{name}': {e}")))?;
        let data = match (region, input.contents) {
            (Some(_), Some(_)) => {
                return Err(Error::invalid(format!(
                    "input '{name}' has both a shared memory region and typed contents"
                )))
            }
            (Some(region), None) => {
                let data = region.read_input(&msg.model_name, &name, dtype, &input.shape)?;
                in_use.hold_input(region);
                data
            }
            (None, contents) => match (raw.next(), contents) {
                (Some(_), Some(_)) => {
                    return Err(Error::invalid(format!(
                        "input '{name}' has both raw_input_contents and typed contents"
                    )))
                }
                (Some(bytes), None) => bytes,
                (None, Some(c)) => typed_contents(&name, dtype, c)?,
                (None, None) => return Err(Error::invalid(format!("input '{name}' has no data"))),
            },
        };
        let tensor =
            Tensor::new(dtype, input.shape, data).map_err(|e| Error::invalid(format!("input '{name}': {e}")))?;
        inputs.push(NamedTensor { name, tensor });
    }
    let mut outputs = Vec::with_capacity(msg.outputs.len());
    for o in msg.outputs {
        let mut params = params_in(o.parameters);
        let class_count = RequestedOutput::class_count_in(&o.name, &params)?;
        if let Some(region) = shm.take_ref("output", &o.name, &mut params)? {
            if class_count.is_some() {
                return Err(Error::invalid(format!(
                    "output '{}': Output can't set both 'shared_memory_region' and 'classification'",
                    o.name
                )));
            }
            in_use.push_output(o.name.clone(), region);
        }
        outputs.push(RequestedOutput {
            name: o.name,
            class_count,
        });
    }
    let request = InferRequest {
        model_name: msg.model_name,
        model_version: msg.model_version,
        id: msg.id,
        inputs,
        outputs,
        parameters: params_in(msg.parameters),
        // The frontend that read it says who sent it.
        client: Client::Local,
    };
    Ok((request, in_use))
}

/// Typed `contents` to wire bytes, with range checks for narrow integer types.
fn typed_contents(name: &str, dtype: DataType, c: proto::InferTensorContents) -> Result<Bytes> {
    let mut b = BytesMut::new();
    let narrow = |what: &str| Error::invalid(format!("input '{name}': a value in {what} is out of range for {dtype}"));
    let wrong = || {
        Error::invalid(format!(
            "input '{name}': {dtype} data must be sent in raw_input_contents or its own contents field"
        ))
    };
    match dtype {
        DataType::Bool => c.bool_contents.iter().for_each(|&v| b.put_u8(v as u8)),
        DataType::Int8 => {
            for v in c.int_contents {
                b.put_i8(i8::try_from(v).map_err(|_| narrow("int_contents"))?)
            }
        }
        DataType::Int16 => {
            for v in c.int_contents {
                b.put_i16_le(i16::try_from(v).map_err(|_| narrow("int_contents"))?)
            }
        }
        DataType::Int32 => c.int_contents.iter().for_each(|&v| b.put_i32_le(v)),
        DataType::Int64 => c.int64_contents.iter().for_each(|&v| b.put_i64_le(v)),
        DataType::Uint8 => {
            for v in c.uint_contents {
                b.put_u8(u8::try_from(v).map_err(|_| narrow("uint_contents"))?)
            }
        }
        DataType::Uint16 => {
            for v in c.uint_contents {
                b.put_u16_le(u16::try_from(v).map_err(|_| narrow("uint_contents"))?)
            }
        }
        DataType::Uint32 => c.uint_contents.iter().for_each(|&v| b.put_u32_le(v)),
        DataType::Uint64 => c.uint64_contents.iter().for_each(|&v| b.put_u64_le(v)),
        DataType::Fp32 => c.fp32_contents.iter().for_each(|&v| b.put_f32_le(v)),
        DataType::Fp64 => c.fp64_contents.iter().for_each(|&v| b.put_f64_le(v)),
        DataType::Bytes => {
            for e in &c.bytes_contents {
                b.put_u32_le(u32::try_from(e.len()).map_err(|_| narrow("bytes_contents"))?);
                b.put_slice(e);
            }
        }
        DataType::Fp16 | DataType::Bf16 => return Err(wrong()),
    }
    Ok(b.freeze())
}

/// The load options of a gRPC RepositoryModelLoad: `config` as a string, `file:<path>` as bytes.
pub fn load_options(params: HashMap<String, proto::ModelRepositoryParameter>) -> Result<crate::LoadOptions> {
    use proto::model_repository_parameter::ParameterChoice as P;
    let mut options = crate::LoadOptions::default();
    for (key, value) in params {
        match (key.as_str(), value.parameter_choice) {
            ("config", Some(P::StringParam(s))) => options.config = Some(s),
            (k, Some(P::BytesParam(b))) if k.starts_with("file:") => {
                options.files.push((k["file:".len()..].to_string(), Bytes::from(b)))
            }
            (k, _) => {
                return Err(Error::invalid(format!(
                    "unsupported load parameter '{k}' (or wrong type)"
                )))
            }
        }
    }
    Ok(options)
}

/// Builds the reply with every output in `raw_output_contents`, as tritonclient expects; an
/// output the request put in shared memory is written there and its entry left empty (Triton's
/// answer).
pub fn encode_response(resp: InferResponse, shm: &ShmInUse) -> Result<proto::ModelInferResponse> {
    let mut outputs = Vec::with_capacity(resp.outputs.len());
    let mut raw = Vec::with_capacity(resp.outputs.len());
    for o in resp.outputs {
        let data = match shm.target(&o.name) {
            Some(region) => {
                region.write(&o.name, &o.tensor.data)?;
                Bytes::new()
            }
            None => o.tensor.data,
        };
        outputs.push(InferOutputTensor {
            name: o.name,
            datatype: o.tensor.dtype.wire_name().to_string(),
            shape: o.tensor.shape,
            parameters: HashMap::new(),
            contents: None,
        });
        raw.push(data);
    }
    Ok(proto::ModelInferResponse {
        model_name: resp.model_name,
        model_version: resp.model_version,
        id: resp.id,
        parameters: params_out(&resp.parameters),
        outputs,
        raw_output_contents: raw,
    })
}

/// The stream's (or call's) ASCII metadata whose key matches, as request parameters.
pub(crate) fn forward_metadata(
    pattern: &regex::Regex,
    metadata: &tonic::metadata::MetadataMap,
    params: &mut crate::Params,
) {
    let pairs = metadata.iter().filter_map(|kv| match kv {
        tonic::metadata::KeyAndValueRef::Ascii(k, v) => Some((k.as_str(), v.as_bytes())),
        tonic::metadata::KeyAndValueRef::Binary(..) => None,
    });
    crate::http::forward_headers(pattern, pairs, params);
}

/// The client's W3C trace context in a call's (or stream's) metadata, if it sent a `traceparent`.
pub(crate) fn trace_carrier(metadata: &tonic::metadata::MetadataMap) -> Option<crate::trace::otel::context::Carrier> {
    crate::trace::otel::context::Carrier::from_lookup(|k| metadata.get(k).map(|v| v.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::model_infer_request::InferInputTensor;

    fn input(name: &str, dt: &str, shape: Vec<i64>, contents: Option<proto::InferTensorContents>) -> InferInputTensor {
        InferInputTensor {
            name: name.into(),
            datatype: dt.into(),
            shape,
            parameters: HashMap::new(),
            contents,
        }
    }

    #[test]
    fn raw_inputs_by_position() {
        let msg = proto::ModelInferRequest {
            model_name: "m".into(),
            inputs: vec![input("a", "INT8", vec![2], None), input("b", "BYTES", vec![1], None)],
            raw_input_contents: vec![Bytes::from_static(&[1, 2]), Bytes::from_static(&[1, 0, 0, 0, 0])],
            ..Default::default()
        };
        let r = decode_request(msg, &SharedMemory::default()).unwrap().0;
        assert_eq!(r.inputs[0].tensor.data.as_ref(), &[1, 2]);
        assert_eq!(
            r.inputs[1].tensor.bytes_elements().collect::<Vec<_>>(),
            vec![&[0u8][..]]
        );
    }

    #[test]
    fn typed_contents_and_their_errors() {
        let c = proto::InferTensorContents {
            int_contents: vec![1, -2],
            ..Default::default()
        };
        let msg = proto::ModelInferRequest {
            inputs: vec![input("a", "INT16", vec![2], Some(c))],
            ..Default::default()
        };
        assert_eq!(
            decode_request(msg, &SharedMemory::default()).unwrap().0.inputs[0]
                .tensor
                .data
                .as_ref(),
            &[1, 0, 0xfe, 0xff]
        );

        let c = proto::InferTensorContents {
            int_contents: vec![300],
            ..Default::default()
        };
        let msg = proto::ModelInferRequest {
            inputs: vec![input("a", "INT8", vec![1], Some(c))],
            ..Default::default()
        };
        assert!(decode_request(msg, &SharedMemory::default())
            .unwrap_err()
            .message
            .contains("out of range for INT8"));

        let c = proto::InferTensorContents {
            fp32_contents: vec![1.0],
            ..Default::default()
        };
        let msg = proto::ModelInferRequest {
            inputs: vec![input("a", "FP32", vec![2], Some(c))],
            ..Default::default()
        };
        assert!(decode_request(msg, &SharedMemory::default())
            .unwrap_err()
            .message
            .contains("needs 8 bytes, got 4"));

        let msg = proto::ModelInferRequest {
            inputs: vec![input("a", "FP32", vec![1], None), input("b", "FP32", vec![1], None)],
            raw_input_contents: vec![Bytes::from_static(&[0; 4])],
            ..Default::default()
        };
        assert!(decode_request(msg, &SharedMemory::default())
            .unwrap_err()
            .message
            .contains("1 raw_input_contents were given for 2 inputs"));

        let msg = proto::ModelInferRequest {
            inputs: vec![input("a", "FP16", vec![1], Some(Default::default()))],
            ..Default::default()
        };
        assert!(decode_request(msg, &SharedMemory::default())
            .unwrap_err()
            .message
            .contains("raw_input_contents"));
    }

    #[test]
    fn response_is_raw() {
        let resp = InferResponse {
            model_name: "m".into(),
            model_version: "1".into(),
            outputs: vec![NamedTensor {
                name: "y".into(),
                tensor: Tensor::from_values(vec![1], &[3u16]),
            }],
            ..Default::default()
        };
        let m = encode_response(resp, &ShmInUse::new()).unwrap();
        assert_eq!(m.outputs[0].datatype, "UINT16");
        assert_eq!(m.raw_output_contents[0].as_ref(), &[3, 0]);
    }

    #[test]
    fn input_regions_stay_in_use_until_the_answer_is_out() {
        let key = format!("/mesh_codec_{}", std::process::id());
        std::fs::write(format!("/dev/shm{key}"), [5u8; 4]).unwrap();
        let shm = SharedMemory::default();
        shm.register_system("in", &key, 0, 4).unwrap();
        let mut a = input("a", "INT8", vec![4], None);
        let param = |c| proto::InferParameter {
            parameter_choice: Some(c),
        };
        a.parameters.insert(
            "shared_memory_region".into(),
            param(ParameterChoice::StringParam("in".into())),
        );
        a.parameters
            .insert("shared_memory_byte_size".into(), param(ParameterChoice::Int64Param(4)));
        let msg = proto::ModelInferRequest {
            model_name: "m".into(),
            inputs: vec![a],
            ..Default::default()
        };
        let (r, in_use) = decode_request(msg, &shm).unwrap();
        assert_eq!(r.inputs[0].tensor.data.as_ref(), &[5; 4]);
        let e = shm.unregister_system("").unwrap_err();
        assert_eq!(
            e.message,
            "Failed to unregister the following system shared memory regions: in"
        );
        drop(in_use);
        shm.unregister_system("in").unwrap();
        std::fs::remove_file(format!("/dev/shm{key}")).unwrap();
    }
}
