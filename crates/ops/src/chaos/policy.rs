//! What the chaos relay does to each datagram, as a pure decision: when (if ever) each copy of it is
//! delivered, given the impairments of its direction and a seeded random source.
use std::time::{Duration, Instant};

use rand::Rng;

/// Which way a datagram travels through the relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From the client (the side that dials the relay, e.g. a node) to the target (e.g. a router).
    Up,
    /// From the target back to the client.
    Down,
}

/// The impairments of one direction.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Impairment {
    /// Every datagram waits this long.
    pub delay: Duration,
    /// Plus a uniformly random extra of up to this.
    pub jitter: Duration,
    /// Probability that a datagram is lost.
    pub drop: f64,
    /// Probability that a datagram is delivered twice.
    pub duplicate: f64,
    /// Probability that a datagram is held back (by `delay + jitter`, again) so later ones overtake it.
    pub reorder: f64,
    /// Nothing passes (a partition in this direction).
    pub blocked: bool,
}

impl Impairment {
    /// Checks that probabilities are probabilities.
    pub fn validate(&self) -> Result<(), String> {
        for (name, p) in [
            ("drop", self.drop),
            ("duplicate", self.duplicate),
            ("reorder", self.reorder),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return Err(format!("{name} must be a probability between 0 and 1, not {p}"));
            }
        }
        Ok(())
    }
}

/// Counters of what the relay did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    pub received: u64,
    pub dropped: u64,
    pub blocked: u64,
    pub duplicated: u64,
    pub reordered: u64,
}

/// Both directions' impairments and what they did so far.
#[derive(Debug, Clone, Default)]
pub struct Chaos {
    pub up: Impairment,
    pub down: Impairment,
    pub counts: Counts,
}

impl Chaos {
    /// When each copy of a datagram received `now` travelling `dir` is delivered: none when it is
    /// lost, two when it is duplicated.
    pub fn decide(&mut self, dir: Direction, now: Instant, rng: &mut impl Rng) -> Vec<Instant> {
        let imp = match dir {
            Direction::Up => self.up,
            Direction::Down => self.down,
        };
        self.counts.received += 1;
        if imp.blocked {
            self.counts.blocked += 1;
            return Vec::new();
        }
        if imp.drop > 0.0 && rng.random_bool(imp.drop) {
            self.counts.dropped += 1;
            return Vec::new();
        }
        let one_way = |rng: &mut dyn rand::RngCore| {
            let jitter = if imp.jitter.is_zero() {
                Duration::ZERO
            } else {
                imp.jitter.mul_f64(rng.random::<f64>())
            };
            imp.delay + jitter
        };
        let mut wait = one_way(rng);
        if imp.reorder > 0.0 && rng.random_bool(imp.reorder) {
            self.counts.reordered += 1;
            // Held back by one more delay (at least 1 ms), so datagrams sent after it overtake it.
            wait += one_way(rng).max(Duration::from_millis(1));
        }
        let mut at = vec![now + wait];
        if imp.duplicate > 0.0 && rng.random_bool(imp.duplicate) {
            self.counts.duplicated += 1;
            at.push(now + wait + one_way(rng));
        }
        at
    }

    /// Applies one command line of the relay's control input; returns what it says back.
    ///
    /// `set [up|down] KEY=VALUE...` (keys: delay_ms, jitter_ms, drop, duplicate, reorder; without a
    /// direction both change), `block up|down|both`, `unblock`, `stats`.
    pub fn command(&mut self, line: &str) -> Result<String, String> {
        let mut words = line.split_whitespace();
        match words.next() {
            None => Ok(String::new()),
            Some("stats") => Ok(self.stats()),
            Some("unblock") => {
                self.up.blocked = false;
                self.down.blocked = false;
                Ok("ok unblocked".into())
            }
            Some("block") => {
                let which = words.next().unwrap_or("both");
                let (up, down) = match which {
                    "up" => (true, false),
                    "down" => (false, true),
                    "both" => (true, true),
                    other => return Err(format!("block takes up, down or both, not '{other}'")),
                };
                self.up.blocked |= up;
                self.down.blocked |= down;
                Ok(format!("ok blocked {which}"))
            }
            Some("set") => {
                let mut rest: Vec<&str> = words.collect();
                let dirs: &[Direction] = match rest.first().copied() {
                    Some("up") => &[Direction::Up],
                    Some("down") => &[Direction::Down],
                    _ => &[Direction::Up, Direction::Down],
                };
                if matches!(rest.first().copied(), Some("up" | "down")) {
                    rest.remove(0);
                }
                if rest.is_empty() {
                    return Err("set needs KEY=VALUE pairs (delay_ms, jitter_ms, drop, duplicate, reorder)".into());
                }
                let mut next = (self.up, self.down);
                for pair in rest {
                    for &d in dirs {
                        let imp = if d == Direction::Up { &mut next.0 } else { &mut next.1 };
                        set(imp, pair)?;
                    }
                }
                next.0.validate()?;
                next.1.validate()?;
                (self.up, self.down) = next;
                Ok("ok".into())
            }
            Some(other) => Err(format!("unknown command '{other}' (set, block, unblock, stats)")),
        }
    }

    /// One line of counters.
    pub fn stats(&self) -> String {
        let c = self.counts;
        format!(
            "received={} dropped={} blocked={} duplicated={} reordered={}",
            c.received, c.dropped, c.blocked, c.duplicated, c.reordered
        )
    }
}

fn set(imp: &mut Impairment, pair: &str) -> Result<(), String> {
    let (key, value) = pair
        .split_once('=')
        .ok_or_else(|| format!("'{pair}' is not KEY=VALUE"))?;
    let number = |v: &str| v.parse::<f64>().map_err(|_| format!("{key}: '{v}' is not a number"));
    let ms = |v: &str| {
        v.parse::<u64>()
            .map(Duration::from_millis)
            .map_err(|_| format!("{key}: '{v}' is not a whole number of milliseconds"))
    };
    match key {
        "delay_ms" => imp.delay = ms(value)?,
        "jitter_ms" => imp.jitter = ms(value)?,
        "drop" => imp.drop = number(value)?,
        "duplicate" => imp.duplicate = number(value)?,
        "reorder" => imp.reorder = number(value)?,
        other => {
            return Err(format!(
                "unknown setting '{other}' (delay_ms, jitter_ms, drop, duplicate, reorder)"
            ))
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
