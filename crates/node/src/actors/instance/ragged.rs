//! Ragged batching, as Triton's model configuration documents it, without IO: inputs with
//! `allow_ragged_batch` batch whatever their shapes and reach the model as one flat tensor of every
//! request's elements; `batch_input`s describe the batch (element counts, their running sums, the
//! largest count as a shape, each item's shape); `batch_output`s of kind
//! `BATCH_SCATTER_WITH_INPUT_SHAPE` go back to each request in the shape of its source input.
use std::sync::Arc;

use bytes::BytesMut;
use mesh::config::ModelConfig;
use mesh::proto::batch_input::Kind;
use mesh::{DataType, Error, NamedTensor, Result, Tensor};

use crate::actors::instance::batch_io;

/// One `batch_input`: a tensor the node makes for the model from one source input of the batch.
#[derive(Debug, Clone)]
struct BatchInput {
    kind: Kind,
    targets: Vec<String>,
    dtype: DataType,
    source: String,
}

/// A model's ragged inputs, batch inputs and scattered outputs.
#[derive(Debug, Clone)]
pub struct Ragged {
    ragged: Vec<String>,
    batch_inputs: Vec<BatchInput>,
    /// (output, source input) of each `BATCH_SCATTER_WITH_INPUT_SHAPE` target.
    scatter: Vec<(String, String)>,
    batched: bool,
}

impl Ragged {
    /// None when the config asks for none of it; a config that names an unknown input or output,
    /// or a batch input type other than INT32 or FP32, is a load error naming it.
    pub fn from_config(config: &ModelConfig) -> std::result::Result<Option<Arc<Self>>, String> {
        let ragged: Vec<String> = config
            .input
            .iter()
            .filter(|i| i.allow_ragged_batch)
            .map(|i| i.name.clone())
            .collect();
        if ragged.is_empty() && config.batch_input.is_empty() && config.batch_output.is_empty() {
            return Ok(None);
        }
        let is_input = |n: &str| config.input.iter().any(|i| i.name == n);
        let mut batch_inputs = Vec::new();
        for b in &config.batch_input {
            let kind = Kind::try_from(b.kind).map_err(|_| format!("batch_input has an unknown kind {}", b.kind))?;
            let [source] = &b.source_input[..] else {
                return Err(format!(
                    "batch_input {:?} must name exactly one source_input, not {:?}",
                    b.target_name, b.source_input
                ));
            };
            if !is_input(source) {
                return Err(format!(
                    "batch_input's source_input '{source}' is not an input of the model"
                ));
            }
            if b.target_name.is_empty() {
                return Err("batch_input needs a target_name".into());
            }
            if let Some(t) = b.target_name.iter().find(|t| is_input(t)) {
                return Err(format!(
                    "batch_input target '{t}' is also a config input; the node makes it, clients do not send it"
                ));
            }
            let dtype = match DataType::from_config(b.data_type) {
                Some(d @ (DataType::Int32 | DataType::Fp32)) => d,
                _ => {
                    return Err(format!(
                        "batch_input {:?} has data_type {}; it must be TYPE_INT32 or TYPE_FP32",
                        b.target_name, b.data_type
                    ))
                }
            };
            batch_inputs.push(BatchInput {
                kind,
                targets: b.target_name.clone(),
                dtype,
                source: source.clone(),
            });
        }
        let mut scatter = Vec::new();
        for b in &config.batch_output {
            let [source] = &b.source_input[..] else {
                return Err(format!(
                    "batch_output {:?} must name exactly one source_input",
                    b.target_name
                ));
            };
            if !is_input(source) {
                return Err(format!(
                    "batch_output's source_input '{source}' is not an input of the model"
                ));
            }
            for t in &b.target_name {
                let out = config
                    .output
                    .iter()
                    .find(|o| &o.name == t)
                    .ok_or_else(|| format!("batch_output target '{t}' is not an output of the model"))?;
                if DataType::from_config(out.data_type)
                    .and_then(DataType::element_size)
                    .is_none()
                {
                    return Err(format!(
                        "batch_output target '{t}' must have a fixed-size data type, not BYTES"
                    ));
                }
                scatter.push((t.clone(), source.clone()));
            }
        }
        Ok(Some(Arc::new(Ragged {
            ragged,
            batch_inputs,
            scatter,
            batched: config.max_batch_size > 0,
        })))
    }

    /// Whether requests may batch whatever the shape of this input.
    pub fn is_ragged(&self, input: &str) -> bool {
        self.ragged.iter().any(|r| r == input)
    }

    /// The names of the inputs the node makes, for the load-time check against the model.
    pub fn made_inputs(&self) -> impl Iterator<Item = &str> {
        self.batch_inputs
            .iter()
            .flat_map(|b| b.targets.iter().map(String::as_str))
    }

    /// Whether the model gives this output flat, to be scattered in the shapes of an input.
    pub fn is_scattered(&self, output: &str) -> bool {
        self.scatter.iter().any(|(o, _)| o == output)
    }

    /// The model's inputs for a batch of requests: ragged inputs flat, the others merged along the
    /// batch dimension, then the batch inputs.
    pub fn merge(&self, requests: &[&[NamedTensor]]) -> Result<Vec<NamedTensor>> {
        let Some(first) = requests.first() else {
            return Ok(Vec::new());
        };
        let source = |req: &[NamedTensor], name: &str| -> Result<Tensor> {
            req.iter()
                .find(|i| i.name == name)
                .map(|i| i.tensor.clone())
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "input '{name}' is needed for the batch inputs and was not sent"
                    ))
                })
        };
        let (flat, even): (Vec<&NamedTensor>, Vec<&NamedTensor>) = first.iter().partition(|i| self.is_ragged(&i.name));
        let even_names: Vec<&str> = even.iter().map(|i| i.name.as_str()).collect();
        let kept: Vec<Vec<NamedTensor>> = requests
            .iter()
            .map(|r| {
                r.iter()
                    .filter(|i| even_names.contains(&i.name.as_str()))
                    .cloned()
                    .collect()
            })
            .collect();
        let kept_refs: Vec<&[NamedTensor]> = kept.iter().map(|k| &k[..]).collect();
        let mut merged = if requests.len() == 1 {
            kept.into_iter().next().unwrap_or_default()
        } else {
            batch_io::merge(&kept_refs)?
        };
        for input in flat {
            let mut data = BytesMut::new();
            let mut count = 0usize;
            for req in requests {
                let t = source(req, &input.name)?;
                count += t.element_count();
                data.extend_from_slice(&t.data);
            }
            merged.push(NamedTensor {
                name: input.name.clone(),
                tensor: Tensor {
                    dtype: input.tensor.dtype,
                    shape: vec![count as i64],
                    data: data.freeze(),
                },
            });
        }
        for b in &self.batch_inputs {
            let tensors: Vec<Tensor> = requests.iter().map(|r| source(r, &b.source)).collect::<Result<_>>()?;
            let tensor = self.batch_tensor(b, &tensors)?;
            for target in &b.targets {
                merged.push(NamedTensor {
                    name: target.clone(),
                    tensor: tensor.clone(),
                });
            }
        }
        Ok(merged)
    }

    fn batch_tensor(&self, b: &BatchInput, sources: &[Tensor]) -> Result<Tensor> {
        let counts: Vec<i64> = sources.iter().map(|t| t.element_count() as i64).collect();
        let running = counts.iter().scan(0i64, |sum, c| {
            *sum += c;
            Some(*sum)
        });
        let (shape, values): (Vec<i64>, Vec<i64>) = match b.kind {
            Kind::BatchElementCount => (vec![counts.len() as i64], counts.clone()),
            Kind::BatchAccumulatedElementCount => (vec![counts.len() as i64], running.collect()),
            Kind::BatchAccumulatedElementCountWithZero => (
                vec![counts.len() as i64 + 1],
                std::iter::once(0).chain(running).collect(),
            ),
            Kind::BatchMaxElementCountAsShape => {
                let most = counts.iter().copied().max().unwrap_or(0);
                // Only the shape carries meaning; the data is zeros (Triton leaves it unset).
                (vec![most], vec![0; most as usize])
            }
            Kind::BatchItemShape | Kind::BatchItemShapeFlatten => {
                let mut items: Vec<Vec<i64>> = Vec::new();
                for t in sources {
                    let (rows, item) = match (self.batched, t.shape.split_first()) {
                        (true, Some((rows, item))) => (*rows, item.to_vec()),
                        _ => (1, t.shape.clone()),
                    };
                    items.extend((0..rows.max(0)).map(|_| item.clone()));
                }
                let rank = items.first().map_or(0, Vec::len);
                if items.iter().any(|i| i.len() != rank) {
                    return Err(Error::invalid(format!(
                        "the requests' '{}' inputs differ in rank, so their item shapes do not batch",
                        b.source
                    )));
                }
                let shape = if b.kind == Kind::BatchItemShape {
                    vec![items.len() as i64, rank as i64]
                } else {
                    vec![(items.len() * rank) as i64]
                };
                (shape, items.concat())
            }
        };
        Ok(match b.dtype {
            DataType::Fp32 => Tensor::from_values(shape, &values.iter().map(|v| *v as f32).collect::<Vec<_>>()),
            _ => Tensor::from_values(shape, &values.iter().map(|v| *v as i32).collect::<Vec<_>>()),
        })
    }

    /// Splits a batch's outputs back to its requests: scattered outputs in the shapes of each
    /// request's source input, the others by rows.
    pub fn split(
        &self,
        outputs: Vec<NamedTensor>,
        requests: &[&[NamedTensor]],
        rows: &[usize],
    ) -> Result<Vec<Vec<NamedTensor>>> {
        let (scattered, by_rows): (Vec<NamedTensor>, Vec<NamedTensor>) =
            outputs.into_iter().partition(|o| self.is_scattered(&o.name));
        let mut parts = if requests.len() == 1 {
            vec![by_rows]
        } else {
            batch_io::split(by_rows, rows)?
        };
        for out in scattered {
            let source = &self
                .scatter
                .iter()
                .find(|(o, _)| *o == out.name)
                .expect("partitioned by name")
                .1;
            let size = out.tensor.dtype.element_size().unwrap_or(1);
            let mut at = 0usize;
            for (req, part) in requests.iter().zip(parts.iter_mut()) {
                let shape = req
                    .iter()
                    .find(|i| &i.name == source)
                    .map(|i| i.tensor.shape.clone())
                    .ok_or_else(|| Error::internal(format!("scatter source '{source}' is missing")))?;
                let bytes = mesh::tensor::element_count(&shape)? * size;
                let data = out.tensor.data.get(at..at + bytes).ok_or_else(|| {
                    Error::internal(format!(
                        "output '{}' has {} bytes, too few to scatter in the shapes of input '{source}'",
                        out.name,
                        out.tensor.data.len()
                    ))
                })?;
                part.push(NamedTensor {
                    name: out.name.clone(),
                    tensor: Tensor {
                        dtype: out.tensor.dtype,
                        shape,
                        data: out.tensor.data.slice_ref(data),
                    },
                });
                at += bytes;
            }
        }
        Ok(parts)
    }
}

#[cfg(test)]
#[path = "ragged_tests.rs"]
mod tests;
