//! System shared memory: a POSIX shared-memory object (`/dev/shm/<key>`) a client created and
//! registered. It is read and written with `pread`/`pwrite` on the descriptor kept from
//! registration, never through a mapping: an object the client shrank, or a sparse one whose
//! file system is full, then gives a short read or an error instead of killing the server (SIGBUS).
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};

use crate::error::{Error, Result};

/// Where POSIX shared-memory objects live on Linux (what `shm_open` opens).
const SHM_DIR: &str = "/dev/shm";

/// One registered system region: `byte_size` bytes from `offset` of the object named `key`.
pub struct SystemRegion {
    pub key: String,
    pub offset: u64,
    pub byte_size: u64,
    file: File,
}

/// A key that cannot be opened: Triton's words and class (INTERNAL; HTTP 500), then why.
fn unopenable(key: &str, why: impl std::fmt::Display) -> Error {
    Error::internal(format!("Unable to open shared memory region: '{key}' ({why})"))
}

/// The file name `shm_open` uses for a key: one leading '/' dropped, nothing that leaves the directory.
fn object_name(key: &str) -> Result<&str> {
    let name = key.strip_prefix('/').unwrap_or(key);
    if name.is_empty() || name.contains('/') || name.contains('\0') || name == "." || name == ".." {
        return Err(unopenable(
            key,
            "not a valid shared memory key; expected a name such as '/my_region'",
        ));
    }
    // A node's own memory (its Python stubs'): never a client's to read or write.
    if name.starts_with(super::OWN_SHM_PREFIX) {
        return Err(Error::invalid(format!(
            "'{key}' is a mesh-node's own shared memory and cannot be registered"
        )));
    }
    Ok(name)
}

/// A buffer of `len` bytes, or an error when memory for it cannot be had (never an abort).
pub(super) fn buffer(name: &str, len: usize) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    out.try_reserve_exact(len).map_err(|_| {
        Error::invalid(format!(
            "shared memory region '{name}': cannot allocate {len} bytes to read"
        ))
    })?;
    out.resize(len, 0);
    Ok(out)
}

impl SystemRegion {
    /// Opens the object; the region must lie within it.
    pub fn open(name: &str, key: &str, offset: u64, byte_size: u64) -> Result<SystemRegion> {
        let path = std::path::Path::new(SHM_DIR).join(object_name(key)?);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| unopenable(key, format_args!("region '{name}': the key cannot be opened: {e}")))?;
        let end = offset
            .checked_add(byte_size)
            .ok_or_else(|| Error::invalid(format!("shared memory region '{name}': offset + byte_size overflows")))?;
        let size = file
            .metadata()
            .map_err(|e| Error::invalid(format!("shared memory region '{name}': cannot read its size ({e})")))?
            .len();
        if end > size {
            return Err(Error::invalid(format!(
                "failed to register shared memory region '{name}': invalid args (offset {offset} + byte_size {byte_size} is beyond the {size} bytes of key '{key}')"
            )));
        }
        if byte_size == 0 {
            return Err(Error::invalid(format!(
                "shared memory region '{name}': byte_size must be positive"
            )));
        }
        Ok(SystemRegion {
            key: key.to_string(),
            offset,
            byte_size,
            file,
        })
    }

    fn shrank(&self, name: &str) -> Error {
        let size = self.file.metadata().map(|m| m.len()).unwrap_or(0);
        Error::invalid(format!(
            "shared memory region '{name}': key '{}' shrank to {size} bytes after it was registered",
            self.key
        ))
    }

    /// Copies `len` bytes at `at` (relative to the region's start; the caller checked the bounds).
    pub fn read(&self, name: &str, at: usize, len: usize) -> Result<Vec<u8>> {
        let mut out = buffer(name, len)?;
        self.file
            .read_exact_at(&mut out, self.offset + at as u64)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => self.shrank(name),
                _ => Error::invalid(format!("shared memory region '{name}': cannot read it ({e})")),
            })?;
        Ok(out)
    }

    /// Writes `data` at `at` (relative to the region's start; the caller checked the bounds).
    pub fn write(&self, name: &str, at: usize, data: &[u8]) -> Result<()> {
        let end = self.offset + at as u64 + data.len() as u64;
        if self.file.metadata().map(|m| m.len()).unwrap_or(0) < end {
            return Err(self.shrank(name)); // writing would grow the client's object
        }
        self.file
            .write_all_at(data, self.offset + at as u64)
            .map_err(|e| Error::internal(format!("shared memory region '{name}': cannot write the output ({e})")))
    }
}
