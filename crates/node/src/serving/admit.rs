//! A request's admission to the node, done once: its parameters parsed into one typed value, the model version found, its inputs checked against the model's config (`Admitted`), and its trace sampled.
//!
//! What comes out is an [`Admission`], which only the node makes (here): whoever holds one (the
//! node's own path, or an in-process caller through `NodeDispatch::admit_local`) runs it as it is,
//! and nothing on the way reads the request's parameters or checks its inputs again.
use std::sync::Arc;
use std::time::Instant;

use mesh::params::Controls;
use mesh::validate::Admitted;
use mesh::{InferRequest, Result};

use crate::actors::model::LoadedVersion;
use crate::actors::table::ModelTable;
use crate::serving::traced::Traced;

/// Where a request comes from, which says what was checked before it came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry {
    /// The HTTP and gRPC frontends (and the node's own calls: ensemble steps, BLS): tensors were
    /// checked as they were decoded, or made by the node.
    Frontend,
    /// A caller in the same process (the C API, the embedding API) hands its tensors over
    /// directly: their bytes are checked here ([`mesh::validate::check_tensors`]).
    InProcess,
}

/// How the caller takes a request's answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replies {
    /// One answer: a decoupled model (or an ensemble with a decoupled step) is refused, as Triton
    /// refuses it on an end point that takes one answer.
    One,
    /// A stream (or one answer, where the model gives one: see [`Admission::decoupled`]).
    Stream,
}

/// What running an admitted request needs: the request, its model version, its controls and
/// trace, and when it came.
pub(crate) struct Work {
    pub request: InferRequest,
    pub model: Arc<LoadedVersion>,
    /// Its parameters, parsed once.
    pub controls: Controls,
    /// The model (or an ensemble's step) may answer several times.
    pub decoupled: bool,
    pub start: Instant,
    /// Sampled once, here: a plain model's trace, or an ensemble's, whose steps are its children.
    pub trace: Option<Traced>,
}

/// A request admitted to one of the node's model versions, ready to run.
pub struct Admission {
    /// How its answer is classified as it asked.
    pub(crate) admitted: Admitted,
    pub(crate) work: Work,
}

impl Admission {
    /// Whether its model may answer several times: it then needs a stream.
    pub fn decoupled(&self) -> bool {
        self.work.decoupled
    }

    /// The model it was admitted to, as the request names it.
    pub fn model_name(&self) -> &str {
        &self.work.request.model_name
    }

    /// The request's id.
    pub fn request_id(&self) -> &str {
        &self.work.request.id
    }
}

/// Admits a request: its parameters parsed once ([`Controls::parse`]), an in-process caller's
/// tensors checked, the model version found, a decoupled model refused if the caller takes
/// one answer, the inputs and outputs checked against the model's config (a refusal counts as
/// the model's failure), and the trace sampled. Each refusal is the error (and kind) it has always been.
pub(crate) fn admit(table: &ModelTable, request: InferRequest, entry: Entry, replies: Replies) -> Result<Admission> {
    // One rule per parameter, for every model (mesh::params), as a router checks them too.
    let controls = Controls::parse(&request.parameters)?;
    if entry == Entry::InProcess {
        mesh::validate::check_tensors(&request)?;
    }
    let start = Instant::now();
    let model = table.resolve(&request.model_name, &request.model_version)?;
    // An ensemble with a decoupled step answers any number of times, as a decoupled model does.
    let decoupled = model
        .config
        .model_transaction_policy
        .as_ref()
        .is_some_and(|p| p.decoupled)
        || model.ensemble.as_ref().is_some_and(|plan| plan.decoupled);
    if decoupled && replies == Replies::One {
        return Err(mesh::validate::needs_stream(&request.model_name));
    }
    let admitted = match Admitted::check(&model.config, &request, decoupled) {
        Ok(admitted) => admitted,
        Err(e) => {
            model.stats.failure(e.metric_reason(), start.elapsed());
            return Err(e);
        }
    };
    let trace = Traced::sample(&model, &request, start);
    Ok(Admission {
        admitted,
        work: Work {
            request,
            model,
            controls,
            decoupled,
            start,
            trace,
        },
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use mesh::config::parse_pbtxt;
    use mesh::ensemble::{Plan, StepModel};
    use mesh::{Code, NamedTensor, Param, Tensor};

    use super::*;
    use crate::actors::model::ModelHandle;
    use crate::actors::table::{ModelEntry, ModelState};

    /// An ensemble `name` of one step over `step` (x FP32 [4] -> y), decoupled when its step is.
    fn ensemble(table: &ModelTable, name: &str, decoupled: bool) {
        let config = parse_pbtxt(&format!(
            r#"name: "{name}" platform: "ensemble"
            input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }} ]
            output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }} ]
            ensemble_scheduling {{ step [ {{ model_name: "step" model_version: -1
                input_map {{ key: "x" value: "IN" }} output_map {{ key: "y" value: "OUT" }} }} ] }}"#
        ))
        .unwrap();
        let step = |_: &str, _: &str| {
            Ok(StepModel {
                config: parse_pbtxt(
                    r#"name: "step" input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
                    output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]"#,
                )
                .unwrap(),
                decoupled,
            })
        };
        let plan = Arc::new(Plan::build(&config, &step).unwrap());
        let handle = ModelHandle::ensemble(Arc::new(config), 1, plan, Default::default());
        table.set(
            name,
            ModelEntry {
                state: ModelState::Ready(BTreeMap::from([(1, handle)])),
                fingerprint: None,
                source: None,
            },
        );
    }

    fn table() -> ModelTable {
        let t = ModelTable::new(false);
        ensemble(&t, "e", false);
        ensemble(&t, "d", true);
        t
    }

    fn request(model: &str, input: &str, params: Vec<(&str, Param)>) -> InferRequest {
        InferRequest {
            model_name: model.into(),
            id: "r1".into(),
            inputs: vec![NamedTensor {
                name: input.into(),
                tensor: Tensor::from_values(vec![4], &[1f32; 4]),
            }],
            parameters: params.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            ..Default::default()
        }
    }

    fn refused(t: &ModelTable, r: InferRequest, entry: Entry, replies: Replies) -> mesh::Error {
        admit(t, r, entry, replies).err().expect("refused")
    }

    #[test]
    fn a_request_is_admitted_with_its_parameters_parsed_once() {
        let t = table();
        let params = vec![
            ("priority", Param::Uint(2)),
            ("timeout", Param::Uint(1500)),
            ("sequence_id", Param::Uint(9)),
            ("sequence_start", Param::Bool(true)),
        ];
        let a = admit(&t, request("e", "IN", params), Entry::Frontend, Replies::One).unwrap();
        assert_eq!((a.model_name(), a.request_id(), a.decoupled()), ("e", "r1", false));
        let controls = &a.work.controls;
        assert_eq!(controls.priority, 2);
        assert_eq!(controls.timeout, Some(std::time::Duration::from_micros(1500)));
        assert_eq!(controls.sequence.id, Some(mesh::params::SequenceId::Int(9)));
        assert!(controls.sequence.start && !controls.sequence.end);
        assert!(a.work.trace.is_none(), "nothing traces");
    }

    #[test]
    fn each_refusal_comes_in_the_order_it_always_did() {
        let t = table();
        let bad = || vec![("timeout", Param::Int(-1))];
        // The parameters first, before the model is even looked up.
        let e = refused(&t, request("nowhere", "IN", bad()), Entry::Frontend, Replies::One);
        assert!(e.message.contains("parameter 'timeout'"), "{e}");
        assert_eq!(e.code, Code::InvalidArgument);
        let e = refused(&t, request("nowhere", "IN", vec![]), Entry::Frontend, Replies::One);
        assert_eq!(e.code, Code::NotFound);
        // A decoupled model asked for one answer is refused before its inputs are looked at.
        let e = refused(&t, request("d", "WRONG", vec![]), Entry::Frontend, Replies::One);
        assert_eq!(e, mesh::validate::needs_stream("d"));
        assert!(admit(&t, request("d", "IN", vec![]), Entry::Frontend, Replies::Stream)
            .unwrap()
            .decoupled());
        // Inputs against the config, counted as the model's failure.
        let failed = || {
            let m = t.resolve("e", "").unwrap();
            m.stats.snapshot().inference_stats.unwrap().fail.unwrap().count
        };
        let before = failed();
        let e = refused(&t, request("e", "WRONG", vec![]), Entry::Frontend, Replies::Stream);
        assert!(e.message.contains("unexpected inference input 'WRONG'"), "{e}");
        assert_eq!(failed(), before + 1);
    }

    #[test]
    fn an_in_process_callers_tensors_are_checked_with_the_rest() {
        let t = table();
        let short = || {
            let mut r = request("e", "IN", vec![]);
            r.inputs[0].tensor.data = r.inputs[0].tensor.data.slice(..12);
            r
        };
        let e = refused(&t, short(), Entry::InProcess, Replies::One);
        assert!(e.message.starts_with("input 'IN' of model 'e'"), "{e}");
        // After the parameters, as the C API always checked them.
        let mut both = short();
        both.parameters.push(("priority".into(), Param::Bool(true)));
        let e = refused(&t, both, Entry::InProcess, Replies::One);
        assert!(e.message.contains("parameter 'priority'"), "{e}");
        // A frontend decoded (and so checked) its tensors already.
        assert!(admit(&t, short(), Entry::Frontend, Replies::One).is_ok());
    }
}
