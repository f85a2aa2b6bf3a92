//! Shadow requests of a rollout, as plain decisions: which of the serving version's requests are
//! also sent to the candidate (its `shadow` share), how a shadow's answer compares with the answer
//! the client got (mismatched or not, the largest absolute difference of each output), and one
//! model's results on a router, bounded. The candidate's shadow answers are never returned.
use std::collections::BTreeMap;
use std::time::Duration;

use mesh::NamedTensor;
use serde_json::{json, Value};

use super::split::BUCKETS;
use super::Window;

/// The most outputs whose differences a model's results keep (a model has few; a candidate that
/// answers with ever new names cannot grow the map).
const MAX_OUTPUTS: usize = 64;

/// Whether a request drawn `draw` (any number) is shadowed at `share` percent.
pub fn shadowed(draw: u32, share: u8) -> bool {
    draw % BUCKETS < u32::from(share.min(100)) * (BUCKETS / 100)
}

/// How a shadow's outputs compare with the client's answer: the largest absolute difference of
/// each output the client got (infinite where the shadow lacks it or it differs in type, shape
/// or, for BYTES, content; a NaN against a number too), and whether any differs at all.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    pub diffs: Vec<(String, f64)>,
    pub mismatched: bool,
}

/// Compares the candidate's `shadow` outputs with the `real` ones the client got.
pub fn compare(real: &[NamedTensor], shadow: &[NamedTensor]) -> Comparison {
    let mut diffs = Vec::with_capacity(real.len());
    for r in real {
        let diff = match shadow.iter().find(|s| s.name == r.name) {
            None => f64::INFINITY,
            Some(s) if s.tensor.dtype != r.tensor.dtype || s.tensor.shape != r.tensor.shape => f64::INFINITY,
            Some(s) => match r.tensor.max_abs_diff(&s.tensor) {
                Some(d) => d,
                None if r.tensor.data == s.tensor.data => 0.0, // BYTES, equal
                None => f64::INFINITY,
            },
        };
        diffs.push((r.name.clone(), diff));
    }
    let extra = shadow.iter().any(|s| !real.iter().any(|r| r.name == s.name));
    let mismatched = extra || diffs.iter().any(|(_, d)| *d != 0.0);
    Comparison { diffs, mismatched }
}

/// One model's shadow results on this router since its rollout started.
#[derive(Debug, Clone, Default)]
pub struct Results {
    /// The rollout they belong to (serving, candidate, when it started).
    pub rollout: (String, String, u64),
    pub compared: u64,
    pub mismatched: u64,
    /// Shadows the candidate failed (or that did not answer in time).
    pub failed: u64,
    /// Shadows not sent: no room in the shadow budget, or no ready replica of the candidate.
    pub dropped: u64,
    /// The largest absolute difference seen for each output.
    pub largest: BTreeMap<String, f64>,
    /// Latency of the client's answers that were shadowed, and of their shadows.
    pub serving: Window,
    pub candidate: Window,
}

impl Results {
    pub fn new((serving, candidate, started): (&str, &str, u64)) -> Results {
        Results {
            rollout: (serving.to_string(), candidate.to_string(), started),
            ..Results::default()
        }
    }

    /// A shadow answered: `real` took `took`, the shadow `shadow_took`.
    pub fn compared(&mut self, c: &Comparison, took: Duration, shadow_took: Duration) {
        self.compared += 1;
        self.mismatched += u64::from(c.mismatched);
        for (name, diff) in &c.diffs {
            if let Some(d) = self.largest.get_mut(name) {
                *d = d.max(*diff);
            } else if self.largest.len() < MAX_OUTPUTS {
                self.largest.insert(name.clone(), *diff);
            }
        }
        self.serving.record(true, took);
        self.candidate.record(true, shadow_took);
    }

    pub fn failed(&mut self, shadow_took: Duration) {
        self.failed += 1;
        self.candidate.record(false, shadow_took);
    }

    /// What the rollout's status shows of them.
    pub fn status(&self) -> Value {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let largest: serde_json::Map<String, Value> = self
            .largest
            .iter()
            // JSON has no infinity: an output that never matched in kind says so in words.
            .map(|(k, d)| (k.clone(), if d.is_finite() { json!(d) } else { json!("differs") }))
            .collect();
        json!({
            "compared": self.compared,
            "mismatched": self.mismatched,
            "mismatch_rate": if self.compared == 0 { 0.0 } else { self.mismatched as f64 / self.compared as f64 },
            "failed": self.failed,
            "dropped": self.dropped,
            "largest_abs_difference": largest,
            "serving_p99_ms": ms(self.serving.p99()),
            "candidate_p99_ms": ms(self.candidate.p99()),
        })
    }
}

#[cfg(test)]
mod tests {
    use mesh::Tensor;

    use super::*;

    fn out(name: &str, values: &[f32]) -> NamedTensor {
        NamedTensor {
            name: name.into(),
            tensor: Tensor::from_values(vec![values.len() as i64], values),
        }
    }

    #[test]
    fn a_share_of_requests_is_shadowed() {
        let n = (0..BUCKETS).filter(|d| shadowed(*d, 10)).count();
        assert_eq!(n as u32, BUCKETS / 10);
        assert!(!(0..BUCKETS).any(|d| shadowed(d, 0)));
        assert!((0..BUCKETS).all(|d| shadowed(d, 100)));
    }

    #[test]
    fn outputs_are_compared_by_their_largest_difference() {
        let real = [out("Y", &[1.0, 2.0, 3.0]), out("Z", &[0.0])];
        let same = compare(&real, &[out("Z", &[0.0]), out("Y", &[1.0, 2.0, 3.0])]);
        assert_eq!(
            same,
            Comparison {
                diffs: vec![("Y".into(), 0.0), ("Z".into(), 0.0)],
                mismatched: false
            }
        );
        let off = compare(&real, &[out("Y", &[1.0, 2.5, 2.0]), out("Z", &[0.0])]);
        assert_eq!((off.diffs[0].1, off.mismatched), (1.0, true));
        let missing = compare(&real, &[out("Y", &[1.0, 2.0, 3.0])]);
        assert_eq!(missing.diffs[1].1, f64::INFINITY);
        let reshaped = compare(&real, &[out("Y", &[1.0, 2.0]), out("Z", &[0.0])]);
        assert_eq!(reshaped.diffs[0].1, f64::INFINITY);
        let extra = compare(&real[..1], &[out("Y", &[1.0, 2.0, 3.0]), out("W", &[1.0])]);
        assert!(extra.mismatched, "an output the client did not get");
        let nan = compare(&[out("Y", &[f32::NAN, 1.0])], &[out("Y", &[f32::NAN, f32::NAN])]);
        assert_eq!(nan.diffs[0].1, f64::INFINITY);
        assert_eq!(
            compare(&[out("Y", &[f32::NAN])], &[out("Y", &[f32::NAN])]).diffs[0].1,
            0.0
        );
        let text = |s: &[u8]| NamedTensor {
            name: "T".into(),
            tensor: Tensor::from_bytes_elements(vec![1], [s]),
        };
        assert!(!compare(&[text(b"a")], &[text(b"a")]).mismatched);
        assert_eq!(compare(&[text(b"a")], &[text(b"b")]).diffs[0].1, f64::INFINITY);
    }

    #[test]
    fn results_keep_the_largest_difference_and_are_bounded() {
        let mut r = Results::new(("1", "2", 7));
        let ms = Duration::from_millis(1);
        r.compared(&compare(&[out("Y", &[1.0])], &[out("Y", &[1.5])]), ms, 2 * ms);
        r.compared(&compare(&[out("Y", &[1.0])], &[out("Y", &[1.25])]), ms, 2 * ms);
        r.compared(&compare(&[out("Y", &[1.0])], &[out("Y", &[1.0])]), ms, 2 * ms);
        r.failed(ms);
        r.dropped += 1;
        let s = r.status();
        assert_eq!(
            (
                s["compared"].clone(),
                s["mismatched"].clone(),
                s["failed"].clone(),
                s["dropped"].clone()
            ),
            (json!(3), json!(2), json!(1), json!(1))
        );
        assert_eq!(s["largest_abs_difference"]["Y"], 0.5);
        for i in 0..200 {
            r.compared(&compare(&[out(&format!("o{i}"), &[1.0])], &[]), ms, ms);
        }
        assert_eq!(r.largest.len(), MAX_OUTPUTS);
        assert_eq!(r.status()["largest_abs_difference"]["o0"], "differs");
    }
}
