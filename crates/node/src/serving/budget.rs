//! The node's in-flight byte budget: requests past it are refused at once, so memory stays bounded under overload.
use std::sync::atomic::{AtomicUsize, Ordering};

use mesh::{Error, Result};

/// What one request costs the node besides its tensors (its message, its place in a queue and an
/// instance's mailbox, its answer's channel), charged with them: requests without tensors are
/// bounded by the budget too, so a flood of them is refused as overload, never queued without end.
pub const REQUEST_BYTES: usize = 4 << 10;

/// Bytes of request tensors (and [`REQUEST_BYTES`] each) admitted and not yet answered, against a limit.
pub struct InflightBudget {
    used: AtomicUsize,
    limit: usize,
}

/// Admitted bytes; released when dropped (answered, failed or cancelled alike).
pub struct Permit<'a> {
    budget: &'a InflightBudget,
    bytes: usize,
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

impl InflightBudget {
    pub fn new(limit: usize) -> Self {
        InflightBudget {
            used: AtomicUsize::new(0),
            limit,
        }
    }

    /// Admits `bytes` if they fit; otherwise UNAVAILABLE with what is in flight and the limit.
    pub fn admit(&self, bytes: usize) -> Result<Permit<'_>> {
        if bytes > self.limit {
            return Err(Error::unavailable(format!(
                "request of {bytes} bytes is larger than the in-flight budget of {} bytes (--max-inflight-bytes)",
                self.limit
            )));
        }
        let before = self.used.fetch_add(bytes, Ordering::AcqRel);
        if before + bytes > self.limit {
            self.used.fetch_sub(bytes, Ordering::AcqRel);
            return Err(Error::overloaded(format!(
                "server overloaded: {before} bytes of requests in flight, a {bytes}-byte request would pass --max-inflight-bytes {}; retry later",
                self.limit
            )));
        }
        Ok(Permit { budget: self, bytes })
    }

    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesh::Code;

    #[test]
    fn admits_up_to_the_limit_and_releases_on_drop() {
        let b = InflightBudget::new(100);
        let a = b.admit(60).unwrap();
        let c = b.admit(40).unwrap();
        let e = b.admit(1).err().expect("over the limit");
        // Busy, not broken: a router may send it to another node, since it never ran.
        assert_eq!(e.code, Code::Overloaded);
        assert!(e.message.contains("--max-inflight-bytes 100"), "{}", e.message);
        assert_eq!(b.used(), 100, "a refused request must not hold bytes");
        drop(a);
        assert_eq!(b.used(), 40);
        let _d = b.admit(60).unwrap();
        drop(c);
        assert_eq!(b.used(), 60);
    }

    #[test]
    fn a_request_larger_than_the_budget_says_so() {
        let b = InflightBudget::new(10);
        let e = b.admit(11).err().expect("too large");
        assert!(e.message.contains("larger than the in-flight budget"), "{}", e.message);
        assert_eq!(b.used(), 0);
    }
}
