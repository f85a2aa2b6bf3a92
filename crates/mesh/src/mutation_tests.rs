//! Deterministic mutation tests: thousands of corrupted configs and request bodies must give errors, never panics.
//! (A stand-in for `cargo fuzz`, which needs a nightly toolchain this project does not assume.)
use bytes::Bytes;

use crate::config::parse_pbtxt;
use crate::http::codec::decode_request;

/// xorshift64*: a tiny deterministic generator, so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const SPICE: &[u8] = b"{}[]:,\"'#\n\\ -0123456789eE.abc_xTYPE_FP32\xff\x00";

/// One random edit: delete a range, insert structural bytes, duplicate a slice, or truncate.
fn mutate(rng: &mut Rng, input: &[u8]) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(v.len() + 1);
        match rng.below(4) {
            0 => {
                let end = (at + rng.below(8)).min(v.len());
                v.drain(at..end);
            }
            1 => {
                for _ in 0..1 + rng.below(3) {
                    v.insert(at.min(v.len()), SPICE[rng.below(SPICE.len())]);
                }
            }
            2 => {
                let end = (at + rng.below(16)).min(v.len());
                let copy = v[at..end].to_vec();
                let to = rng.below(v.len() + 1);
                v.splice(to..to, copy);
            }
            _ => v.truncate(at),
        }
    }
    v
}

const CONFIG: &str = r#"name: "m" platform: "onnxruntime_onnx" max_batch_size: 8
version_policy: { latest { num_versions: 2 } }
input [ { name: "a" data_type: TYPE_FP32 dims: [ -1, 4 ] reshape { shape: [ 2, 2 ] } } ]
output [ { name: "b" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
dynamic_batching { preferred_batch_size: [ 4 ] priority_queue_policy { key: 1 value: { max_queue_size: 3 } } }
parameters { key: "k" value: { string_value: "v # [x]" } }  # comment
"#;

#[test]
fn mutated_configs_never_panic() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..3000 {
        let bytes = mutate(&mut rng, CONFIG.as_bytes());
        let text = String::from_utf8_lossy(&bytes);
        if let Ok(c) = parse_pbtxt(&text) {
            let _ = crate::config::validate_config(&c);
            let _ = crate::config::config_to_json(&c);
        }
    }
}

#[test]
fn mutated_infer_bodies_never_panic() {
    let json = br#"{"id":"x","parameters":{"binary_data_output":true},"inputs":[{"name":"a","shape":[1,4],"datatype":"FP32","parameters":{"binary_data_size":16}},{"name":"s","shape":[2],"datatype":"BYTES","data":["a","\u0000"]},{"name":"n","shape":[[1]],"datatype":"INT8","data":[[1,-2]]}],"outputs":[{"name":"b","parameters":{"binary_data":false}}]}"#;
    let mut body = json.to_vec();
    body.extend_from_slice(&[0u8; 16]);
    let mut rng = Rng(0xdead_beef_cafe_f00d);
    for i in 0..5000 {
        let mutated = mutate(&mut rng, &body);
        let header_len = match i % 3 {
            0 => None,
            1 => Some(json.len()),
            _ => Some(rng.below(mutated.len() + 8)),
        };
        let _ = decode_request("m", "", Bytes::from(mutated), header_len, &Default::default());
    }
}

#[test]
fn random_grpc_requests_never_panic() {
    use crate::proto::{model_infer_request::InferInputTensor, InferTensorContents, ModelInferRequest};
    let mut rng = Rng(42);
    let types = ["FP32", "BYTES", "INT8", "BOOL", "BF16", "UINT64", "nope"];
    for _ in 0..5000 {
        let inputs = (0..rng.below(3))
            .map(|i| InferInputTensor {
                name: format!("i{i}"),
                datatype: types[rng.below(types.len())].into(),
                shape: (0..rng.below(4)).map(|_| rng.next() as i64 >> rng.below(64)).collect(),
                contents: (rng.below(2) == 0).then(|| InferTensorContents {
                    int_contents: vec![rng.next() as i32; rng.below(4)],
                    bytes_contents: vec![vec![7u8; rng.below(5)]; rng.below(3)],
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect();
        let raw = (0..rng.below(3))
            .map(|_| Bytes::from(vec![0xffu8; rng.below(20)]))
            .collect();
        let msg = ModelInferRequest {
            inputs,
            raw_input_contents: raw,
            ..Default::default()
        };
        let _ = crate::grpc::codec::decode_request(msg, &Default::default());
    }
}
