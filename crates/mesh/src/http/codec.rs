//! KServe v2 HTTP infer bodies: JSON plus the binary tensor data extension, in both directions.

use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::json_bounded::ScalarParams;
use super::json_data;
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::request::{Client, InferRequest, InferResponse, Param, Params, RequestedOutput};
use crate::shm::{SharedMemory, ShmInUse, ShmRef};
use crate::tensor::{NamedTensor, Tensor};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRequest<'a> {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    parameters: Option<ScalarParams>,
    #[serde(borrow)]
    inputs: Vec<JsonInput<'a>>,
    #[serde(default)]
    outputs: Option<Vec<JsonOutput>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonInput<'a> {
    name: String,
    shape: Vec<i64>,
    datatype: String,
    #[serde(default)]
    parameters: Option<ScalarParams>,
    #[serde(default, borrow)]
    data: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonOutput {
    name: String,
    #[serde(default)]
    parameters: Option<ScalarParams>,
}

/// How the client wants each output returned: binary (true) or JSON data (false), or written to
/// a shared-memory region.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OutputFormat {
    pub default_binary: bool,
    pub per_output: Vec<(String, bool)>,
    /// The outputs written to shared memory and the input regions held until the answer is out.
    pub shm: ShmInUse,
}

impl OutputFormat {
    fn shm_target(&self, name: &str) -> Option<&ShmRef> {
        self.shm.target(name)
    }

    fn is_binary(&self, name: &str) -> bool {
        self.per_output
            .iter()
            .find(|(n, _)| n == name)
            .map_or(self.default_binary, |(_, b)| *b)
    }
}

/// The parameters of a request, input or output (read bounded, scalars only: see `json_bounded`).
fn params_from_json(map: Option<ScalarParams>) -> Result<Params> {
    Ok(map.map(|p| p.0).unwrap_or_default())
}

fn take_bool(params: &mut Params, key: &str) -> Result<Option<bool>> {
    match params.iter().position(|(k, _)| k == key) {
        None => Ok(None),
        Some(i) => match params.remove(i).1 {
            Param::Bool(b) => Ok(Some(b)),
            other => Err(Error::invalid(format!(
                "parameter '{key}' must be a boolean, got {other:?}"
            ))),
        },
    }
}

/// Decodes an infer body. `header_len` is the `Inference-Header-Content-Length` value, if any;
/// inputs that name a region of `shm` are read from it.
pub fn decode_request(
    model: &str,
    version: &str,
    body: Bytes,
    header_len: Option<usize>,
    shm: &SharedMemory,
) -> Result<(InferRequest, OutputFormat)> {
    let json_len = header_len.unwrap_or(body.len());
    if json_len > body.len() {
        return Err(Error::invalid(format!(
            "Inference-Header-Content-Length {json_len} is larger than the body ({} bytes)",
            body.len()
        )));
    }
    let json = std::str::from_utf8(&body[..json_len])
        .map_err(|e| Error::invalid(format!("request JSON is not valid UTF-8: {e}")))?;
    let parsed: JsonRequest =
        serde_json::from_str(json).map_err(|e| Error::invalid(format!("failed to parse the request JSON: {e}")))?;
    let mut binary = body.slice(json_len..);

    let mut parameters = params_from_json(parsed.parameters)?;
    let default_binary = take_bool(&mut parameters, "binary_data_output")?.unwrap_or(false);
    let mut inputs = Vec::with_capacity(parsed.inputs.len());
    let mut in_use = ShmInUse::new();
    for input in parsed.inputs {
        let name = input.name;
        let dtype = DataType::from_wire(&input.datatype).map_err(|e| Error::invalid(format!("input '{name}': {e}")))?;
        let mut params = params_from_json(input.parameters)?;
        let region = shm.take_ref("input", &name, &mut params)?;
        let bin_size = match params.iter().position(|(k, _)| k == "binary_data_size") {
            None => None,
            Some(i) => Some(params.remove(i).1.as_u64().ok_or_else(|| {
                Error::invalid(format!(
                    "input '{name}': binary_data_size must be a non-negative integer"
                ))
            })?),
        };
        let data = match (region, bin_size, input.data) {
            (Some(region), None, None) => {
                let data = region.read_input(model, &name, dtype, &input.shape)?;
                in_use.hold_input(region);
                data
            }
            (Some(_), _, _) => {
                return Err(Error::invalid(format!(
                    "input '{name}' has both a shared memory region and data in the body"
                )))
            }
            (None, Some(_), Some(_)) => {
                return Err(Error::invalid(format!(
                    "input '{name}' has both binary_data_size and JSON data"
                )))
            }
            (None, None, None) => return Err(Error::invalid(format!("input '{name}' has no data"))),
            (None, Some(n), None) => {
                let n = usize::try_from(n).ok().filter(|&n| n <= binary.len()).ok_or_else(|| {
                    Error::invalid(format!(
                        "input '{name}': binary_data_size {n} overruns the {} bytes of binary data left in the body",
                        binary.len()
                    ))
                })?;
                binary.split_to(n)
            }
            (None, None, Some(raw)) => {
                // What the shape holds: more values are refused while they are read.
                let holds = crate::tensor::element_count(&input.shape)
                    .map_err(|e| Error::invalid(format!("input '{name}': {}", e.message)))?;
                json_data::parse_data(&name, dtype, raw, holds)?.freeze()
            }
        };
        let tensor =
            Tensor::new(dtype, input.shape, data).map_err(|e| Error::invalid(format!("input '{name}': {e}")))?;
        inputs.push(NamedTensor { name, tensor });
    }
    if !binary.is_empty() {
        return Err(Error::invalid(format!(
            "{} bytes of binary data follow the inputs' binary_data_size values; the body must hold exactly what they declare",
            binary.len()
        )));
    }
    let mut format = OutputFormat {
        default_binary,
        per_output: Vec::new(),
        shm: in_use,
    };
    let mut outputs = Vec::new();
    for out in parsed.outputs.into_iter().flatten() {
        let mut params = params_from_json(out.parameters)?;
        let region = shm.take_ref("output", &out.name, &mut params)?;
        let binary = take_bool(&mut params, "binary_data")?;
        let class_count = RequestedOutput::class_count_in(&out.name, &params)?;
        if let Some(region) = region {
            // tritonclient sends binary_data false with a region; Triton refuses true.
            let clash = [
                (binary == Some(true), "binary_data"),
                (class_count.is_some(), "classification"),
            ];
            if let Some((_, what)) = clash.iter().find(|(c, _)| *c) {
                return Err(Error::invalid(format!(
                    "output '{}': Output can't set both 'shared_memory_region' and '{what}'",
                    out.name
                )));
            }
            format.shm.push_output(out.name.clone(), region);
        } else if let Some(b) = binary {
            format.per_output.push((out.name.clone(), b));
        }
        outputs.push(RequestedOutput {
            name: out.name,
            class_count,
        });
    }
    let request = InferRequest {
        model_name: model.to_string(),
        model_version: version.to_string(),
        id: parsed.id.unwrap_or_default(),
        inputs,
        outputs,
        parameters,
        // The frontend that read it says who sent it.
        client: Client::Local,
    };
    Ok((request, format))
}

#[derive(Serialize)]
struct JsonResponse<'a> {
    model_name: &'a str,
    model_version: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    id: &'a str,
    outputs: Vec<JsonOutputTensor<'a>>,
}

#[derive(Serialize)]
struct JsonOutputTensor<'a> {
    name: &'a str,
    datatype: &'static str,
    shape: &'a [i64],
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters: Option<BinaryParam>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<serde_json::Value>,
}

#[derive(Serialize)]
struct BinaryParam {
    binary_data_size: usize,
}

/// Encodes a response; returns the body and, when binary data follows the JSON, the JSON length.
pub fn encode_response(resp: &InferResponse, format: &OutputFormat) -> Result<(Bytes, Option<usize>)> {
    let mut outputs = Vec::with_capacity(resp.outputs.len());
    let mut binary_parts = Vec::new();
    for o in &resp.outputs {
        let t = &o.tensor;
        // An output written to shared memory is described by name, type and shape alone, as
        // Triton answers it.
        let (parameters, data) = if let Some(region) = format.shm_target(&o.name) {
            region.write(&o.name, &t.data)?;
            (None, None)
        } else if format.is_binary(&o.name) {
            binary_parts.push(&t.data);
            (
                Some(BinaryParam {
                    binary_data_size: t.data.len(),
                }),
                None,
            )
        } else {
            (None, Some(json_data::to_json_array(&o.name, t)?))
        };
        outputs.push(JsonOutputTensor {
            name: &o.name,
            datatype: t.dtype.wire_name(),
            shape: &t.shape,
            parameters,
            data,
        });
    }
    let header = JsonResponse {
        model_name: &resp.model_name,
        model_version: &resp.model_version,
        id: &resp.id,
        outputs,
    };
    let bin_len: usize = binary_parts.iter().map(|b| b.len()).sum();
    let mut buf = BytesMut::with_capacity(256 + bin_len);
    serde_json::to_writer((&mut buf).writer(), &header)
        .map_err(|e| Error::internal(format!("encoding response: {e}")))?;
    if binary_parts.is_empty() {
        return Ok((buf.freeze(), None));
    }
    let json_len = buf.len();
    for part in binary_parts {
        buf.put_slice(part);
    }
    Ok((buf.freeze(), Some(json_len)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_binary(json: &str, bin: &[u8]) -> (Bytes, Option<usize>) {
        let mut b = json.as_bytes().to_vec();
        b.extend_from_slice(bin);
        (Bytes::from(b), Some(json.len()))
    }

    #[test]
    fn decodes_json_inputs_and_output_prefs() {
        let body = r#"{"id":"r1","parameters":{"binary_data_output":true,"priority":2},
            "inputs":[{"name":"a","shape":[2],"datatype":"INT32","data":[1,2]}],
            "outputs":[{"name":"y","parameters":{"binary_data":false}},{"name":"z"}]}"#;
        let (r, f) = decode_request("m", "1", Bytes::from(body), None, &SharedMemory::default()).unwrap();
        assert_eq!(r.id, "r1");
        assert_eq!(r.model_version, "1");
        assert_eq!(r.inputs[0].tensor.data.as_ref(), &[1, 0, 0, 0, 2, 0, 0, 0]);
        assert_eq!(r.parameters, vec![("priority".to_string(), Param::Int(2))]);
        assert!(!f.is_binary("y"));
        assert!(f.is_binary("z"));
    }

    #[test]
    fn binary_inputs_are_slices_of_the_body() {
        let json = r#"{"inputs":[{"name":"a","shape":[1],"datatype":"FP32","parameters":{"binary_data_size":4}},
                       {"name":"b","shape":[2],"datatype":"BYTES","parameters":{"binary_data_size":9}}]}"#;
        let mut bin = 1.5f32.to_le_bytes().to_vec();
        bin.extend_from_slice(&[0, 0, 0, 0, 1, 0, 0, 0, 0xff]);
        let (body, hl) = with_binary(json, &bin);
        let base = body.as_ptr() as usize;
        let (r, _) = decode_request("m", "", body, hl, &SharedMemory::default()).unwrap();
        assert_eq!(r.inputs[0].tensor.data.as_ptr() as usize, base + json.len(), "no copy");
        let elems: Vec<&[u8]> = r.inputs[1].tensor.bytes_elements().collect();
        assert_eq!(elems, vec![&b""[..], &[0xff][..]]);
    }

    #[test]
    fn malformed_bodies_get_named_errors() {
        let cases: Vec<((Bytes, Option<usize>), &str)> = vec![
            ((Bytes::from("{not json"), None), "failed to parse the request JSON"),
            ((Bytes::from(r#"{"inputs":[]} "#), Some(100)), "larger than the body"),
            (
                (
                    Bytes::from(r#"{"inputs":[{"name":"a","shape":[1],"datatype":"FP99","data":[1]}]}"#),
                    None,
                ),
                "unknown datatype 'FP99'",
            ),
            (
                (
                    Bytes::from(r#"{"inputs":[{"name":"a","shape":[3],"datatype":"FP32","data":[1]}]}"#),
                    None,
                ),
                "needs 12 bytes, got 4",
            ),
            (
                (
                    Bytes::from(r#"{"inputs":[{"name":"a","shape":[-1],"datatype":"FP32","data":[1]}]}"#),
                    None,
                ),
                "negative",
            ),
            (
                (
                    Bytes::from(
                        r#"{"inputs":[{"name":"a","shape":[1099511627776,1099511627776],"datatype":"FP32","data":[1]}]}"#,
                    ),
                    None,
                ),
                "too large",
            ),
            (
                (
                    Bytes::from(r#"{"inputs":[{"name":"a","shape":[1],"datatype":"FP32"}]}"#),
                    None,
                ),
                "has no data",
            ),
            (
                with_binary(
                    r#"{"inputs":[{"name":"a","shape":[1],"datatype":"FP32","parameters":{"binary_data_size":400}}]}"#,
                    &[0; 4],
                ),
                "overruns",
            ),
            (
                with_binary(
                    r#"{"inputs":[{"name":"a","shape":[1],"datatype":"FP32","parameters":{"binary_data_size":-4}}]}"#,
                    &[0; 4],
                ),
                "non-negative integer",
            ),
            (
                (Bytes::from(r#"{"inputs":[],"bogus":1}"#), None),
                "unknown field `bogus`",
            ),
            ((Bytes::from(&[0xffu8, 0xfe][..]), None), "not valid UTF-8"),
            (
                with_binary(
                    r#"{"inputs":[{"name":"a","shape":[1],"datatype":"FP32","parameters":{"binary_data_size":4}}]}"#,
                    &[0; 6],
                ),
                "2 bytes of binary data follow",
            ),
        ];
        for ((body, hl), want) in cases {
            let e = decode_request("m", "", body, hl, &SharedMemory::default()).unwrap_err();
            assert!(e.message.contains(want), "want '{want}' in '{}'", e.message);
        }
    }

    #[test]
    fn encodes_binary_and_json_outputs() {
        let resp = InferResponse {
            model_name: "m".into(),
            model_version: "1".into(),
            id: "".into(),
            outputs: vec![
                NamedTensor {
                    name: "a".into(),
                    tensor: Tensor::from_values(vec![2], &[1i8, -1]),
                },
                NamedTensor {
                    name: "b".into(),
                    tensor: Tensor::from_values(vec![1], &[7u32]),
                },
            ],
            parameters: vec![],
        };
        let fmt = OutputFormat {
            default_binary: false,
            per_output: vec![("b".into(), true)],
            shm: ShmInUse::new(),
        };
        let (body, hl) = encode_response(&resp, &fmt).unwrap();
        let hl = hl.unwrap();
        let j: serde_json::Value = serde_json::from_slice(&body[..hl]).unwrap();
        assert_eq!(j["outputs"][0]["data"], serde_json::json!([1, -1]));
        assert_eq!(j["outputs"][1]["parameters"]["binary_data_size"], 4);
        assert!(j.get("id").is_none());
        assert_eq!(&body[hl..], &[7, 0, 0, 0]);
        let (all_json, none) = encode_response(&resp, &OutputFormat::default()).unwrap();
        assert!(none.is_none());
        assert!(serde_json::from_slice::<serde_json::Value>(&all_json).is_ok());
    }
}
