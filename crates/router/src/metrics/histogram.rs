//! A latency histogram of bounded size: four buckets per doubling of the latency in
//! microseconds, read back within 12.5%; the console's traffic history and a rollout's guard
//! read their p50 and p99 from it.
use std::time::Duration;

/// Histogram buckets: four per doubling of the latency in microseconds, up to 2^41 µs (25 days);
/// a quantile is read back as its bucket's midpoint, within 12.5% of the true value.
pub(crate) const BUCKETS: usize = 42 * 4;

/// A latency histogram (of one interval, one step).
#[derive(Clone)]
pub struct Histogram {
    counts: Box<[u32; BUCKETS]>,
    total: u32,
}

impl Histogram {
    pub fn new() -> Self {
        Histogram {
            counts: Box::new([0; BUCKETS]),
            total: 0,
        }
    }

    pub(crate) fn bucket(us: u64) -> usize {
        let v = us.max(1);
        let log = 63 - v.leading_zeros() as usize;
        // The two bits below the leading one.
        let sub = if log >= 2 {
            (v >> (log - 2)) & 3
        } else {
            (v << (2 - log)) & 3
        } as usize;
        (log * 4 + sub).min(BUCKETS - 1)
    }

    /// The middle of bucket `b`, in microseconds.
    pub(crate) fn value(b: usize) -> u32 {
        let (log, sub) = (b / 4, (b % 4) as u64);
        // The bucket holds [(4 + sub) << log, (5 + sub) << log) / 4.
        let low = (4 + sub) << log;
        let high = (5 + sub) << log;
        ((low + high) / 8).min(u64::from(u32::MAX)) as u32
    }

    pub fn add(&mut self, took: Duration) {
        let b = Self::bucket(took.as_micros().min(u128::from(u64::MAX)) as u64);
        self.counts[b] = self.counts[b].saturating_add(1);
        self.total = self.total.saturating_add(1);
    }

    /// The value below which a fraction `q` of the requests fall (0 with none).
    pub fn quantile(&self, q: f64) -> u32 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q * f64::from(self.total)).ceil() as u64).max(1);
        let mut seen = 0u64;
        for (b, &n) in self.counts.iter().enumerate() {
            seen += u64::from(n);
            if seen >= rank {
                return Self::value(b);
            }
        }
        Self::value(BUCKETS - 1)
    }

    /// Adds `other`'s counts to these.
    pub fn merge(&mut self, other: &Histogram) {
        for (mine, theirs) in self.counts.iter_mut().zip(other.counts.iter()) {
            *mine = mine.saturating_add(*theirs);
        }
        self.total = self.total.saturating_add(other.total);
    }

    /// The buckets that counted something, as (bucket, count).
    pub fn sparse(&self) -> Vec<(usize, u32)> {
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(b, n)| (b, *n))
            .collect()
    }

    /// A histogram of (bucket, count) pairs; None when a bucket is out of range.
    pub fn from_sparse(pairs: &[(usize, u32)]) -> Option<Histogram> {
        let mut h = Histogram::new();
        for &(b, n) in pairs {
            let slot = h.counts.get_mut(b)?;
            *slot = slot.saturating_add(n);
            h.total = h.total.saturating_add(n);
        }
        Some(h)
    }

    /// How many latencies it holds.
    pub fn total(&self) -> u32 {
        self.total
    }

    pub fn clear(&mut self) {
        self.counts.fill(0);
        self.total = 0;
    }
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram::new()
    }
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Histogram({} requests)", self.total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_ordered_and_read_back_within_an_eighth() {
        let mut last = 0;
        for us in [1u64, 2, 3, 4, 5, 7, 8, 9, 15, 16, 100, 999, 1000, 12_345, 1 << 30] {
            let b = Histogram::bucket(us);
            assert!(b >= last, "{us}");
            last = b;
            let v = f64::from(Histogram::value(b));
            assert!(
                (v - us as f64).abs() <= us as f64 / 8.0 + 1.0,
                "{us} -> bucket {b} reads {v}"
            );
        }
        assert_eq!(Histogram::bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles_read_the_requests_below_them() {
        let mut h = Histogram::default();
        assert_eq!(h.quantile(0.99), 0, "no request");
        for ms in 1..=100u64 {
            h.add(Duration::from_millis(ms));
        }
        let p99 = f64::from(h.quantile(0.99));
        assert!((p99 - 99_000.0).abs() <= 99_000.0 / 8.0, "{p99}");
        h.clear();
        assert_eq!(h.quantile(0.5), 0);
    }
}
