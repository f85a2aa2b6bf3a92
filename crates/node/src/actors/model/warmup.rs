//! Triton's `model_warmup`: sample requests built from the config, run on every instance before the model is ready.
use std::path::Path;

use bytes::Bytes;
use mesh::config::ModelConfig;
use mesh::proto::model_warmup::input::InputDataType;
use mesh::proto::ModelWarmup;
use mesh::{DataType, NamedTensor, Tensor};

use crate::actors::instance::{InstanceHandle, Submission};

/// Warmup data larger than this is refused, so a config typo cannot allocate gigabytes.
const MAX_WARMUP_BYTES: usize = 256 * 1024 * 1024;

/// A tiny deterministic generator for `random_data` (reproducible warmups).
fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Builds the inputs of one warmup sample; files come from `<model dir>/warmup/`.
pub fn warmup_inputs(config: &ModelConfig, sample: &ModelWarmup, model_dir: &Path) -> Result<Vec<NamedTensor>, String> {
    let name = &sample.name;
    let batched = config.max_batch_size > 0;
    if batched && sample.batch_size as i32 > config.max_batch_size {
        return Err(format!(
            "warmup '{name}' has batch_size {} > max_batch_size {}",
            sample.batch_size, config.max_batch_size
        ));
    }
    let mut inputs = Vec::with_capacity(sample.inputs.len());
    for (input, spec) in &sample.inputs {
        let dtype = DataType::from_config(spec.data_type)
            .ok_or_else(|| format!("warmup '{name}' input '{input}' has no valid data_type"))?;
        let mut shape = Vec::with_capacity(spec.dims.len() + 1);
        if batched {
            shape.push(i64::from(sample.batch_size.max(1)));
        }
        shape.extend_from_slice(&spec.dims);
        let count = mesh::tensor::element_count(&shape).map_err(|e| format!("warmup '{name}' input '{input}': {e}"))?;
        let fixed =
            mesh::tensor::byte_size(dtype, &shape).map_err(|e| format!("warmup '{name}' input '{input}': {e}"))?;
        if fixed.unwrap_or(count.saturating_mul(4)) > MAX_WARMUP_BYTES {
            return Err(format!(
                "warmup '{name}' input '{input}' would need more than {MAX_WARMUP_BYTES} bytes"
            ));
        }
        let data = match (&spec.input_data_type, fixed) {
            (Some(InputDataType::InputDataFile(file)), _) => {
                let path = model_dir.join("warmup").join(file);
                let bytes = std::fs::read(&path)
                    .map_err(|e| format!("warmup '{name}': cannot read {}: {e}", path.display()))?;
                Bytes::from(bytes)
            }
            (Some(InputDataType::RandomData(true)), Some(n)) => {
                let mut b = random_bytes(n, 0x5eed ^ n as u64);
                if dtype == DataType::Bool {
                    b.iter_mut().for_each(|v| *v &= 1);
                }
                Bytes::from(b)
            }
            (_, Some(n)) => Bytes::from(vec![0u8; n]),
            // BYTES: zero and random data are empty strings, as Triton does for variable-size types.
            (_, None) => mesh::tensor::encode_bytes_elements(std::iter::repeat_n(b"", count)),
        };
        let tensor = Tensor::new(dtype, shape, data).map_err(|e| format!("warmup '{name}' input '{input}': {e}"))?;
        inputs.push(NamedTensor {
            name: input.clone(),
            tensor,
        });
    }
    Ok(inputs)
}

/// Runs every warmup sample `count` times (at least once) on every instance.
pub async fn run(
    config: &ModelConfig,
    model_dir: &Path,
    instances: &[std::sync::Arc<InstanceHandle>],
) -> Result<(), String> {
    for sample in &config.model_warmup {
        let inputs = warmup_inputs(config, sample, model_dir)?;
        let rows = if config.max_batch_size > 0 {
            sample.batch_size.max(1) as usize
        } else {
            1
        };
        for instance in instances {
            for _ in 0..sample.count.max(1) {
                let sub = Submission {
                    inputs: inputs.clone(),
                    outputs: Vec::new(),
                    rows,
                    priority: 0,
                    timeout: None,
                    id: format!("warmup:{}", sample.name),
                    parameters: Vec::new(),
                    trace: None,
                    sink: None,
                };
                instance
                    .execute(sub)
                    .await
                    .map_err(|e| format!("warmup '{}' failed on instance {}: {e}", sample.name, instance.label))?;
            }
        }
        tracing::info!(model = %config.name, warmup = %sample.name, "warmup done");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesh::config::parse_pbtxt;

    fn cfg(warmup: &str) -> ModelConfig {
        parse_pbtxt(&format!(
            r#"name: "m" max_batch_size: 4
            input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 3 ] }}, {{ name: "s" data_type: TYPE_STRING dims: [ 2 ] }} ]
            {warmup}"#
        ))
        .unwrap()
    }

    #[test]
    fn zero_and_random_samples_have_the_config_shapes() {
        let c = cfg(
            r#"model_warmup [ { name: "w" batch_size: 2 inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ 3 ] random_data: true } }
                                       inputs { key: "s" value: { data_type: TYPE_STRING dims: [ 2 ] zero_data: true } } } ]"#,
        );
        let mut ins = warmup_inputs(&c, &c.model_warmup[0], Path::new("/nonexistent")).unwrap();
        ins.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(ins[0].name, "s");
        assert_eq!(ins[0].tensor.shape, vec![2, 2]);
        assert_eq!(ins[0].tensor.bytes_elements().count(), 4);
        assert_eq!(ins[1].tensor.shape, vec![2, 3]);
        assert_eq!(ins[1].tensor.data.len(), 24);
        assert!(
            ins[1].tensor.data.iter().any(|&b| b != 0),
            "random data is not all zero"
        );
    }

    #[test]
    fn bad_samples_are_named() {
        let c = cfg(
            r#"model_warmup [ { name: "big" batch_size: 9 inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ 3 ] zero_data: true } } } ]"#,
        );
        assert!(warmup_inputs(&c, &c.model_warmup[0], Path::new("/x"))
            .unwrap_err()
            .contains("'big' has batch_size 9"));
        let c = cfg(
            r#"model_warmup [ { name: "huge" batch_size: 1 inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ 100000, 100000 ] zero_data: true } } } ]"#,
        );
        assert!(warmup_inputs(&c, &c.model_warmup[0], Path::new("/x"))
            .unwrap_err()
            .contains("more than"));
        let c = cfg(
            r#"model_warmup [ { name: "f" batch_size: 1 inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ 3 ] input_data_file: "nope.bin" } } } ]"#,
        );
        assert!(warmup_inputs(&c, &c.model_warmup[0], Path::new("/x"))
            .unwrap_err()
            .contains("cannot read"));
    }
}
