//! Picking a replica: power of two choices on load, with passive quarantine of failed links and busy marks.
//!
//! The score of a replica is `inflight(link) + replica.queued` (saturating): the router's own count of
//! attempts it has sent on that link and not yet seen end (fresh, covers every model on the node), plus the
//! node's last reported queue for the requested model version (stale by up to one report, but it sees work
//! from other routers and from BLS calls made on the node). This router's requests that wait in the node's
//! queue are counted by both terms; that is fine, since both terms grow with the node's backlog and the
//! choice only compares two scores. The lower score wins; a tie goes to the first of the two random draws.
use std::collections::HashMap;
use std::time::{Duration, Instant};

use mesh::Error;
use rand::Rng;

use crate::membership::{LinkId, Replica};

/// How long the balancer keeps links out after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BalanceSettings {
    /// A link with a transport failure is left out of picks for this long.
    pub quarantine: Duration,
    /// A link whose node answered "overloaded" is busy (used only as a last resort) for this long.
    pub busy: Duration,
}

impl Default for BalanceSettings {
    fn default() -> Self {
        BalanceSettings {
            quarantine: Duration::from_secs(3),
            busy: Duration::from_millis(250),
        }
    }
}

/// What the balancer says about one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pick {
    /// Send the attempt on this link.
    Routed(LinkId),
    /// Nothing can take it now, but something may soon: pick again at `until` (when known) or when
    /// membership changes, within the request's deadline.
    Wait { reason: String, until: Option<Instant> },
    /// Every replica was tried already.
    Unavailable(Error),
}

#[derive(Debug, Clone, Copy, Default)]
struct Marks {
    quarantined_until: Option<Instant>,
    busy_until: Option<Instant>,
}

impl Marks {
    fn quarantined(&self, now: Instant) -> bool {
        self.quarantined_until.is_some_and(|t| now < t)
    }
    fn busy(&self, now: Instant) -> bool {
        self.busy_until.is_some_and(|t| now < t)
    }
}

/// Power of two choices over a model version's replicas, with quarantine and busy marks per link.
#[derive(Debug, Clone, Default)]
pub struct Balancer {
    settings: BalanceSettings,
    marks: HashMap<LinkId, Marks>,
}

/// The score [`Balancer::pick`] compares: the router's in-flight count plus the node's reported queue.
pub fn score(replica: &Replica, inflight: u32) -> u32 {
    inflight.saturating_add(replica.queued)
}

impl Balancer {
    /// A balancer with no marks yet.
    pub fn new(settings: BalanceSettings) -> Self {
        Balancer {
            settings,
            marks: HashMap::new(),
        }
    }

    /// Chooses a replica not in `tried` (none left: wait for one to appear). Quarantined links are left out; busy links are used only when no
    /// other untried one is left. One candidate is taken without drawing; otherwise two distinct candidates
    /// are drawn and the lower [`score`] wins.
    pub fn pick<R: Rng + ?Sized>(
        &self,
        replicas: &[Replica],
        inflight: impl Fn(LinkId) -> u32,
        tried: &[LinkId],
        now: Instant,
        rng: &mut R,
    ) -> Pick {
        if replicas.is_empty() {
            return Pick::Wait {
                reason: "no replica is routable".into(),
                until: None,
            };
        }
        let untried: Vec<&Replica> = replicas.iter().filter(|r| !tried.contains(&r.link)).collect();
        if untried.is_empty() {
            let mut names: Vec<&str> = replicas.iter().map(|r| r.node.as_str()).collect();
            names.sort();
            // Every replica failed this request already, but it may get another one (a replica being
            // placed, a node rejoining): wait for the routing to change, within the route wait.
            return Pick::Wait {
                reason: format!(
                    "every replica was tried ({} tried: {})",
                    replicas.len(),
                    names.join(", ")
                ),
                until: None,
            };
        }
        let marks = |r: &Replica| self.marks.get(&r.link).copied().unwrap_or_default();
        let open: Vec<&Replica> = untried.iter().copied().filter(|r| !marks(r).quarantined(now)).collect();
        if open.is_empty() {
            let until = untried.iter().filter_map(|r| marks(r).quarantined_until).min();
            return Pick::Wait {
                reason: format!(
                    "every untried replica ({}) is quarantined after a transport failure",
                    untried.len()
                ),
                until,
            };
        }
        let idle: Vec<&Replica> = open.iter().copied().filter(|r| !marks(r).busy(now)).collect();
        let candidates = if idle.is_empty() { open } else { idle };
        Pick::Routed(two_choices(&candidates, &inflight, rng))
    }

    /// The link failed at the transport level: keep it out of picks for the quarantine time.
    pub fn transport_failed(&mut self, link: LinkId, now: Instant) {
        self.prune(now);
        self.marks.entry(link).or_default().quarantined_until = Some(now + self.settings.quarantine);
    }

    /// The node said it is overloaded: prefer other links for the busy time (busy, not dead).
    pub fn overloaded(&mut self, link: LinkId, now: Instant) {
        self.prune(now);
        self.marks.entry(link).or_default().busy_until = Some(now + self.settings.busy);
    }

    /// An attempt on the link succeeded: it is no longer busy.
    pub fn succeeded(&mut self, link: LinkId) {
        if let Some(m) = self.marks.get_mut(&link) {
            m.busy_until = None;
        }
    }

    /// The link is gone for good; drop its marks.
    pub fn forget(&mut self, link: LinkId) {
        self.marks.remove(&link);
    }

    /// Whether the link is quarantined at `now`.
    pub fn is_quarantined(&self, link: LinkId, now: Instant) -> bool {
        self.marks.get(&link).is_some_and(|m| m.quarantined(now))
    }

    /// Whether the link is marked busy at `now`.
    pub fn is_busy(&self, link: LinkId, now: Instant) -> bool {
        self.marks.get(&link).is_some_and(|m| m.busy(now))
    }

    /// Drops marks that have expired, so links that went away without `forget` do not pile up.
    fn prune(&mut self, now: Instant) {
        self.marks.retain(|_, m| m.quarantined(now) || m.busy(now));
    }
}

fn two_choices<R: Rng + ?Sized>(candidates: &[&Replica], inflight: &impl Fn(LinkId) -> u32, rng: &mut R) -> LinkId {
    if let [only] = candidates {
        return only.link;
    }
    let n = candidates.len();
    let i = rng.random_range(0..n);
    let mut j = rng.random_range(0..n - 1);
    if j >= i {
        j += 1;
    }
    let (a, b) = (candidates[i], candidates[j]);
    if score(b, inflight(b.link)) < score(a, inflight(a.link)) {
        b.link
    } else {
        a.link
    }
}

#[cfg(test)]
mod tests;
