//! Backends run a model version's computation; the instance seam owns one and feeds it requests.
pub mod onnx;
mod ort_values;

use std::time::Duration;

use mesh::{NamedTensor, Result};

/// Time spent in each phase of one execution, for statistics and metrics.
#[derive(Debug, Default, Clone, Copy)]
pub struct Timings {
    pub input: Duration,
    pub infer: Duration,
    pub output: Duration,
}

/// One loaded model session; `execute` runs on the instance's own thread.
pub trait Backend: Send {
    /// Runs the inputs and returns the outputs named in `outputs` (all config outputs when empty).
    fn execute(&mut self, inputs: &[NamedTensor], outputs: &[String]) -> Result<(Vec<NamedTensor>, Timings)>;
}
