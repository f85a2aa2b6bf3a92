//! Which servers, requests and responses are alive: a handle used after its delete is refused with an error, never read.
use std::collections::HashSet;
use std::sync::Mutex;

/// The addresses of one kind of object handed to C and not yet deleted.
pub(crate) struct Live {
    kind: &'static str,
    set: Mutex<Option<HashSet<usize>>>,
}

impl Live {
    pub(crate) const fn new(kind: &'static str) -> Live {
        Live {
            kind,
            set: Mutex::new(None),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut HashSet<usize>) -> R) -> R {
        let mut guard = self.set.lock().unwrap_or_else(|p| p.into_inner());
        f(guard.get_or_insert_with(HashSet::new))
    }

    /// Hands a new object to C.
    pub(crate) fn add<T>(&self, object: Box<T>) -> *mut T {
        let raw = Box::into_raw(object);
        self.with(|s| s.insert(raw as usize));
        raw
    }

    /// The object behind a handle, if it is alive.
    pub(crate) fn get<'a, T>(&self, raw: *mut T) -> Result<&'a mut T, crate::Failure> {
        if raw.is_null() {
            return Err(<crate::Failure as crate::error::FailureExt>::invalid(format!(
                "{} is null",
                self.kind
            )));
        }
        if !self.with(|s| s.contains(&(raw as usize))) {
            return Err(<crate::Failure as crate::error::FailureExt>::invalid(format!(
                "{} {raw:p} is not alive (deleted already, or never made by this library)",
                self.kind
            )));
        }
        // SAFETY: the address was made by `add` from a Box of this type and not yet taken back.
        Ok(unsafe { &mut *raw })
    }

    /// Takes an object back from C, once (two threads deleting the same handle: one gets it).
    pub(crate) fn take<T>(&self, raw: *mut T) -> Result<Box<T>, crate::Failure> {
        self.get(raw)?;
        if !self.with(|s| s.remove(&(raw as usize))) {
            return Err(<crate::Failure as crate::error::FailureExt>::invalid(format!(
                "{} {raw:p} is not alive (deleted already, or never made by this library)",
                self.kind
            )));
        }
        // SAFETY: as in `get`; it was removed from the set by this call alone, so it is taken once.
        Ok(unsafe { Box::from_raw(raw) })
    }
}
