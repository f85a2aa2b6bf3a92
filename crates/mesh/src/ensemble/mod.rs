//! Triton ensembles: the step DAG built and validated from `ensemble_scheduling` (sans-IO), which
//! steps are ready as tensors appear, and an executor that drives any `Dispatch`.
mod run;
mod serve;
mod step;
mod stream;

use std::collections::{HashMap, HashSet};

use crate::config::ModelConfig;
use crate::dtype::DataType;
use crate::proto::model_config::SchedulingChoice;

pub use run::run;
pub use serve::{serve, Served};
pub use stream::run_stream;

/// The ensemble's steps, checked against the models they call.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub name: String,
    pub steps: Vec<Step>,
    /// The ensemble's input names (the tensors that exist before any step runs).
    pub inputs: Vec<String>,
    /// The ensemble's output names and the tensors that hold them (the same names).
    pub outputs: Vec<String>,
    /// Whether a step's model is decoupled: the ensemble may then answer any number of times.
    pub decoupled: bool,
    /// How the ensemble's outputs that come from a step on the other side of batching are shaped.
    output_fits: HashMap<String, Fit>,
    /// Which steps read each tensor, for readiness.
    consumers: HashMap<String, Vec<usize>>,
}

/// One step: a call to a model, with its tensors renamed in and out.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub model: String,
    /// Empty: the model's default version.
    pub version: String,
    /// (model input name, ensemble tensor name).
    pub inputs: Vec<(String, String)>,
    /// (model output name, ensemble tensor name).
    pub outputs: Vec<(String, String)>,
    /// The model may answer several times: each answer goes on through the steps after it.
    pub decoupled: bool,
    /// By model input: how a tensor made on the other side of batching is shaped for the model.
    fits: HashMap<String, Fit>,
}

/// How a tensor is shaped where it goes when its producer batches and its consumer does not, or
/// the other way round (Triton's ensemble rule): a batch dimension of 1 is added for a batching
/// consumer whose dims the tensor already has, and removed for a non-batching one whose dims it
/// does not have.
#[derive(Debug, Clone, PartialEq)]
struct Fit {
    /// The consumer's dims, without a batch dimension.
    dims: Vec<i64>,
    /// Whether the consumer batches (the producer does not).
    batching: bool,
}

impl Fit {
    /// The shape the consumer gets for a tensor of `shape`.
    fn apply(&self, shape: &mut Vec<i64>) {
        if self.batching {
            if compatible(&self.dims, shape) {
                shape.insert(0, 1);
            }
        } else if !compatible(&self.dims, shape) && shape.first() == Some(&1) {
            shape.remove(0);
        }
    }
}

/// Shapes a tensor for where it goes: a copy of the handle, sharing the bytes.
fn fitted(tensor: &crate::tensor::Tensor, fit: Option<&Fit>) -> crate::tensor::Tensor {
    let mut t = tensor.clone();
    if let Some(fit) = fit {
        fit.apply(&mut t.shape);
    }
    t
}

/// What a step's model looks like, for checking the wiring; looked up by model name and version.
#[derive(Debug, Clone)]
pub struct StepModel {
    pub config: ModelConfig,
    pub decoupled: bool,
}

/// A tensor's type, dims and full shape: a batching model's (or ensemble's) tensors get a leading
/// -1 in the full shape. A link fits if the dims match, or else the full shapes (Triton's rule): so a
/// non-batching ensemble can feed [16] or [1, 16] to a batching model of dims [-1].
#[derive(Debug, Clone, PartialEq)]
struct TensorSpec {
    dtype: Option<DataType>,
    dims: Vec<i64>,
    shape: Vec<i64>,
    batching: bool,
}

impl TensorSpec {
    /// A config tensor's spec; `max_batch_size` is that of the model (or ensemble) declaring it.
    fn new(data_type: i32, max_batch_size: i32, dims: &[i64]) -> Self {
        let mut shape = Vec::with_capacity(dims.len() + 1);
        if max_batch_size > 0 {
            shape.push(-1);
        }
        shape.extend_from_slice(dims);
        TensorSpec {
            dtype: DataType::from_config(data_type),
            dims: dims.to_vec(),
            shape,
            batching: max_batch_size > 0,
        }
    }

    /// How a tensor from `producer` is shaped for this consumer; None: as it is.
    fn fit_from(&self, producer: &TensorSpec) -> Option<Fit> {
        (producer.batching != self.batching).then(|| Fit {
            dims: self.dims.clone(),
            batching: self.batching,
        })
    }
}

/// A step's input as the plan checks it: the tensor it reads, who reads it and what it takes.
struct Use {
    tensor: String,
    consumer: (String, TensorSpec),
    step: usize,
    input: String,
}

/// Names sorted, each once.
fn sorted_unique(names: impl Iterator<Item = String>) -> Vec<String> {
    let mut names: Vec<String> = names.collect();
    names.sort();
    names.dedup();
    names
}

/// A step's map as (model tensor, ensemble tensor) pairs in a stable order.
fn sorted_pairs(map: &std::collections::HashMap<String, String>) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> = map.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    pairs.sort();
    pairs
}

fn compatible(a: &[i64], b: &[i64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(&x, &y)| x == y || x < 0 || y < 0)
}

/// Checks that what a tensor's producer gives is what its consumer takes.
fn check_link(tensor: &str, producer: &(String, TensorSpec), consumer: &(String, TensorSpec)) -> Result<(), String> {
    let ((who_p, p), (who_c, c)) = (producer, consumer);
    if let (Some(dp), Some(dc)) = (p.dtype, c.dtype) {
        if dp != dc {
            return Err(format!(
                "tensor '{tensor}' is {} from {who_p} but {who_c} takes {}",
                dp.wire_name(),
                dc.wire_name()
            ));
        }
    }
    if !compatible(&p.dims, &c.dims) && !compatible(&p.shape, &c.shape) {
        return Err(format!(
            "tensor '{tensor}' has shape {:?} from {who_p} but {who_c} takes {:?}",
            p.shape, c.shape
        ));
    }
    Ok(())
}

impl Plan {
    /// Builds the plan from an ensemble config; `lookup(model, version)` gives a step's model or why
    /// it is not available. Every error names the step, model or tensor at fault.
    pub fn build(
        config: &ModelConfig,
        lookup: &dyn Fn(&str, &str) -> Result<StepModel, String>,
    ) -> Result<Plan, String> {
        let Some(SchedulingChoice::EnsembleScheduling(scheduling)) = &config.scheduling_choice else {
            return Err("an ensemble needs ensemble_scheduling { step [ ... ] }".into());
        };
        if scheduling.step.is_empty() {
            return Err("ensemble_scheduling has no steps".into());
        }
        if !config.instance_group.is_empty() {
            return Err("ensembles take no instance_group: their steps run on the composing models' instances".into());
        }
        let mbs = config.max_batch_size;
        // tensor -> (who produces it, what it is)
        let mut produced: HashMap<String, (String, TensorSpec)> = HashMap::new();
        for i in &config.input {
            let spec = TensorSpec::new(i.data_type, mbs, &i.dims);
            produced.insert(i.name.clone(), ("the ensemble's input".into(), spec));
        }
        let mut steps = Vec::with_capacity(scheduling.step.len());
        let mut consumed: Vec<Use> = Vec::new();
        for (n, s) in scheduling.step.iter().enumerate() {
            let version = if s.model_version < 0 {
                String::new()
            } else {
                s.model_version.to_string()
            };
            let who = format!("step {n} (model '{}')", s.model_name);
            let model = lookup(&s.model_name, &version).map_err(|e| format!("{who}: {e}"))?;
            let m = &model.config;
            if mbs > 0 && (m.max_batch_size == 0 || m.max_batch_size < mbs) {
                return Err(format!(
                    "{who}: the ensemble's max_batch_size {mbs} exceeds the model's {}",
                    m.max_batch_size
                ));
            }
            let inputs = sorted_pairs(&s.input_map);
            let outputs = sorted_pairs(&s.output_map);
            for (model_input, tensor) in &inputs {
                let i = m.input.iter().find(|i| &i.name == model_input).ok_or_else(|| {
                    format!("{who}: input_map names '{model_input}', which is not an input of the model")
                })?;
                let spec = TensorSpec::new(i.data_type, m.max_batch_size, &i.dims);
                consumed.push(Use {
                    tensor: tensor.clone(),
                    consumer: (format!("{who} input '{model_input}'"), spec),
                    step: n,
                    input: model_input.clone(),
                });
            }
            if let Some(missing) = m
                .input
                .iter()
                .find(|i| !i.optional && !inputs.iter().any(|(name, _)| name == &i.name))
            {
                return Err(format!("{who}: its input '{}' is not in input_map", missing.name));
            }
            for (model_output, tensor) in &outputs {
                let o = m.output.iter().find(|o| &o.name == model_output).ok_or_else(|| {
                    format!("{who}: output_map names '{model_output}', which is not an output of the model")
                })?;
                let spec = TensorSpec::new(o.data_type, m.max_batch_size, &o.dims);
                if let Some((first, _)) = produced.get(tensor) {
                    return Err(format!("tensor '{tensor}' is produced twice: by {first} and by {who}"));
                }
                produced.insert(tensor.clone(), (who.clone(), spec));
            }
            steps.push(Step {
                model: s.model_name.clone(),
                version,
                inputs,
                outputs,
                decoupled: model.decoupled,
                fits: HashMap::new(),
            });
        }
        for Use {
            tensor,
            consumer,
            step: n,
            input: model_input,
        } in consumed
        {
            let producer = produced
                .get(&tensor)
                .ok_or_else(|| format!("tensor '{tensor}' used by {} is never produced", consumer.0))?;
            check_link(&tensor, producer, &consumer)?;
            if let Some(fit) = consumer.1.fit_from(&producer.1) {
                steps[n].fits.insert(model_input, fit);
            }
        }
        let mut output_fits = HashMap::new();
        for o in &config.output {
            let producer = produced
                .get(&o.name)
                .ok_or_else(|| format!("ensemble output '{}' is produced by no step", o.name))?;
            let spec = TensorSpec::new(o.data_type, mbs, &o.dims);
            if let Some(fit) = spec.fit_from(&producer.1) {
                output_fits.insert(o.name.clone(), fit);
            }
            check_link(&o.name, producer, &("the ensemble's output".into(), spec))?;
        }
        let mut consumers: HashMap<String, Vec<usize>> = HashMap::new();
        for (n, s) in steps.iter().enumerate() {
            for (_, tensor) in &s.inputs {
                consumers.entry(tensor.clone()).or_default().push(n);
            }
        }
        let plan = Plan {
            name: config.name.clone(),
            decoupled: steps.iter().any(|s| s.decoupled),
            output_fits,
            steps,
            inputs: config.input.iter().map(|i| i.name.clone()).collect(),
            outputs: config.output.iter().map(|o| o.name.clone()).collect(),
            consumers,
        };
        plan.check_acyclic()?;
        Ok(plan)
    }

    /// Every step must become ready when all goes well; the ones that never do form a cycle.
    fn check_acyclic(&self) -> Result<(), String> {
        let mut progress = Progress::new(self, self.inputs.iter().map(String::as_str));
        let mut ready = progress.take_ready();
        while let Some(step) = ready.pop() {
            ready.extend(progress.step_done(self, step));
        }
        let stuck: Vec<String> = (0..self.steps.len())
            .filter(|&n| !progress.started[n])
            .map(|n| format!("step {n} (model '{}')", self.steps[n].model))
            .collect();
        if stuck.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "the steps form a cycle: {} wait on each other",
                stuck.join(", ")
            ))
        }
    }

    /// The models the ensemble calls, for loading them first and for `unload_dependents`.
    pub fn models(&self) -> Vec<String> {
        sorted_unique(self.steps.iter().map(|s| s.model.clone()))
    }
}

/// The models an ensemble config names in its steps (before it can be planned).
pub fn step_models(config: &ModelConfig) -> Vec<String> {
    match &config.scheduling_choice {
        Some(SchedulingChoice::EnsembleScheduling(s)) => sorted_unique(s.step.iter().map(|s| s.model_name.clone())),
        _ => Vec::new(),
    }
}

/// One request's way through the plan: which tensors exist and which steps may start. Sans-IO.
#[derive(Debug, Clone)]
pub struct Progress {
    /// Inputs each step still waits for.
    waiting: Vec<usize>,
    started: Vec<bool>,
    available: HashSet<String>,
}

impl Progress {
    /// Starts with the tensors that exist before any step runs (the ensemble's inputs).
    pub fn new<'a>(plan: &Plan, present: impl IntoIterator<Item = &'a str>) -> Self {
        let mut p = Progress {
            waiting: plan.steps.iter().map(|s| s.inputs.len()).collect(),
            started: vec![false; plan.steps.len()],
            available: HashSet::new(),
        };
        for t in present {
            p.arrive(plan, t);
        }
        p
    }

    fn arrive(&mut self, plan: &Plan, tensor: &str) {
        if self.available.insert(tensor.to_string()) {
            for &n in plan.consumers.get(tensor).into_iter().flatten() {
                self.waiting[n] -= 1;
            }
        }
    }

    /// Steps whose inputs all exist and that have not started; marks them started.
    pub fn take_ready(&mut self) -> Vec<usize> {
        let ready: Vec<usize> = (0..self.waiting.len())
            .filter(|&n| self.waiting[n] == 0 && !self.started[n])
            .collect();
        for &n in &ready {
            self.started[n] = true;
        }
        ready
    }

    /// Records a finished step's outputs; returns the steps that became ready.
    pub fn step_done(&mut self, plan: &Plan, step: usize) -> Vec<usize> {
        for (_, tensor) in &plan.steps[step].outputs {
            self.arrive(plan, tensor);
        }
        self.take_ready()
    }

    /// Whether every step has started (once none runs, the request is complete).
    pub fn all_started(&self) -> bool {
        self.started.iter().all(|&s| s)
    }
}

#[cfg(test)]
mod tests;
