//! A latency histogram with log-linear buckets (128 per power of two, under 0.4% error), sans IO.

/// Sub-bucket bits: each power of two above 256 is split into 2^7 = 128 equal buckets.
const SUB_BITS: u32 = 7;
/// Values below this are counted exactly, one bucket each.
const EXACT_BELOW: u64 = 1 << (SUB_BITS + 1);

/// Counts of recorded values (nanoseconds, say) in log-linear buckets, plus the exact count, sum,
/// minimum and maximum. A bucket is at most 1/128 of its lower bound wide and a percentile reports
/// its middle, so percentiles are within 0.4% of the true value. Memory grows with the largest
/// value recorded (about 1 KiB per power of two).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Histogram {
    buckets: Vec<u64>,
    count: u64,
    sum: u128,
    min: u64,
    max: u64,
}

/// The bucket a value falls in.
fn index(v: u64) -> usize {
    if v < EXACT_BELOW {
        return v as usize;
    }
    let exp = 63 - v.leading_zeros(); // >= SUB_BITS + 1
    let shift = exp - SUB_BITS; // >= 1
    let sub = (v >> shift) as usize; // in [128, 256)
    ((shift as usize) << SUB_BITS) + sub
}

/// The lowest value of a bucket and its width.
fn bounds(i: usize) -> (u64, u64) {
    if (i as u64) < EXACT_BELOW {
        return (i as u64, 1);
    }
    // i = (shift << SUB_BITS) + sub with sub in [2^SUB_BITS, 2^(SUB_BITS+1)), so i >> SUB_BITS = shift + 1.
    let shift = (i >> SUB_BITS) as u32 - 1;
    let sub = (i as u64) - (u64::from(shift) << SUB_BITS);
    (sub << shift, 1 << shift)
}

impl Histogram {
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts one value.
    pub fn record(&mut self, v: u64) {
        let i = index(v);
        if i >= self.buckets.len() {
            self.buckets.resize(i + 1, 0);
        }
        self.buckets[i] += 1;
        if self.count == 0 || v < self.min {
            self.min = v;
        }
        self.max = self.max.max(v);
        self.count += 1;
        self.sum += u128::from(v);
    }

    /// Adds every value counted by `other`.
    pub fn merge(&mut self, other: &Histogram) {
        if other.count == 0 {
            return;
        }
        if other.buckets.len() > self.buckets.len() {
            self.buckets.resize(other.buckets.len(), 0);
        }
        for (mine, theirs) in self.buckets.iter_mut().zip(&other.buckets) {
            *mine += theirs;
        }
        if self.count == 0 || other.min < self.min {
            self.min = other.min;
        }
        self.max = self.max.max(other.max);
        self.count += other.count;
        self.sum += other.sum;
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// The smallest value recorded; None when empty.
    pub fn min(&self) -> Option<u64> {
        (self.count > 0).then_some(self.min)
    }

    /// The largest value recorded (exact); None when empty.
    pub fn max(&self) -> Option<u64> {
        (self.count > 0).then_some(self.max)
    }

    /// The exact mean; None when empty.
    pub fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum as f64 / self.count as f64)
    }

    /// The value at quantile `q` (0..=1, e.g. 0.99): the middle of the bucket holding the
    /// ceil(q * count)-th smallest value, kept within the exact minimum and maximum. None when empty.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        if self.count == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0u64;
        for (i, &n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                let (low, width) = bounds(i);
                let mid = low + (width - 1) / 2;
                return Some(mid.clamp(self.min, self.max));
            }
        }
        Some(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_narrow() {
        let mut expected_low = 0u64;
        for i in 0..index(u64::MAX) {
            let (low, width) = bounds(i);
            assert_eq!(low, expected_low, "bucket {i}");
            assert_eq!(index(low), i);
            assert_eq!(index(low + width - 1), i);
            if low >= EXACT_BELOW {
                assert!(width * 128 <= low, "bucket {i} too wide: {width} at {low}");
            }
            expected_low = low + width;
        }
        let (low, width) = bounds(index(u64::MAX));
        assert_eq!(low.wrapping_add(width), 0, "the last bucket ends at 2^64");
    }

    #[test]
    fn empty_histogram_has_no_statistics() {
        let h = Histogram::new();
        assert_eq!(
            (h.count(), h.min(), h.max(), h.mean(), h.quantile(0.5)),
            (0, None, None, None, None)
        );
    }

    #[test]
    fn small_values_are_exact() {
        let mut h = Histogram::new();
        for v in 1..=100 {
            h.record(v);
        }
        assert_eq!(h.quantile(0.5), Some(50));
        assert_eq!(h.quantile(0.9), Some(90));
        assert_eq!(h.quantile(0.99), Some(99));
        assert_eq!(h.quantile(1.0), Some(100));
        assert_eq!(h.quantile(0.0), Some(1));
        assert_eq!((h.min(), h.max(), h.mean()), (Some(1), Some(100), Some(50.5)));
    }

    #[test]
    fn percentiles_are_within_half_a_percent() {
        // Latencies from 50 µs to 5 s in ns, with an uneven spread.
        let values: Vec<u64> = (0..100_000u64)
            .map(|i| 50_000 + i * i / 2 + (i * 7919) % 1000)
            .collect();
        let mut sorted = values.clone();
        sorted.sort_unstable();
        let mut h = Histogram::new();
        for &v in &values {
            h.record(v);
        }
        for q in [0.5, 0.9, 0.99, 0.999] {
            let exact = sorted[(q * sorted.len() as f64).ceil() as usize - 1] as f64;
            let got = h.quantile(q).unwrap() as f64;
            assert!((got - exact).abs() / exact < 0.004, "q{q}: {got} vs {exact}");
        }
        assert_eq!(h.max(), sorted.last().copied());
        let mean = values.iter().map(|&v| v as f64).sum::<f64>() / values.len() as f64;
        assert!((h.mean().unwrap() - mean).abs() < 1e-6 * mean);
    }

    #[test]
    fn merging_equals_recording_everything_in_one() {
        let mut a = Histogram::new();
        let mut b = Histogram::new();
        let mut all = Histogram::new();
        for v in 0..5000u64 {
            let x = v * 3_000 + 17;
            if v % 3 == 0 {
                a.record(x)
            } else {
                b.record(x)
            }
            all.record(x);
        }
        b.record(u64::MAX / 2);
        all.record(u64::MAX / 2);
        let mut merged = Histogram::new();
        merged.merge(&a);
        merged.merge(&b);
        merged.merge(&Histogram::new());
        assert_eq!(merged, all);
        assert_eq!(merged.max(), Some(u64::MAX / 2));
        assert_eq!(merged.min(), Some(17));
    }

    #[test]
    fn a_single_value_is_every_percentile() {
        let mut h = Histogram::new();
        h.record(123_456_789);
        for q in [0.0, 0.5, 0.99, 1.0] {
            assert_eq!(h.quantile(q), Some(123_456_789));
        }
    }
}
