//! Request tensors: shapes from the model's metadata, data random, zero or from perf_analyzer's input JSON.

use std::path::PathBuf;
use std::str::FromStr;

use bytes::Bytes;
use mesh::DataType;
use serde_json::Value;

use super::SetupError;

/// The most bytes one generated tensor may take (a guard against a mistyped `--shape`).
const MAX_TENSOR_BYTES: u64 = 1 << 30;
/// Random integers are drawn from 0..RANDOM_INT_BOUND, safe as indices or token ids.
const RANDOM_INT_BOUND: u64 = 100;
/// Random BYTES elements are 1..=RANDOM_STRING_MAX alphanumeric characters.
const RANDOM_STRING_MAX: u64 = 16;

/// An input as the model's metadata describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputSpec {
    pub name: String,
    /// The KServe v2 datatype name, as the server wrote it.
    pub datatype: String,
    /// The shape, -1 for a dynamic dim; includes the batch dim for a batching model.
    pub shape: Vec<i64>,
}

/// What the server says about the model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelInfo {
    pub inputs: Vec<InputSpec>,
    /// From the model's config; 0 for a model that does not batch.
    pub max_batch_size: u32,
}

/// Where the input data comes from (`--input`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InputSource {
    Random,
    Zeros,
    /// perf_analyzer's input-data JSON.
    File(PathBuf),
}

impl FromStr for InputSource {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "random" => Ok(InputSource::Random),
            "zeros" => Ok(InputSource::Zeros),
            "" => Err("expected random, zeros or a JSON file".to_string()),
            path => Ok(InputSource::File(PathBuf::from(path))),
        }
    }
}

/// `--shape NAME:D1,D2,...`: the shape of a dynamic input, without the batch dim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShapeOverride {
    pub name: String,
    pub dims: Vec<i64>,
}

impl FromStr for ShapeOverride {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (name, dims) = s
            .rsplit_once(':')
            .filter(|(n, _)| !n.is_empty())
            .ok_or_else(|| format!("'{s}': expected NAME:D1,D2,... (e.g. INPUT0:3,224,224)"))?;
        let dims = if dims.trim().is_empty() {
            Vec::new() // a scalar
        } else {
            dims.split(',')
                .map(|d| d.trim().parse::<i64>().ok().filter(|d| *d >= 0))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| format!("'{s}': dims must be non-negative integers separated by commas"))?
        };
        Ok(ShapeOverride {
            name: name.to_string(),
            dims,
        })
    }
}

/// An input ready to be filled: its datatype and shape, both without the batch dim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planned {
    pub name: String,
    pub datatype: DataType,
    /// The metadata's shape without the batch dim (-1 where dynamic).
    pub declared: Vec<i64>,
    /// The shape sent, without the batch dim: `--shape`, or `declared` with -1 taken as 1.
    pub dims: Vec<i64>,
    /// Whether requests carry a leading batch dim.
    pub batched: bool,
}

impl Planned {
    /// The shape sent for a batch of `batch` (unbatched models ignore it).
    pub fn full_shape(&self, batch: u32, dims: &[i64]) -> Vec<i64> {
        let lead = self.batched.then_some(i64::from(batch));
        lead.into_iter().chain(dims.iter().copied()).collect()
    }
}

/// One input of a request, in the binary layout shared by HTTP's binary extension and gRPC's raw
/// contents: little-endian elements; BYTES as a 4-byte little-endian length then the bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestTensor {
    pub name: String,
    pub datatype: DataType,
    pub shape: Vec<i64>,
    pub data: Bytes,
}

/// Resolves every input's datatype and shape for batches of `batch`.
pub fn plan(info: &ModelInfo, batch: u32, overrides: &[ShapeOverride]) -> Result<Vec<Planned>, SetupError> {
    let batched = info.max_batch_size > 0;
    if !batched && batch > 1 {
        return Err(SetupError::usage(format!(
            "--batch {batch}: the model does not batch (max_batch_size 0)"
        )));
    }
    if batched && batch > info.max_batch_size {
        return Err(SetupError::usage(format!(
            "--batch {batch} is larger than the model's max_batch_size {}",
            info.max_batch_size
        )));
    }
    if let Some(o) = overrides.iter().find(|o| !info.inputs.iter().any(|i| i.name == o.name)) {
        let names: Vec<&str> = info.inputs.iter().map(|i| i.name.as_str()).collect();
        return Err(SetupError::usage(format!(
            "--shape {}: the model has no input '{}' (its inputs: {})",
            o.name,
            o.name,
            names.join(", ")
        )));
    }
    let mut planned = Vec::with_capacity(info.inputs.len());
    for input in &info.inputs {
        let datatype = DataType::from_wire(&input.datatype).map_err(|_| {
            SetupError::bad_answer(format!(
                "input '{}' has datatype '{}', which is not a KServe v2 datatype",
                input.name, input.datatype
            ))
        })?;
        let declared = match (batched, input.shape.split_first()) {
            (true, Some((_, rest))) => rest.to_vec(),
            (true, None) => {
                return Err(SetupError::bad_answer(format!(
                    "input '{}' of a batching model has no batch dim in its metadata shape",
                    input.name
                )))
            }
            (false, _) => input.shape.clone(),
        };
        let dims = match overrides.iter().rev().find(|o| o.name == input.name) {
            Some(o) => {
                check_fits(&input.name, &o.dims, &declared, batched).map_err(SetupError::usage)?;
                o.dims.clone()
            }
            None => declared.iter().map(|&d| if d < 0 { 1 } else { d }).collect(),
        };
        planned.push(Planned {
            name: input.name.clone(),
            datatype,
            declared,
            dims,
            batched,
        });
    }
    Ok(planned)
}

/// Checks that `dims` fits the declared shape: same rank, same size wherever the size is fixed.
fn check_fits(name: &str, dims: &[i64], declared: &[i64], batched: bool) -> Result<(), String> {
    let fits = dims.len() == declared.len() && dims.iter().zip(declared).all(|(d, want)| *want < 0 || d == want);
    let note = if batched { "without the batch dim; " } else { "" };
    if fits {
        Ok(())
    } else {
        Err(format!(
            "input '{name}': shape {dims:?} does not fit the model's {declared:?} ({note}-1 is any size)"
        ))
    }
}

/// Number of elements in a shape, refusing tensors over MAX_TENSOR_BYTES.
fn element_count(name: &str, datatype: DataType, shape: &[i64]) -> Result<usize, SetupError> {
    let count = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(u64::try_from(d).ok()?));
    let per_element = datatype.element_size().unwrap_or(4) as u64;
    match count {
        Some(n) if n.saturating_mul(per_element) <= MAX_TENSOR_BYTES => Ok(n as usize),
        _ => Err(SetupError::usage(format!(
            "input '{name}': shape {shape:?} is larger than the {} MiB a tensor may take",
            MAX_TENSOR_BYTES >> 20
        ))),
    }
}

/// A small, fast pseudo-random generator (SplitMix64); not for cryptography.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Random (integers 0..100, floats in [0, 1), BOOL either, BYTES 1..=16 letters and digits) or
/// zero (BYTES empty) data for every planned input.
pub fn generate(plan: &[Planned], batch: u32, zeros: bool, rng: &mut Rng) -> Result<Vec<RequestTensor>, SetupError> {
    plan.iter()
        .map(|p| {
            let shape = p.full_shape(batch, &p.dims);
            let n = element_count(&p.name, p.datatype, &shape)?;
            let data = if zeros {
                // n zero elements; for BYTES, n zero lengths: n empty strings.
                vec![0u8; n * p.datatype.element_size().unwrap_or(4)]
            } else {
                let mut out = Vec::with_capacity(n * p.datatype.element_size().unwrap_or(12));
                for _ in 0..n {
                    random_element(p.datatype, rng, &mut out);
                }
                out
            };
            Ok(RequestTensor {
                name: p.name.clone(),
                datatype: p.datatype,
                shape,
                data: Bytes::from(data),
            })
        })
        .collect()
}

fn random_element(dt: DataType, rng: &mut Rng, out: &mut Vec<u8>) {
    const ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    match dt {
        DataType::Bool => out.push((rng.next_u64() & 1) as u8),
        DataType::Fp16 => out.extend_from_slice(&half::f16::from_f64(rng.unit()).to_le_bytes()),
        DataType::Bf16 => out.extend_from_slice(&half::bf16::from_f64(rng.unit()).to_le_bytes()),
        DataType::Fp32 => out.extend_from_slice(&(rng.unit() as f32).to_le_bytes()),
        DataType::Fp64 => out.extend_from_slice(&rng.unit().to_le_bytes()),
        DataType::Bytes => {
            let len = 1 + rng.below(RANDOM_STRING_MAX);
            out.extend_from_slice(&(len as u32).to_le_bytes());
            out.extend((0..len).map(|_| ALNUM[rng.below(ALNUM.len() as u64) as usize]));
        }
        _ => {
            // A small non-negative integer, little-endian, cut to the element's size.
            let size = dt.element_size().unwrap_or(8);
            out.extend_from_slice(&rng.below(RANDOM_INT_BOUND).to_le_bytes()[..size]);
        }
    }
}

/// Parses perf_analyzer's input-data JSON: `{"data": [{"INPUT0": [...], "INPUT1": {"content": [...],
/// "shape": [...]}}, ...]}`, one request per entry; shapes exclude the batch dim and an entry is
/// repeated to fill a batch. Errors name the entry and the input.
pub fn from_json(text: &str, plan: &[Planned], batch: u32) -> Result<Vec<Vec<RequestTensor>>, SetupError> {
    let doc: Value = serde_json::from_str(text).map_err(|e| SetupError::usage(format!("not JSON: {e}")))?;
    let entries = doc.get("data").and_then(Value::as_array).ok_or_else(|| {
        SetupError::usage("expected an object with a \"data\" array: {\"data\": [{\"INPUT0\": [...]}, ...]}")
    })?;
    if entries.is_empty() {
        return Err(SetupError::usage("\"data\" is empty: give at least one entry"));
    }
    let mut requests = Vec::with_capacity(entries.len());
    for (i, entry) in entries.iter().enumerate() {
        let fields = entry.as_object().ok_or_else(|| {
            SetupError::usage(format!(
                "data entry {i}: expected an object of inputs (sequences of steps are not supported)"
            ))
        })?;
        if let Some(unknown) = fields.keys().find(|k| !plan.iter().any(|p| &p.name == *k)) {
            let names: Vec<&str> = plan.iter().map(|p| p.name.as_str()).collect();
            return Err(SetupError::usage(format!(
                "data entry {i}: the model has no input '{unknown}' (its inputs: {})",
                names.join(", ")
            )));
        }
        let mut tensors = Vec::with_capacity(plan.len());
        for p in plan {
            let value = fields
                .get(&p.name)
                .ok_or_else(|| SetupError::usage(format!("data entry {i}: input '{}' is missing", p.name)))?;
            let tensor = json_tensor(p, value, batch)
                .map_err(|e| SetupError::usage(format!("data entry {i}: input '{}': {e}", p.name)))?;
            tensors.push(tensor);
        }
        requests.push(tensors);
    }
    Ok(requests)
}

/// One input's value in an entry: a (possibly nested) array, or `{"content": [...], "shape": [...]}`.
fn json_tensor(p: &Planned, value: &Value, batch: u32) -> Result<RequestTensor, String> {
    let (content, dims) = match value {
        Value::Array(_) => (value, p.dims.clone()),
        Value::Object(o) if o.contains_key("content") => {
            let dims = match o.get("shape") {
                None => p.dims.clone(),
                Some(s) => {
                    let dims: Vec<i64> = s
                        .as_array()
                        .and_then(|a| a.iter().map(|d| d.as_i64().filter(|d| *d >= 0)).collect())
                        .ok_or("\"shape\" must be an array of non-negative integers")?;
                    check_fits(&p.name, &dims, &p.declared, p.batched)?;
                    dims
                }
            };
            (&o["content"], dims)
        }
        Value::Object(o) if o.contains_key("b64") => {
            return Err("base64 (\"b64\") data is not supported; give an array or {\"content\", \"shape\"}".into())
        }
        _ => return Err("expected an array of values or {\"content\": [...], \"shape\": [...]}".into()),
    };
    let mut flat = Vec::new();
    flatten(content, &mut flat);
    let want = element_count(&p.name, p.datatype, &dims).map_err(|e| e.message)?;
    if flat.len() != want {
        return Err(format!("{} values, but shape {dims:?} holds {want}", flat.len()));
    }
    let mut one = Vec::with_capacity(want * p.datatype.element_size().unwrap_or(8));
    for (j, v) in flat.iter().enumerate() {
        encode(p.datatype, v, &mut one).map_err(|e| format!("value {j}: {e}"))?;
    }
    let shape = p.full_shape(batch, &dims);
    let copies = if p.batched { batch as usize } else { 1 };
    Ok(RequestTensor {
        name: p.name.clone(),
        datatype: p.datatype,
        shape,
        data: Bytes::from(one.repeat(copies)),
    })
}

fn flatten<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
    match v {
        Value::Array(items) => items.iter().for_each(|i| flatten(i, out)),
        other => out.push(other),
    }
}

/// Appends one JSON value as an element of `dt`.
fn encode(dt: DataType, v: &Value, out: &mut Vec<u8>) -> Result<(), String> {
    let size = dt.element_size().unwrap_or(0);
    let (min, max): (i128, i128) = match dt {
        DataType::Uint8 | DataType::Uint16 | DataType::Uint32 | DataType::Uint64 => (0, (1i128 << (size * 8)) - 1),
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => {
            (-(1i128 << (size * 8 - 1)), (1i128 << (size * 8 - 1)) - 1)
        }
        _ => (0, 0),
    };
    match dt {
        DataType::Bool => match v {
            Value::Bool(b) => out.push(u8::from(*b)),
            _ => return Err(format!("expected true or false, got {v}")),
        },
        DataType::Bytes => match v {
            Value::String(s) => {
                let len = u32::try_from(s.len()).map_err(|_| "string too long".to_string())?;
                out.extend_from_slice(&len.to_le_bytes());
                out.extend_from_slice(s.as_bytes());
            }
            _ => return Err(format!("expected a string, got {v}")),
        },
        DataType::Fp16 | DataType::Bf16 | DataType::Fp32 | DataType::Fp64 => {
            let x = v.as_f64().ok_or_else(|| format!("expected a number, got {v}"))?;
            match dt {
                DataType::Fp16 => out.extend_from_slice(&half::f16::from_f64(x).to_le_bytes()),
                DataType::Bf16 => out.extend_from_slice(&half::bf16::from_f64(x).to_le_bytes()),
                DataType::Fp32 => out.extend_from_slice(&(x as f32).to_le_bytes()),
                _ => out.extend_from_slice(&x.to_le_bytes()),
            }
        }
        _ => {
            let x = v
                .as_i64()
                .map(i128::from)
                .or_else(|| v.as_u64().map(i128::from))
                .ok_or_else(|| format!("expected an integer, got {v}"))?;
            if x < min || x > max {
                return Err(format!("{x} is out of range for {dt} ({min}..={max})"));
            }
            out.extend_from_slice(&x.to_le_bytes()[..size]);
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "inputs_tests.rs"]
mod tests;
