//! The sans-IO leadership clock: whether this router may act as the placement leader now, judged
//! by the lease it holds in etcd as measured from when each grant or keep-alive was *sent* (the
//! server's lease runs at least that long), minus a safety margin. The etcd task feeds it what
//! etcd answered; nothing here does IO, so it is tested on a fake clock.
use std::time::{Duration, Instant};

/// What this router is in the election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// No lease, or the lease may have run out: it must not act.
    Candidate,
    /// It holds the leader key; `epoch` is the revision that created it (the fencing token).
    Leader { epoch: u64 },
    /// Another router holds the leader key (its name and HTTP address).
    Follower { leader: String, http: String },
}

#[derive(Debug)]
pub struct Leadership {
    ttl: Duration,
    margin: Duration,
    lease: Option<i64>,
    /// The lease certainly lives until then (send time of the last grant or keep-alive + its TTL).
    expires: Option<Instant>,
    last_keepalive: Option<Instant>,
    standing: Standing,
}

impl Leadership {
    /// `ttl`: the lease's time to live; `margin`: how long before its end a leader stops acting
    /// (clock drift and the time a command takes to reach a node).
    pub fn new(ttl: Duration, margin: Duration) -> Self {
        Leadership {
            ttl,
            margin: margin.min(ttl / 2),
            lease: None,
            expires: None,
            last_keepalive: None,
            standing: Standing::Candidate,
        }
    }

    /// The lease to campaign and keep alive with, while it still lives.
    pub fn lease(&self, now: Instant) -> Option<i64> {
        self.lease.filter(|_| self.expires.is_some_and(|e| now < e))
    }

    /// etcd granted a lease for a request sent at `sent`.
    pub fn granted(&mut self, id: i64, ttl: Duration, sent: Instant) {
        self.lease = Some(id);
        self.expires = Some(sent + ttl);
        self.last_keepalive = Some(sent);
    }

    /// A keep-alive sent at `sent` came back with `ttl` left; zero means the lease is gone.
    pub fn kept_alive(&mut self, ttl: Duration, sent: Instant) {
        if ttl.is_zero() {
            self.lost_lease();
            return;
        }
        self.expires = Some(sent + ttl);
    }

    /// A keep-alive is due (a third of the TTL after the last one was sent).
    pub fn keepalive_due(&self, now: Instant) -> bool {
        self.lease.is_some() && self.last_keepalive.is_none_or(|t| now >= t + self.ttl / 3)
    }

    pub fn keepalive_sent(&mut self, now: Instant) {
        self.last_keepalive = Some(now);
    }

    /// The lease expired or etcd said it does not know it: campaign again with a new one.
    pub fn lost_lease(&mut self) {
        self.lease = None;
        self.expires = None;
        self.standing = Standing::Candidate;
    }

    /// The leader key was created by this router's campaign at revision `epoch`.
    pub fn won(&mut self, epoch: u64) {
        self.standing = Standing::Leader { epoch };
    }

    /// The leader key belongs to someone else (or, for a leader, no longer to it).
    pub fn follows(&mut self, leader: String, http: String) {
        self.standing = Standing::Follower { leader, http };
    }

    /// Until when a leader may act (its lease's end minus the margin); None when it does not lead.
    pub fn acts_until(&self) -> Option<Instant> {
        match self.standing {
            Standing::Leader { .. } => self.expires.map(|e| e.checked_sub(self.margin).unwrap_or(e)),
            _ => None,
        }
    }

    /// What this router may do now: a leader past `acts_until` is a candidate.
    pub fn standing(&self, now: Instant) -> Standing {
        match &self.standing {
            Standing::Leader { .. } if self.acts_until().is_none_or(|until| now >= until) => Standing::Candidate,
            s => s.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);
    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_leader_stops_acting_before_its_lease_can_have_run_out() {
        let t0 = Instant::now();
        let mut l = Leadership::new(3 * S, 500 * MS);
        assert_eq!(l.standing(t0), Standing::Candidate);
        l.granted(42, 3 * S, t0);
        l.won(17);
        assert_eq!(l.standing(t0 + 2 * S), Standing::Leader { epoch: 17 });
        assert_eq!(l.standing(t0 + 2499 * MS), Standing::Leader { epoch: 17 });
        // No keep-alive answered: it steps down half a second before the server could expire it.
        assert_eq!(l.standing(t0 + 2500 * MS), Standing::Candidate);
        assert_eq!(l.acts_until(), Some(t0 + 2500 * MS));
        assert_eq!(l.lease(t0 + 2500 * MS), Some(42), "the lease itself still lives");
        assert_eq!(l.lease(t0 + 3 * S), None);
    }

    #[test]
    fn keep_alives_extend_from_when_they_were_sent() {
        let t0 = Instant::now();
        let mut l = Leadership::new(3 * S, 500 * MS);
        l.granted(1, 3 * S, t0);
        l.won(5);
        assert!(!l.keepalive_due(t0 + 999 * MS));
        assert!(l.keepalive_due(t0 + S));
        let sent = t0 + S;
        l.keepalive_sent(sent);
        // The answer arrives late (a frozen process, a slow network): the lease counts from `sent`.
        l.kept_alive(3 * S, sent);
        assert_eq!(l.standing(t0 + 3400 * MS), Standing::Leader { epoch: 5 });
        assert_eq!(l.standing(t0 + 3500 * MS), Standing::Candidate);
    }

    #[test]
    fn a_lease_etcd_no_longer_knows_ends_leadership_at_once() {
        let t0 = Instant::now();
        let mut l = Leadership::new(3 * S, 500 * MS);
        l.granted(1, 3 * S, t0);
        l.won(5);
        l.kept_alive(Duration::ZERO, t0 + S);
        assert_eq!(l.standing(t0 + S), Standing::Candidate);
        assert_eq!(l.lease(t0 + S), None, "a new lease is needed to campaign again");
        assert!(!l.keepalive_due(t0 + 2 * S));
    }

    #[test]
    fn followers_keep_following_without_a_lease_check() {
        let t0 = Instant::now();
        let mut l = Leadership::new(3 * S, 5 * S);
        l.granted(1, 3 * S, t0);
        l.follows("router-b".into(), "b:8000".into());
        let b = Standing::Follower {
            leader: "router-b".into(),
            http: "b:8000".into(),
        };
        assert_eq!(l.standing(t0 + 10 * S), b);
        l.won(9);
        // The margin is capped at half the TTL.
        assert_eq!(l.standing(t0 + 1400 * MS), Standing::Leader { epoch: 9 });
        assert_eq!(l.standing(t0 + 1500 * MS), Standing::Candidate);
    }
}
