//! A model's `sequence_batching` read once at load: the control inputs the node adds to every
//! request of a sequence (START, END, READY, CORRID) and the implicit state it carries between them.
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use mesh::config::ModelConfig;
use mesh::proto::model_config::SchedulingChoice;
use mesh::proto::model_sequence_batching::{control::Kind, initial_state::StateData, Control, StrategyChoice};
use mesh::proto::ModelSequenceBatching;
use mesh::{DataType, Tensor};

/// Triton's default `max_sequence_idle_microseconds`.
const DEFAULT_IDLE: Duration = Duration::from_secs(1);

/// What one control input carries.
#[derive(Debug, Clone, PartialEq)]
pub enum ControlKind {
    /// START, END or READY: the false and true values, little-endian, of `dtype`.
    Flag {
        kind: Kind,
        dtype: DataType,
        values: [Bytes; 2],
    },
    /// The sequence's correlation id, as `dtype` (an integer type or BYTES).
    CorrId { dtype: DataType },
}

#[derive(Debug, Clone, PartialEq)]
pub struct ControlSpec {
    pub input: String,
    pub kind: ControlKind,
}

/// One implicit state: fed as `input` to each request, taken from `output` of its answer.
#[derive(Debug, Clone, PartialEq)]
pub struct StateSpec {
    pub input: String,
    pub output: String,
    /// The state of one row at the start of a sequence (the model's batch dim excluded).
    pub initial: Tensor,
}

/// A sequence model's setup.
#[derive(Debug, Clone, PartialEq)]
pub struct SequenceSetup {
    pub idle: Duration,
    pub controls: Vec<ControlSpec>,
    pub states: Vec<StateSpec>,
    /// `iterative_sequence: true`: a request without a correlation ID is a sequence of its own
    /// (START and END, an id of the node's), as Triton's iterative sequencer makes it.
    pub iterative: bool,
    /// Sequences one instance holds at once (Triton's slots: `max_batch_size`, at least 1, for the
    /// direct strategy; `max_candidate_sequences` for oldest); 0: no bound. A START that finds
    /// every instance full waits for a sequence to end (the backlog).
    pub slots: usize,
}

/// The strategy's batching delay and preferred batch sizes (`direct` or `oldest`; none: direct),
/// for the instance batcher, which forms batches of requests from different sequences. Direct
/// waits (up to its delay) only for `minimum_slot_utilization` of the `max_batch_size` slots to
/// have a request, as Triton's: at the default 0 a batch goes as soon as one slot has one.
pub fn strategy(sb: &ModelSequenceBatching, max_batch_size: usize) -> (Duration, Vec<usize>) {
    match &sb.strategy_choice {
        Some(StrategyChoice::Oldest(o)) => (
            Duration::from_micros(o.max_queue_delay_microseconds),
            o.preferred_batch_size
                .iter()
                .filter_map(|&s| usize::try_from(s).ok())
                .collect(),
        ),
        Some(StrategyChoice::Direct(d)) => {
            let utilization = f64::from(d.minimum_slot_utilization);
            if utilization <= 0.0 || max_batch_size == 0 {
                return (Duration::ZERO, Vec::new());
            }
            let slots = (utilization.min(1.0) * max_batch_size as f64).ceil().max(1.0) as usize;
            let delay = Duration::from_micros(d.max_queue_delay_microseconds);
            (delay, (slots..=max_batch_size).collect())
        }
        None => (Duration::ZERO, Vec::new()),
    }
}

fn flag_values(model: &str, input: &str, c: &Control) -> Result<(DataType, [Bytes; 2]), String> {
    let pair = |n: usize| -> Result<(), String> {
        if n == 2 {
            Ok(())
        } else {
            Err(format!(
                "model '{model}': sequence control input '{input}' needs exactly two false/true values, got {n}"
            ))
        }
    };
    let le = |v: Vec<u8>| Bytes::from(v);
    match (c.int32_false_true.len(), c.fp32_false_true.len(), c.bool_false_true.len()) {
        (n, 0, 0) if n > 0 => {
            pair(n)?;
            let v = &c.int32_false_true;
            Ok((DataType::Int32, [le(v[0].to_le_bytes().to_vec()), le(v[1].to_le_bytes().to_vec())]))
        }
        (0, n, 0) if n > 0 => {
            pair(n)?;
            let v = &c.fp32_false_true;
            Ok((DataType::Fp32, [le(v[0].to_le_bytes().to_vec()), le(v[1].to_le_bytes().to_vec())]))
        }
        (0, 0, n) if n > 0 => {
            pair(n)?;
            let v = &c.bool_false_true;
            Ok((DataType::Bool, [le(vec![v[0] as u8]), le(vec![v[1] as u8])]))
        }
        _ => Err(format!(
            "model '{model}': sequence control input '{input}' must give one of int32_false_true, fp32_false_true or bool_false_true"
        )),
    }
}

fn initial_state(model: &str, dir: &Path, s: &mesh::proto::model_sequence_batching::State) -> Result<Tensor, String> {
    let named = |what: String| format!("model '{model}': state '{}': {what}", s.input_name);
    let dtype = DataType::from_config(s.data_type).ok_or_else(|| named("has no valid data_type".into()))?;
    let (dims, data) = match s.initial_state.first() {
        None => (s.dims.clone(), None),
        Some(init) => {
            let data = match &init.state_data {
                Some(StateData::DataFile(file)) => {
                    let path = dir.join("initial_state").join(file);
                    Some(std::fs::read(&path).map_err(|e| named(format!("cannot read {}: {e}", path.display())))?)
                }
                Some(StateData::ZeroData(_)) | None => None,
            };
            (init.dims.clone(), data)
        }
    };
    if dims.iter().any(|&d| d < 0) {
        return Err(named(format!(
            "dims {dims:?} are variable; give initial_state with fixed dims"
        )));
    }
    let size = mesh::tensor::byte_size(dtype, &dims)
        .map_err(|e| named(e.to_string()))?
        .ok_or_else(|| named("a BYTES state needs an initial_state data_file".into()));
    let data = match (data, size) {
        (Some(bytes), _) => Bytes::from(bytes),
        (None, Ok(n)) => Bytes::from(vec![0u8; n]),
        (None, Err(e)) => return Err(e),
    };
    Tensor::new(dtype, dims, data).map_err(|e| named(format!("initial state: {e}")))
}

impl SequenceSetup {
    /// The setup of a model with `sequence_batching`, None for other models.
    pub fn from_config(config: &ModelConfig, dir: &Path) -> Result<Option<SequenceSetup>, String> {
        let Some(SchedulingChoice::SequenceBatching(sb)) = &config.scheduling_choice else {
            return Ok(None);
        };
        let model = &config.name;
        let mut controls = Vec::new();
        for ci in &sb.control_input {
            let [c] = &ci.control[..] else {
                return Err(format!(
                    "model '{model}': sequence control input '{}' must have exactly one control",
                    ci.name
                ));
            };
            let kind =
                Kind::try_from(c.kind).map_err(|_| format!("model '{model}': unknown control kind {}", c.kind))?;
            let kind = match kind {
                Kind::ControlSequenceCorrid => {
                    let dtype = DataType::from_config(c.data_type)
                        .filter(|d| {
                            matches!(
                                d,
                                DataType::Uint64 | DataType::Int64 | DataType::Uint32 | DataType::Int32 | DataType::Bytes
                            )
                        })
                        .ok_or_else(|| {
                            format!(
                                "model '{model}': CONTROL_SEQUENCE_CORRID input '{}' needs data_type TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING",
                                ci.name
                            )
                        })?;
                    ControlKind::CorrId { dtype }
                }
                flag => {
                    let (dtype, values) = flag_values(model, &ci.name, c)?;
                    ControlKind::Flag {
                        kind: flag,
                        dtype,
                        values,
                    }
                }
            };
            controls.push(ControlSpec {
                input: ci.name.clone(),
                kind,
            });
        }
        let states = sb
            .state
            .iter()
            .map(|s| {
                Ok(StateSpec {
                    input: s.input_name.clone(),
                    output: s.output_name.clone(),
                    initial: initial_state(model, dir, s)?,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let idle = match sb.max_sequence_idle_microseconds {
            0 => DEFAULT_IDLE,
            us => Duration::from_micros(us),
        };
        let slots = match &sb.strategy_choice {
            Some(StrategyChoice::Oldest(o)) => usize::try_from(o.max_candidate_sequences).unwrap_or(0),
            _ => usize::try_from(config.max_batch_size.max(1)).unwrap_or(1),
        };
        Ok(Some(SequenceSetup {
            idle,
            controls,
            states,
            iterative: sb.iterative_sequence,
            slots,
        }))
    }

    /// The input names the node supplies (controls and states), which config.pbtxt does not list.
    pub fn supplied_inputs(config: &ModelConfig) -> Vec<String> {
        let Some(SchedulingChoice::SequenceBatching(sb)) = &config.scheduling_choice else {
            return Vec::new();
        };
        let controls = sb.control_input.iter().map(|c| c.name.clone());
        controls.chain(sb.state.iter().map(|s| s.input_name.clone())).collect()
    }

    /// The state outputs (name, dims of one row), which config.pbtxt does not list either.
    pub fn state_outputs(config: &ModelConfig) -> Vec<(String, Vec<i64>)> {
        let Some(SchedulingChoice::SequenceBatching(sb)) = &config.scheduling_choice else {
            return Vec::new();
        };
        sb.state
            .iter()
            .map(|s| (s.output_name.clone(), s.dims.clone()))
            .collect()
    }
}
