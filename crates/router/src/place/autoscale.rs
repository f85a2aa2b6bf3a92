//! Autoscaling: how many replicas a model should have from its in-flight requests (Ray Serve's target), sans-IO.
//!
//! For each observation, `raw = ceil(inflight / target_inflight)`. The count changes only when every
//! observation for a whole delay agrees: up when `raw` stayed above the current count for `up_delay` (to the
//! latest `raw`), down when it stayed below for `down_delay` (to the highest `raw` seen meanwhile, the
//! conservative choice). One observation on the other side ends the streak, so a spike or a dip shorter than
//! the delay changes nothing. The current count is the last decision, or before any the Ready replicas
//! observed. A model with no replica at all scales up at the first request, without waiting.
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The autoscaler's knobs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScaleSettings {
    /// In-flight requests one replica should have; 0, negative or NaN is taken as the default 2.
    pub target_inflight: f64,
    /// How long load must stay above what the current replicas should carry before adding replicas.
    pub up_delay: Duration,
    /// How long load must stay below it before removing replicas.
    pub down_delay: Duration,
}

impl Default for ScaleSettings {
    fn default() -> Self {
        ScaleSettings {
            target_inflight: 2.0,
            up_delay: Duration::from_secs(30),
            down_delay: Duration::from_secs(600),
        }
    }
}

/// Observations that all said "more" (or all "fewer") since `since`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Streak {
    since: Instant,
    latest: u32,
    highest: u32,
}

impl Streak {
    fn extend(streak: &mut Option<Streak>, raw: u32, now: Instant) {
        let s = streak.get_or_insert(Streak {
            since: now,
            latest: raw,
            highest: raw,
        });
        s.latest = raw;
        s.highest = s.highest.max(raw);
    }
}

#[derive(Debug, Clone, Default)]
struct Track {
    ready: u32,
    /// The last count [`Autoscaler::desired`] returned.
    decided: Option<u32>,
    up: Option<Streak>,
    down: Option<Streak>,
}

impl Track {
    fn current(&self) -> u32 {
        self.decided.unwrap_or(self.ready)
    }
}

/// Per-model autoscaling state; see the module docs.
#[derive(Debug, Clone)]
pub struct Autoscaler {
    settings: ScaleSettings,
    models: HashMap<String, Track>,
}

impl Autoscaler {
    pub fn new(mut settings: ScaleSettings) -> Self {
        let usable = settings.target_inflight.is_finite() && settings.target_inflight > 0.0;
        if !usable {
            settings.target_inflight = ScaleSettings::default().target_inflight;
        }
        Autoscaler {
            settings,
            models: HashMap::new(),
        }
    }

    /// Feed the current total in-flight requests for `model` across the cluster and its ready replica count.
    /// Call it for every model on every round (with 0 when idle): the delays count observations.
    pub fn observe(&mut self, model: &str, inflight: f64, ready: u32, now: Instant) {
        let raw = self.raw(inflight);
        let t = self.models.entry(model.to_string()).or_default();
        t.ready = ready;
        let current = t.current();
        if raw > current {
            t.down = None;
            Streak::extend(&mut t.up, raw, now);
        } else if raw < current {
            t.up = None;
            Streak::extend(&mut t.down, raw, now);
        } else {
            t.up = None;
            t.down = None;
        }
    }

    /// The replica count the model should have now, clamped to [min, max]; None while no decision (keep current).
    pub fn desired(&mut self, model: &str, min: u32, max: u32, now: Instant) -> Option<u32> {
        let max = max.max(min);
        let s = self.settings;
        let t = self.models.get_mut(model)?;
        let current = t.current();
        let held = |streak: &Option<Streak>, delay: Duration| {
            streak.filter(|st| current == 0 || now.saturating_duration_since(st.since) >= delay)
        };
        let next = if current < min || current > max {
            Some(current.clamp(min, max))
        } else if let Some(up) = held(&t.up, s.up_delay) {
            Some(up.latest.clamp(min, max)).filter(|n| *n > current)
        } else if let Some(down) = held(&t.down, s.down_delay) {
            Some(down.highest.clamp(min, max)).filter(|n| *n < current)
        } else {
            None
        };
        if let Some(n) = next {
            t.decided = Some(n);
            t.up = None;
            t.down = None;
        }
        next
    }

    /// Drops the model's state (it left the repository).
    pub fn forget(&mut self, model: &str) {
        self.models.remove(model);
    }

    fn raw(&self, inflight: f64) -> u32 {
        if inflight > 0.0 {
            // `as` saturates: a huge load asks for u32::MAX, which the bounds clamp.
            (inflight / self.settings.target_inflight).ceil() as u32
        } else {
            0
        }
    }
}
