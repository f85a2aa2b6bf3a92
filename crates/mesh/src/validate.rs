//! Checks an inference request against its model's config before anything runs.
use std::collections::HashSet;

use crate::config::ModelConfig;
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::request::{InferRequest, InferResponse};

/// A request checked against its model's config (inputs, the outputs it asks for, classification)
/// before anything runs: the one admission of node and router alike. Its answer is then classified
/// as it asked ([`Admitted::answer`]).
#[derive(Debug)]
pub struct Admitted {
    /// The outputs to classify, with their class counts.
    classify: Vec<(String, u32)>,
}

impl Admitted {
    /// `decoupled`: the model (or an ensemble step) may answer several times.
    pub fn check(config: &ModelConfig, req: &InferRequest, decoupled: bool) -> Result<Self> {
        check_request(config, req)?;
        crate::classify::check(config, &req.outputs, decoupled)?;
        Ok(Admitted {
            classify: crate::classify::wanted(&req.outputs),
        })
    }

    /// The answer with each output asked for with a class count replaced by its top classes.
    pub fn answer(
        &self,
        mut response: InferResponse,
        config: &ModelConfig,
        labels: &crate::classify::Labels,
    ) -> Result<InferResponse> {
        crate::classify::apply(&mut response, &self.classify, config, labels)?;
        Ok(response)
    }
}

/// Why a decoupled model (or an ensemble with a decoupled step) cannot be asked on an end point that
/// takes one answer, as Triton refuses it.
pub fn needs_stream(model: &str) -> Error {
    Error::unsupported(format!(
        "model '{model}' is decoupled (it may send several responses per request): this end point doesn't \
         support models with decoupled transaction policy; use the gRPC ModelStreamInfer stream \
         (tritonclient's start_stream / async_stream_infer) or HTTP generate_stream"
    ))
}

/// Checks that each input's bytes fit its datatype and shape (a fixed-size type's byte count, a
/// BYTES tensor's framing). Frontends check this as they decode; callers in the same process (the
/// embedding APIs) hand tensors over directly, so their entry points ask it.
pub fn check_tensors(req: &InferRequest) -> Result<()> {
    for input in &req.inputs {
        input.tensor.check().map_err(|e| {
            Error::invalid(format!(
                "input '{}' of model '{}': {}",
                input.name, req.model_name, e.message
            ))
        })?;
    }
    Ok(())
}

/// Checks inputs (known, unique, present, dtype, shape, batch size) and requested outputs.
pub fn check_request(config: &ModelConfig, req: &InferRequest) -> Result<()> {
    let model = &config.name;
    check_input_count(config, req)?;
    let mut seen = HashSet::with_capacity(req.inputs.len());
    let mut batch: Option<i64> = None;
    for input in &req.inputs {
        let name = input.name.as_str();
        let Some(spec) = config.input.iter().find(|i| i.name == name) else {
            return Err(Error::invalid(format!(
                "unexpected inference input '{name}' for model '{model}'"
            )));
        };
        if !seen.insert(name) {
            return Err(Error::invalid(format!("input '{name}' already exists in request")));
        }
        let want = DataType::from_config(spec.data_type);
        if want != Some(input.tensor.dtype) {
            return Err(Error::invalid(format!(
                "input '{name}' has datatype {}, but model '{model}' expects {}",
                input.tensor.dtype,
                want.map_or("an invalid type", |d| d.wire_name())
            )));
        }
        let shape = &input.tensor.shape;
        let dims = if config.max_batch_size > 0 {
            let Some((&b, rest)) = shape.split_first() else {
                return Err(Error::invalid(format!(
                    "input '{name}' has shape [], but model '{model}' is batched and needs a batch dimension first"
                )));
            };
            if b < 1 || b > i64::from(config.max_batch_size) {
                return Err(Error::invalid(format!(
                    "input '{name}' has batch size {b}, but model '{model}' accepts 1 to {} (max_batch_size)",
                    config.max_batch_size
                )));
            }
            if let Some(prev) = batch.replace(b) {
                if prev != b {
                    return Err(Error::invalid(format!(
                        "inputs disagree on batch size: {prev} and {b} (input '{name}')"
                    )));
                }
            }
            rest
        } else {
            &shape[..]
        };
        if !dims_match(&spec.dims, dims) {
            let shown = if config.max_batch_size > 0 {
                format!("[-1{}]", spec.dims.iter().map(|d| format!(",{d}")).collect::<String>())
            } else {
                format!("{:?}", spec.dims)
            };
            return Err(Error::invalid(format!(
                "input '{name}' has shape {shape:?}, but model '{model}' expects {shown}"
            )));
        }
    }
    // Stricter than Triton, which runs a request whose count is in range without a required input.
    if config
        .input
        .iter()
        .any(|spec| !spec.optional && !seen.contains(spec.name.as_str()))
    {
        return Err(count_error(config, req));
    }
    let mut wanted = HashSet::with_capacity(req.outputs.len());
    for out in &req.outputs {
        if !config.output.iter().any(|o| o.name == out.name) {
            return Err(Error::invalid(format!(
                "unexpected inference output '{}' for model '{model}'",
                out.name
            )));
        }
        if !wanted.insert(out.name.as_str()) {
            return Err(Error::invalid(format!(
                "output '{}' is requested more than once",
                out.name
            )));
        }
    }
    Ok(())
}

/// Checks that no input is given twice and that the number of inputs lies between the model's
/// required and all of its inputs, with Triton's message naming what was given and what is missing.
fn check_input_count(config: &ModelConfig, req: &InferRequest) -> Result<()> {
    let total = config.input.len();
    let required = config.input.iter().filter(|i| !i.optional).count();
    let given = req.inputs.len();
    let mut names = HashSet::with_capacity(given);
    if let Some(dup) = req.inputs.iter().find(|i| !names.insert(i.name.as_str())) {
        return Err(Error::invalid(format!(
            "input '{}' already exists in request",
            dup.name
        )));
    }
    if (required..=total).contains(&given) {
        return Ok(());
    }
    Err(count_error(config, req))
}

/// Triton's message for a request whose inputs do not match the model's: how many it expects and
/// got, what was given and which required inputs are missing.
fn count_error(config: &ModelConfig, req: &InferRequest) -> Error {
    let total = config.input.len();
    let required = config.input.iter().filter(|i| !i.optional).count();
    let missing = config
        .input
        .iter()
        .filter(|spec| !spec.optional && req.input(&spec.name).is_none())
        .map(|spec| spec.name.as_str());
    let expected = if required == total {
        format!("expected {total} inputs")
    } else {
        format!("expected number of inputs between {required} and {total}")
    };
    let quoted = |names: &mut dyn Iterator<Item = &str>| names.map(|n| format!("'{n}'")).collect::<Vec<_>>().join(",");
    Error::invalid(format!(
        "{expected} but got {} inputs for model '{}'. Got input(s) [{}], but missing required input(s) [{}]. \
         Please provide all required input(s).",
        req.inputs.len(),
        config.name,
        quoted(&mut req.inputs.iter().map(|i| i.name.as_str())),
        quoted(&mut missing.into_iter()),
    ))
}

/// Whether a concrete shape fits config dims, where -1 matches any size.
pub fn dims_match(spec: &[i64], shape: &[i64]) -> bool {
    spec.len() == shape.len() && spec.iter().zip(shape).all(|(&s, &d)| d >= 0 && (s == -1 || s == d))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_pbtxt;
    use crate::request::RequestedOutput;
    use crate::tensor::{NamedTensor, Tensor};

    fn cfg() -> ModelConfig {
        parse_pbtxt(
            r#"name: "m" max_batch_size: 4
            input [ { name: "a" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "opt" data_type: TYPE_INT32 dims: [ -1 ] optional: true } ]
            output [ { name: "y" data_type: TYPE_FP32 dims: [ 2 ] } ]"#,
        )
        .unwrap()
    }

    fn req(inputs: Vec<(&str, Tensor)>, outputs: &[&str]) -> InferRequest {
        InferRequest {
            model_name: "m".into(),
            inputs: inputs
                .into_iter()
                .map(|(n, t)| NamedTensor {
                    name: n.into(),
                    tensor: t,
                })
                .collect(),
            outputs: outputs.iter().map(|n| RequestedOutput::named(n.to_string())).collect(),
            ..Default::default()
        }
    }

    fn f32s(shape: Vec<i64>) -> Tensor {
        let n = crate::tensor::element_count(&shape).unwrap();
        Tensor::from_values(shape, &vec![0f32; n])
    }

    #[test]
    fn tensors_whose_bytes_do_not_fit_their_shape_are_refused_by_name() {
        assert!(check_tensors(&req(vec![("x", f32s(vec![1, 4]))], &[])).is_ok());
        let mut short = f32s(vec![1, 4]);
        short.data = short.data.slice(..12);
        let e = check_tensors(&req(vec![("x", short)], &[])).unwrap_err();
        assert_eq!(e.code, crate::Code::InvalidArgument);
        assert!(e.message.starts_with("input 'x' of model"), "{}", e.message);
        assert!(e.message.ends_with("needs 16 bytes, got 12"), "{}", e.message);
    }

    #[test]
    fn accepts_good_requests() {
        check_request(&cfg(), &req(vec![("a", f32s(vec![3, 2]))], &["y"])).unwrap();
        let opt = Tensor::from_values(vec![3, 5], &[0i32; 15]);
        check_request(&cfg(), &req(vec![("a", f32s(vec![3, 2])), ("opt", opt)], &[])).unwrap();
    }

    #[test]
    fn rejects_each_bad_case_with_a_named_reason() {
        let c = cfg();
        let cases: Vec<(InferRequest, &str)> = vec![
            (
                req(vec![("zzz", f32s(vec![1, 2]))], &[]),
                "unexpected inference input 'zzz'",
            ),
            (
                req(vec![("a", f32s(vec![1, 2])), ("a", f32s(vec![1, 2]))], &[]),
                "already exists in request",
            ),
            (
                req(vec![], &[]),
                "expected number of inputs between 1 and 2 but got 0 inputs for model 'm'. Got input(s) [], \
                 but missing required input(s) ['a']",
            ),
            (
                req(vec![("opt", Tensor::from_values(vec![1, 1], &[0i32]))], &[]),
                "Got input(s) ['opt'], but missing required input(s) ['a']",
            ),
            (
                req(
                    vec![
                        ("a", f32s(vec![1, 2])),
                        ("opt", Tensor::from_values(vec![1, 1], &[0i32])),
                        ("zz", f32s(vec![1, 2])),
                    ],
                    &[],
                ),
                "but got 3 inputs",
            ),
            (
                req(vec![("a", Tensor::from_values(vec![1, 2], &[0i64; 2]))], &[]),
                "datatype INT64",
            ),
            (req(vec![("a", f32s(vec![1, 3]))], &[]), "expects [-1,2]"),
            (req(vec![("a", f32s(vec![2]))], &[]), "expects [-1,2]"),
            (req(vec![("a", f32s(vec![5, 2]))], &[]), "batch size 5"),
            (req(vec![("a", f32s(vec![0, 2]))], &[]), "batch size 0"),
            (req(vec![("a", f32s(vec![]))], &[]), "needs a batch dimension"),
            (
                req(vec![("a", f32s(vec![1, 2]))], &["nope"]),
                "unexpected inference output 'nope'",
            ),
            (
                req(vec![("a", f32s(vec![1, 2]))], &["y", "y"]),
                "requested more than once",
            ),
            (
                req(
                    vec![
                        ("a", f32s(vec![2, 2])),
                        ("opt", Tensor::from_values(vec![3, 1], &[0i32; 3])),
                    ],
                    &[],
                ),
                "disagree on batch size",
            ),
        ];
        for (r, want) in cases {
            let e = check_request(&c, &r).unwrap_err();
            assert_eq!(e.code, crate::Code::InvalidArgument);
            assert!(e.message.contains(want), "want '{want}' in '{}'", e.message);
        }
    }

    #[test]
    fn unbatched_models_compare_whole_shape() {
        let mut c = cfg();
        c.max_batch_size = 0;
        check_request(&c, &req(vec![("a", f32s(vec![2]))], &[])).unwrap();
        assert!(check_request(&c, &req(vec![("a", f32s(vec![1, 2]))], &[])).is_err());
    }
}
