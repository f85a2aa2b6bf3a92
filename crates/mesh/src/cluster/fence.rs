//! The node's side of fencing: the highest placement epoch seen from any router, and whether a
//! command of a given epoch may still act (lower ones come from a deposed leader).
use std::sync::atomic::{AtomicU64, Ordering};

/// Shared by every router session of one node process.
#[derive(Debug, Default)]
pub struct Fencing {
    highest: AtomicU64,
}

impl Fencing {
    /// Admits a command of `epoch` (raising the highest seen), or refuses it with the highest
    /// epoch seen, which is newer.
    pub fn admit(&self, epoch: u64) -> Result<(), u64> {
        let seen = self.highest.fetch_max(epoch, Ordering::AcqRel);
        if epoch < seen {
            Err(seen)
        } else {
            Ok(())
        }
    }

    pub fn highest(&self) -> u64 {
        self.highest.load(Ordering::Acquire)
    }

    /// Why a command of `epoch` was refused, for logs and the Placed answer.
    pub fn refusal(epoch: u64, seen: u64) -> String {
        format!(
            "fenced: the command carries placement epoch {epoch}, but a newer leader (epoch {seen}) \
             took over; commands of a deposed leader are refused"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_and_newer_epochs_pass_older_ones_are_refused() {
        let f = Fencing::default();
        assert_eq!(f.admit(0), Ok(()), "a router without etcd uses epoch 0");
        assert_eq!(f.admit(7), Ok(()));
        assert_eq!(f.admit(7), Ok(()), "the same leader keeps acting");
        assert_eq!(f.admit(3), Err(7), "a deposed leader is refused");
        assert_eq!(f.highest(), 7, "a refused command does not lower the epoch");
        assert_eq!(f.admit(12), Ok(()));
        assert_eq!(f.admit(7), Err(12));
        assert!(Fencing::refusal(7, 12).contains("epoch 12"));
    }
}
