//! Triton's classification extension: an output asked for with `classification` (a class count)
//! comes back as its top classes, highest value first, as BYTES `"value:index"` or
//! `"value:index:label"` strings (labels from the output's `label_filename`).
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use crate::config::ModelConfig;
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::request::{InferResponse, RequestedOutput};
use crate::tensor::Tensor;

/// Refuses, before anything runs, a class count on an output that cannot be classified.
pub fn check(config: &ModelConfig, wanted: &[RequestedOutput], decoupled: bool) -> Result<()> {
    for w in wanted.iter().filter(|w| w.class_count.is_some()) {
        if decoupled {
            return Err(Error::invalid(format!(
                "output '{}': classification is not available for decoupled model '{}'",
                w.name, config.name
            )));
        }
        let declared = config.output.iter().find(|o| o.name == w.name);
        if declared.is_some_and(|o| o.data_type == crate::proto::DataType::TypeString as i32) {
            return Err(Error::invalid(format!(
                "output '{}': classification needs a numeric output, not BYTES",
                w.name
            )));
        }
    }
    Ok(())
}

/// Replaces each output asked for with a class count by its top classes.
pub fn apply(
    response: &mut InferResponse,
    wanted: &[(String, u32)],
    config: &ModelConfig,
    labels: &Labels,
) -> Result<()> {
    for (name, count) in wanted {
        if let Some(out) = response.outputs.iter_mut().find(|o| o.name == *name) {
            out.tensor = classify(name, &out.tensor, *count, config.max_batch_size > 0, labels.of(name))?;
        }
    }
    Ok(())
}

/// The outputs a request asks to classify, with their class counts (empty, and allocating
/// nothing, for the usual request that asks for none).
pub fn wanted(outputs: &[RequestedOutput]) -> Vec<(String, u32)> {
    outputs
        .iter()
        .filter_map(|o| Some((o.name.clone(), o.class_count?)))
        .collect()
}

/// The labels of a model's outputs, read from their `label_filename`s (one label per line).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Labels {
    by_output: HashMap<String, Arc<Vec<String>>>,
}

impl Labels {
    /// Reads every output's label file from the model directory; a missing or unreadable file is
    /// an error that names it (the model does not load, as in Triton).
    pub fn load(model_dir: &Path, config: &ModelConfig) -> Result<Labels> {
        let mut by_output = HashMap::new();
        for output in config.output.iter().filter(|o| !o.label_filename.is_empty()) {
            let file = Path::new(&output.label_filename);
            crate::repository::check_file_in_model(
                &format!("output '{}': label_filename", output.name),
                &output.label_filename,
            )?;
            let text = std::fs::read_to_string(model_dir.join(file)).map_err(|e| {
                Error::invalid(format!(
                    "output '{}': cannot read label_filename '{}': {e}",
                    output.name, output.label_filename
                ))
            })?;
            let labels = text.lines().map(|l| l.trim_end_matches('\r').to_string()).collect();
            by_output.insert(output.name.clone(), Arc::new(labels));
        }
        Ok(Labels { by_output })
    }

    pub fn of(&self, output: &str) -> Option<&[String]> {
        self.by_output.get(output).map(|l| l.as_slice())
    }

    /// Gives `output` the labels `from` has for `theirs` (an ensemble's output takes those of the
    /// step output that makes it, as Triton's classification does), unless it has its own.
    pub fn adopt(&mut self, output: &str, from: &Labels, theirs: &str) {
        if let Some(labels) = from.by_output.get(theirs) {
            self.by_output
                .entry(output.to_string())
                .or_insert_with(|| labels.clone());
        }
    }
}

/// The top `count` classes of `t` (per batch row when `batched`), as Triton returns them.
pub fn classify(name: &str, t: &Tensor, count: u32, batched: bool, labels: Option<&[String]>) -> Result<Tensor> {
    let values = numbers(name, t)?;
    let rows = match (batched, t.shape.first()) {
        (true, Some(&n)) if n > 0 => n as usize,
        (true, _) => 0,
        (false, _) => 1,
    };
    let per_row = values.len().checked_div(rows).unwrap_or(0);
    let k = (count as usize).min(per_row);
    let mut out = Vec::with_capacity(rows * k);
    for row in values.chunks(per_row.max(1)).take(rows) {
        let mut order: Vec<usize> = (0..row.len()).collect();
        order.sort_by(|&a, &b| row[b].0.total_cmp(&row[a].0).then(a.cmp(&b)));
        for &i in order.iter().take(k) {
            let text = &row[i].1;
            out.push(match labels.and_then(|l| l.get(i)).filter(|l| !l.is_empty()) {
                Some(label) => format!("{text}:{i}:{label}"),
                None => format!("{text}:{i}"),
            });
        }
    }
    let shape = if batched {
        vec![rows as i64, k as i64]
    } else {
        vec![k as i64]
    };
    Ok(Tensor::from_bytes_elements(shape, out))
}

/// Every element as (value for ordering, value as Triton prints it).
fn numbers(name: &str, t: &Tensor) -> Result<Vec<(f64, String)>> {
    let d = &t.data;
    macro_rules! read {
        ($ty:ty, $n:expr, $conv:expr) => {
            d.chunks_exact($n)
                .map(|c| {
                    let v = <$ty>::from_le_bytes(c.try_into().expect("chunk size"));
                    $conv(v)
                })
                .collect()
        };
    }
    let int = |v: i128| (v as f64, v.to_string());
    let float = |v: f64| (v, format!("{v:.6}"));
    Ok(match t.dtype {
        DataType::Bool => d.iter().map(|&b| int(i128::from(b != 0))).collect(),
        DataType::Uint8 => d.iter().map(|&b| int(i128::from(b))).collect(),
        DataType::Int8 => d.iter().map(|&b| int(i128::from(b as i8))).collect(),
        DataType::Uint16 => read!(u16, 2, |v| int(i128::from(v))),
        DataType::Int16 => read!(i16, 2, |v| int(i128::from(v))),
        DataType::Uint32 => read!(u32, 4, |v| int(i128::from(v))),
        DataType::Int32 => read!(i32, 4, |v| int(i128::from(v))),
        DataType::Uint64 => read!(u64, 8, |v| int(i128::from(v))),
        DataType::Int64 => read!(i64, 8, |v| int(i128::from(v))),
        DataType::Fp16 => read!(half::f16, 2, |v: half::f16| float(f64::from(v))),
        DataType::Bf16 => read!(half::bf16, 2, |v: half::bf16| float(f64::from(v))),
        DataType::Fp32 => read!(f32, 4, |v| float(f64::from(v))),
        DataType::Fp64 => read!(f64, 8, float),
        DataType::Bytes => {
            return Err(Error::invalid(format!(
                "output '{name}': classification needs a numeric output, not BYTES"
            )))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(t: &Tensor) -> Vec<String> {
        t.bytes_elements()
            .map(|b| String::from_utf8(b.to_vec()).unwrap())
            .collect()
    }

    #[test]
    fn top_classes_highest_first_with_labels_where_there_are_some() {
        let t = Tensor::from_values(vec![4], &[0.1f32, 2.5, -1.0, 2.5]);
        let labels = ["zero".to_string(), "one".into()];
        let c = classify("y", &t, 3, false, Some(&labels)).unwrap();
        assert_eq!((c.dtype, c.shape.clone()), (DataType::Bytes, vec![3]));
        // Ties keep the lower index first; a class without a label line has none.
        assert_eq!(strings(&c), ["2.500000:1:one", "2.500000:3", "0.100000:0:zero"]);
    }

    #[test]
    fn only_outputs_with_a_class_count_are_classified() {
        let outputs = [
            RequestedOutput::named("plain"),
            RequestedOutput {
                name: "top".into(),
                class_count: Some(2),
            },
        ];
        assert_eq!(wanted(&outputs), [("top".to_string(), 2)]);
        assert!(wanted(&outputs[..1]).is_empty());
    }

    #[test]
    fn batched_rows_are_classified_each_and_a_large_count_returns_every_class() {
        let t = Tensor::from_values(vec![2, 3], &[1i32, 9, 5, 7, 3, 8]);
        let c = classify("y", &t, 100, true, None).unwrap();
        assert_eq!(c.shape, vec![2, 3]);
        assert_eq!(strings(&c), ["9:1", "5:2", "1:0", "8:2", "7:0", "3:1"]);
        let one = classify("y", &t, 1, true, None).unwrap();
        assert_eq!(
            (one.shape.clone(), strings(&one)),
            (vec![2, 1], vec!["9:1".to_string(), "8:2".into()])
        );
    }

    #[test]
    fn every_numeric_type_is_classified_and_bytes_are_refused() {
        let u8s = Tensor::from_values(vec![3], &[3u8, 200, 7]);
        assert_eq!(strings(&classify("y", &u8s, 1, false, None).unwrap()), ["200:1"]);
        let f16 = Tensor::from_values(vec![2], &[half::f16::from_f32(0.5), half::f16::from_f32(-2.0)]);
        assert_eq!(
            strings(&classify("y", &f16, 2, false, None).unwrap()),
            ["0.500000:0", "-2.000000:1"]
        );
        let i64s = Tensor::from_values(vec![2], &[-5i64, i64::MAX]);
        assert_eq!(
            strings(&classify("y", &i64s, 1, false, None).unwrap())[0],
            format!("{}:1", i64::MAX)
        );
        let text = Tensor::from_bytes_elements(vec![1], ["a"]);
        let e = classify("y", &text, 1, false, None).unwrap_err();
        assert!(e.message.contains("numeric"), "{}", e.message);
    }

    #[test]
    fn labels_come_from_the_model_directory_and_must_stay_inside_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("labels.txt"), "cat\r\ndog\n").unwrap();
        let mut config = ModelConfig::default();
        config.output.push(crate::proto::ModelOutput {
            name: "y".into(),
            label_filename: "labels.txt".into(),
            ..Default::default()
        });
        let labels = Labels::load(dir.path(), &config).unwrap();
        assert_eq!(labels.of("y").unwrap(), ["cat", "dog"]);
        assert!(labels.of("z").is_none());
        config.output[0].label_filename = "../etc/passwd".into();
        assert!(Labels::load(dir.path(), &config)
            .unwrap_err()
            .message
            .contains("inside"));
        config.output[0].label_filename = "missing.txt".into();
        assert!(Labels::load(dir.path(), &config)
            .unwrap_err()
            .message
            .contains("missing.txt"));
    }
}
