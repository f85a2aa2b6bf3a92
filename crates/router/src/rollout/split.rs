//! Which version a request that names none goes to while a rollout runs: the candidate's share of
//! them, chosen so that a client key (a header or parameter) keeps a client on its side while the
//! share holds or rises, and every request of a sequence stays on the version its first request
//! got ([`Pins`]). A request that names a version gets it and never comes here.
use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::Arm;

/// Buckets of the split: a share of p percent is the buckets below 100 p.
pub const BUCKETS: u32 = 10_000;

/// A key's bucket: FNV-1a of its bytes, so every router (of any build) puts a key in the same one.
pub fn bucket(key: &str) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % u64::from(BUCKETS)) as u32
}

/// The side of bucket `b` at `share` percent: below the share is the candidate's, so a rising
/// share only ever moves keys from the serving version to the candidate.
pub fn arm_of_bucket(b: u32, share: u8) -> Arm {
    if b < u32::from(share.min(100)) * (BUCKETS / 100) {
        Arm::Candidate
    } else {
        Arm::Serving
    }
}

/// The side of a client's key at `share` percent.
pub fn arm_of_key(key: &str, share: u8) -> Arm {
    arm_of_bucket(bucket(key), share)
}

/// Sequences' versions, pinned at their first request: at most `cap` of them, each forgotten when
/// its sequence ends or after `idle` without a request. A sequence that finds no room is not
/// pinned and follows its id's bucket ([`arm_of_key`]), which holds while the share does.
#[derive(Debug)]
pub struct Pins {
    pins: HashMap<String, (Arm, Instant)>,
    cap: usize,
    idle: Duration,
    /// When the expired pins were last swept (at most once per quarter of `idle`).
    swept: Option<Instant>,
    /// Sequences that found no room.
    pub unpinned: u64,
}

impl Pins {
    pub fn new(cap: usize, idle: Duration) -> Pins {
        Pins {
            pins: HashMap::new(),
            cap,
            idle,
            swept: None,
            unpinned: 0,
        }
    }

    /// The version of a request of `sequence` at `now` (`start`: its first request, which pins it
    /// anew; `end`: its last, which lets it go), the candidate's share being `share`.
    pub fn arm(&mut self, sequence: &str, (start, end): (bool, bool), share: u8, now: Instant) -> Arm {
        let pinned = match self.pins.get_mut(sequence) {
            Some((arm, seen)) if !start && now.saturating_duration_since(*seen) < self.idle => {
                *seen = now;
                Some(*arm)
            }
            _ => None,
        };
        let arm = pinned.unwrap_or_else(|| arm_of_key(sequence, share));
        if end {
            self.pins.remove(sequence);
        } else if pinned.is_none() {
            self.pin(sequence, arm, now);
        }
        arm
    }

    fn pin(&mut self, sequence: &str, arm: Arm, now: Instant) {
        if self.pins.len() >= self.cap && !self.pins.contains_key(sequence) {
            self.sweep(now);
        }
        if self.pins.len() < self.cap || self.pins.contains_key(sequence) {
            self.pins.insert(sequence.to_string(), (arm, now));
        } else {
            self.unpinned += 1;
        }
    }

    fn sweep(&mut self, now: Instant) {
        if self
            .swept
            .is_some_and(|at| now.saturating_duration_since(at) < self.idle / 4)
        {
            return;
        }
        self.swept = Some(now);
        let idle = self.idle;
        self.pins
            .retain(|_, (_, seen)| now.saturating_duration_since(*seen) < idle);
    }

    /// Sequences pinned now.
    pub fn len(&self) -> usize {
        self.pins.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pins.is_empty()
    }

    /// Forgets every pin (the rollout is over).
    pub fn clear(&mut self) {
        self.pins.clear();
    }
}
