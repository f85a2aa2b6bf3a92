//! Whether a wait for the Python stub polls before it sleeps: only while polls keep catching the
//! answer in time. Sans-IO: the caller polls and reports what the poll got.
use std::time::Duration;

/// Decides, wait by wait, whether to poll for up to the configured time before sleeping.
///
/// A poll that catches the answer saves a wake-up (35-45 µs of latency on a VM); one that misses
/// burns its whole budget of CPU and then sleeps anyway. On a host whose cores are all busy the
/// poller also takes the core the stub needs, so its polls keep missing. The policy therefore
/// keeps a score, like a branch predictor: a catch adds one, a miss takes three off, and polls
/// go on while the score stays in the upper half, which holds over time while more than three
/// polls in four catch. Below it, every `PROBE_EVERY`th wait still polls, and a probe that
/// catches starts polls again, so a host that has cores to spare again is noticed.
#[derive(Debug, Clone)]
pub struct SpinPolicy {
    budget: Duration,
    score: u8,
    since_probe: u32,
    /// The poll under way is a probe.
    probing: bool,
}

impl SpinPolicy {
    const MAX: u8 = 12;
    const THRESHOLD: u8 = 6;
    const CATCH: u8 = 1;
    const MISS: u8 = 3;
    /// While polls do not pay, one wait in this many polls anyway.
    pub const PROBE_EVERY: u32 = 32;

    /// Polls of up to `budget` (zero: never poll); it starts by polling.
    pub fn new(budget: Duration) -> Self {
        SpinPolicy {
            budget,
            score: Self::MAX,
            since_probe: 0,
            probing: false,
        }
    }

    /// How long the next wait polls before it sleeps (zero: it sleeps at once). A wait given a
    /// non-zero time reports what its poll got with `record`.
    pub fn next(&mut self) -> Duration {
        if self.budget.is_zero() {
            return Duration::ZERO;
        }
        if self.score >= Self::THRESHOLD {
            return self.budget;
        }
        self.since_probe += 1;
        if self.since_probe >= Self::PROBE_EVERY {
            self.since_probe = 0;
            self.probing = true;
            return self.budget;
        }
        Duration::ZERO
    }

    /// What a poll got: whether the answer arrived within its budget.
    pub fn record(&mut self, caught: bool) {
        let probe = std::mem::take(&mut self.probing);
        self.score = if caught && probe {
            Self::THRESHOLD
        } else if caught {
            (self.score + Self::CATCH).min(Self::MAX)
        } else {
            self.score.saturating_sub(Self::MISS)
        };
    }

    /// Whether waits poll now.
    #[cfg(test)]
    fn polling(&self) -> bool {
        !self.budget.is_zero() && self.score >= Self::THRESHOLD
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUDGET: Duration = Duration::from_micros(100);

    /// Runs `waits` waits; the `k`th poll among them catches when `catches(k)` says so. Returns
    /// how many polled.
    fn run(p: &mut SpinPolicy, waits: usize, catches: impl Fn(usize) -> bool) -> usize {
        let mut polled = 0;
        for _ in 0..waits {
            if !p.next().is_zero() {
                p.record(catches(polled));
                polled += 1;
            }
        }
        polled
    }

    #[test]
    fn polls_while_they_catch() {
        let mut p = SpinPolicy::new(BUDGET);
        assert_eq!(run(&mut p, 1000, |_| true), 1000);
        assert!(p.polling());
        // Nine catches in ten pay: polls go on.
        assert_eq!(run(&mut p, 1000, |k| k % 10 != 0), 1000);
        assert!(p.polling());
    }

    #[test]
    fn stops_after_a_few_misses_and_then_only_probes() {
        let mut p = SpinPolicy::new(BUDGET);
        assert_eq!(
            run(&mut p, 3, |_| false),
            3,
            "two misses are tolerated, the third stops polls"
        );
        assert!(!p.polling());
        let polled = run(&mut p, 3200, |_| false);
        assert_eq!(polled, 3200 / SpinPolicy::PROBE_EVERY as usize);
    }

    #[test]
    fn half_the_polls_catching_is_not_enough() {
        let mut p = SpinPolicy::new(BUDGET);
        let polled = run(&mut p, 3200, |k| k % 2 == 0);
        assert!(polled < 3200 / 8, "polled {polled} of 3200");
    }

    #[test]
    fn a_host_with_cores_to_spare_again_is_noticed_by_a_probe() {
        let mut p = SpinPolicy::new(BUDGET);
        run(&mut p, 100, |_| false);
        assert!(!p.polling());
        // Polls catch again: the next probe, within one interval, starts polls, and they go on.
        let waited = (1..=SpinPolicy::PROBE_EVERY).find(|_| run(&mut p, 1, |_| true) == 1);
        assert!(waited.is_some());
        assert!(p.polling());
        assert_eq!(run(&mut p, 100, |_| true), 100);
        // On a busy host where every probe is lucky, each costs one more poll, which misses,
        // before polls stop again.
        run(&mut p, 100, |_| false);
        let probes = 3200 / SpinPolicy::PROBE_EVERY as usize;
        let polled = run(&mut p, 3200, |k| k % 2 == 0);
        assert!(polled > probes && polled <= 2 * probes, "polled {polled}");
    }

    /// What the policy guarantees whatever the timing, which the node's tests read off its
    /// `mesh_python_stub_waits_total` counts: over `waits` waits in which `caught` polls caught the
    /// answer, at most `4 + 2 * caught + waits / 32` polls miss. (A miss while polling takes three
    /// off a score that starts at 12 and stays at or above 6 while polling; a catch adds at most
    /// six to it; and probes miss at most once each, one per 32 waits.)
    #[test]
    fn misses_stay_bounded_by_catches_over_any_sequence_of_outcomes() {
        // Seeded runs of outcomes with every mix of catches, from none to all.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for catch_one_in in [0u64, 1, 2, 3, 4, 5, 8, 64] {
            let mut p = SpinPolicy::new(BUDGET);
            let (mut waits, mut caught, mut missed) = (0u64, 0u64, 0u64);
            for _ in 0..20_000 {
                waits += 1;
                if p.next().is_zero() {
                    continue;
                }
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let catch = catch_one_in != 0 && seed.is_multiple_of(catch_one_in);
                p.record(catch);
                if catch {
                    caught += 1;
                } else {
                    missed += 1;
                }
                let most = 4 + 2 * caught + waits / u64::from(SpinPolicy::PROBE_EVERY);
                assert!(
                    missed <= most,
                    "{missed} misses over {waits} waits with {caught} catches (one in {catch_one_in})"
                );
            }
        }
        // Tight where it matters: polls that never catch miss three times, then once per probe.
        let mut p = SpinPolicy::new(BUDGET);
        assert_eq!(run(&mut p, 3 + 2 * SpinPolicy::PROBE_EVERY as usize, |_| false), 3 + 2);
    }

    #[test]
    fn a_zero_budget_never_polls() {
        let mut p = SpinPolicy::new(Duration::ZERO);
        assert_eq!(run(&mut p, 100, |_| true), 0);
        assert!(!p.polling());
    }
}
