//! Which version a request that names none goes to while a rollout runs: the candidate's share of
//! them, chosen so that a client key (a header or parameter) keeps a client on its side while the
//! share holds or rises, and every request of a sequence stays on the version its first request
//! got ([`Pins`]). A request that names a version gets it and never comes here. Also the written
//! rule of which of the candidate's failures go again to the serving version ([`retry_on_serving`]).
use std::collections::HashMap;
use std::time::{Duration, Instant};

use mesh::Code;

use super::Arm;

/// What keeps a request on one side of the split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key<'a> {
    /// A request of sequence `id` (`start`, `end`: its flags): the whole sequence on one version.
    Sequence { id: &'a str, start: bool, end: bool },
    /// A client's key (the `rollout_key` parameter): the client stays on its side while the share
    /// holds or rises.
    Client(&'a str),
    /// Nothing: a draw (`draw`, any number) puts it on a side.
    Drawn(u32),
}

/// The side a request with `key` goes to at `share` percent, at `now`; `ready(arm)`: whether that
/// side's version has a replica to take it. A side with none gives its request to the other (a
/// version still loading, or already unloaded), except that at share 0 (rolled back or aborted) the
/// candidate never gets a request that is not already its, and a sequence under way stays where
/// its pin says whatever the replicas (its state is there; routing waits or fails as it would
/// without a rollout). With neither side ready a request goes to the serving version, which
/// routing waits for. A sequence's `id` names it within its rollout (the caller makes it unique to
/// the model and the rollout).
pub fn choose(key: Key<'_>, share: u8, pins: &mut Pins, now: Instant, ready: impl Fn(Arm) -> bool) -> Arm {
    let (wanted, pinned) = match key {
        Key::Sequence { id, start, end } => pins.arm(id, (start, end), share, now),
        Key::Client(k) => (arm_of_key(k, share), false),
        Key::Drawn(d) => (arm_of_bucket(d % BUCKETS, share), false),
    };
    let other = match wanted {
        Arm::Serving => Arm::Candidate,
        Arm::Candidate => Arm::Serving,
    };
    let arm = if pinned || ready(wanted) {
        wanted
    } else if share > 0 && ready(other) {
        other
    } else {
        Arm::Serving
    };
    if let (Key::Sequence { id, end, .. }, true) = (key, arm != wanted) {
        // A new sequence runs where it went; its pin says so.
        pins.repin(id, arm, end, now);
    }
    arm
}

/// Whether a request the candidate failed with `code` goes again to the serving version, so that a
/// bad candidate costs clients latency, not errors. Only where running it again is safe and can
/// help: never a request of a sequence (its state lives on the candidate), nor a stream that already
/// forwarded an answer (`answers`), nor a request of a model marked non-idempotent (`idempotent`)
/// that may have run (anything but overloaded or the version not found); and only for the server's
/// failures (internal, unavailable, overloaded, the model's own UNKNOWN, the version not found),
/// never the client's (a bad input fails on any version).
pub fn retry_on_serving(code: Code, in_sequence: bool, answers: u32, idempotent: bool) -> bool {
    let never_ran = matches!(code, Code::Overloaded | Code::NotFound);
    servers_failure(code) && !in_sequence && answers == 0 && (idempotent || never_ran)
}

/// How an answer counts for its version in the guard: `Some(true)` an answer (with its latency),
/// `Some(false)` a failure, `None` not at all. The server's failures count against the version; a
/// client's own mistake (a bad input, a payload too large, a cancel) too when the request's side
/// was drawn (a client cannot choose it, so such mistakes fall on both versions alike, and a
/// candidate that refuses what the serving version takes shows), never when the client's key or
/// sequence chose it (a client could steer the guard). A request whose own deadline (`timeout`)
/// passed, or whose client went away, is a latency sample: it took at least that long.
pub fn counted(result: Result<(), Code>, drawn: bool, gave_up: bool) -> Option<bool> {
    match result {
        Ok(()) => Some(true),
        Err(_) if gave_up => Some(true),
        Err(code) if servers_failure(code) => Some(false),
        Err(_) if drawn => Some(false),
        Err(_) => None,
    }
}

/// Whether a failure is the server's (internal, unavailable, overloaded, the model's own UNKNOWN,
/// the version not found), not the client's.
pub fn servers_failure(code: Code) -> bool {
    matches!(
        code,
        Code::Internal | Code::Unavailable | Code::Overloaded | Code::Unknown | Code::NotFound
    )
}

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
/// its sequence ends or after `idle` without a request. A sequence that finds no room runs on the
/// serving version, as does one this router saw begin before its pins did. A pin is kept under a
/// 64-bit hash of its id, so a pin's size is fixed whatever the client's id.
#[derive(Debug)]
pub struct Pins {
    pins: HashMap<u64, (Arm, Instant)>,
    cap: usize,
    idle: Duration,
    /// When the expired pins were last swept (at most once per quarter of `idle`).
    swept: Option<Instant>,
    /// Sequences that found no room.
    pub unpinned: u64,
}

/// A sequence id's pin key.
fn pin_key(id: &str) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(id)
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
    /// anew; `end`: its last, which lets it go), the candidate's share being `share`; and whether
    /// it stays there whatever the replicas (a sequence under way, or a START that found no room).
    /// A START goes by its id's bucket, or to the serving version when no pin is left for it; a
    /// request of a sequence this router holds no pin of (begun before the rollout, forgotten idle,
    /// or without room) is one under way on the serving version.
    pub fn arm(&mut self, sequence: &str, (start, end): (bool, bool), share: u8, now: Instant) -> (Arm, bool) {
        let key = pin_key(sequence);
        if !start {
            let arm = match self.pins.get_mut(&key) {
                Some((arm, seen)) if now.saturating_duration_since(*seen) < self.idle => {
                    *seen = now;
                    *arm
                }
                _ => Arm::Serving,
            };
            if end {
                self.pins.remove(&key);
            }
            return (arm, true);
        }
        let wanted = arm_of_key(sequence, share);
        if end {
            self.pins.remove(&key);
            return (wanted, false);
        }
        if self.pin(key, wanted, now) {
            (wanted, false)
        } else {
            // No room: the serving version, where its later requests will go too.
            (Arm::Serving, true)
        }
    }

    /// Pins a new `sequence` to `arm` after its request went there instead of where its id's
    /// bucket said.
    fn repin(&mut self, sequence: &str, arm: Arm, end: bool, now: Instant) {
        if !end {
            // It was pinned at its START (a START without room stays on the serving version).
            let key = pin_key(sequence);
            self.pins.remove(&key);
            self.pin(key, arm, now);
        }
    }

    /// Pins `key` to `arm`; false when there is no room.
    fn pin(&mut self, key: u64, arm: Arm, now: Instant) -> bool {
        if self.pins.len() >= self.cap && !self.pins.contains_key(&key) {
            self.sweep(now);
        }
        if self.pins.len() < self.cap || self.pins.contains_key(&key) {
            self.pins.insert(key, (arm, now));
            true
        } else {
            self.unpinned += 1;
            false
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
