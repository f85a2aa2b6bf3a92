//! How many async runtime workers may wait inline on another process (a Python stub) at once: all
//! but one, so a free worker always serves the sockets, the timers and the BLS calls a waiting stub
//! makes. Sans-IO: a count and its limit.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Slots for runtime workers that block on another process; `limit` of them at most.
#[derive(Debug)]
pub struct WaitSlots {
    limit: usize,
    used: AtomicUsize,
}

/// One worker's slot, given back when dropped.
#[derive(Debug)]
pub struct WaitSlot<'a>(&'a WaitSlots);

impl WaitSlots {
    /// Slots for a runtime of `workers` workers: one stays free (none with a single worker).
    pub fn for_workers(workers: usize) -> Self {
        WaitSlots {
            limit: workers.saturating_sub(1),
            used: AtomicUsize::new(0),
        }
    }

    /// A slot if one is free now.
    pub fn try_take(&self) -> Option<WaitSlot<'_>> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .ok()
            .map(|_| WaitSlot(self))
    }

    /// Slots held now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

impl Drop for WaitSlot<'_> {
    fn drop(&mut self) {
        self.0.used.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The node's slots, sized by the async runtime the first caller runs on (the node has one; a
/// caller outside any runtime gets none, as a runtime of one worker would).
pub fn runtime_slots() -> &'static WaitSlots {
    static SLOTS: OnceLock<WaitSlots> = OnceLock::new();
    SLOTS.get_or_init(|| {
        let workers = tokio::runtime::Handle::try_current().map_or(1, |h| h.metrics().num_workers());
        WaitSlots::for_workers(workers)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_worker_stays_free() {
        let slots = WaitSlots::for_workers(3);
        let a = slots.try_take().expect("first of two");
        let b = slots.try_take().expect("second of two");
        assert!(slots.try_take().is_none(), "the third worker stays free");
        assert_eq!(slots.used(), 2);
        drop(a);
        let c = slots.try_take().expect("a slot given back is free again");
        drop((b, c));
        assert_eq!(slots.used(), 0);
    }

    #[test]
    fn a_single_worker_never_waits() {
        assert!(WaitSlots::for_workers(1).try_take().is_none());
        assert!(WaitSlots::for_workers(0).try_take().is_none());
    }
}
