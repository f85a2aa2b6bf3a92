//! System shared memory: a POSIX shared-memory object (`/dev/shm/<key>`) a client created and
//! registered, mapped once at registration and read or written at each use.
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;

use memmap2::{MmapOptions, MmapRaw};

use crate::error::{Error, Result};

/// Where POSIX shared-memory objects live on Linux (what `shm_open` opens).
const SHM_DIR: &str = "/dev/shm";

/// One registered system region: `byte_size` bytes from `offset` of the object named `key`.
pub struct SystemRegion {
    pub key: String,
    pub offset: u64,
    pub byte_size: u64,
    file: File,
    /// The object's first `offset + byte_size` bytes.
    map: MmapRaw,
}

/// The file name `shm_open` uses for a key: one leading '/' dropped, nothing that leaves the directory.
fn object_name(key: &str) -> Result<&str> {
    let name = key.strip_prefix('/').unwrap_or(key);
    if name.is_empty() || name.contains('/') || name.contains('\0') || name == "." || name == ".." {
        return Err(Error::invalid(format!(
            "'{key}' is not a valid shared memory key (expected a name such as '/my_region')"
        )));
    }
    Ok(name)
}

impl SystemRegion {
    /// Opens and maps the object; the region must lie within it.
    pub fn open(name: &str, key: &str, offset: u64, byte_size: u64) -> Result<SystemRegion> {
        let path = std::path::Path::new(SHM_DIR).join(object_name(key)?);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| {
                Error::invalid(format!(
                    "unable to open shared memory region '{name}': key '{key}' cannot be opened ({e})"
                ))
            })?;
        let end = offset
            .checked_add(byte_size)
            .ok_or_else(|| Error::invalid(format!("shared memory region '{name}': offset + byte_size overflows")))?;
        let size = file
            .metadata()
            .map_err(|e| Error::invalid(format!("shared memory region '{name}': cannot read its size ({e})")))?
            .len();
        if end > size {
            return Err(Error::invalid(format!(
                "shared memory region '{name}': offset {offset} + byte_size {byte_size} is beyond the {size} bytes of key '{key}'"
            )));
        }
        if byte_size == 0 {
            return Err(Error::invalid(format!(
                "shared memory region '{name}': byte_size must be positive"
            )));
        }
        let len = usize::try_from(end)
            .map_err(|_| Error::invalid(format!("shared memory region '{name}' is too large to map")))?;
        let map = MmapOptions::new()
            .len(len)
            .map_raw(&file)
            .map_err(|e| Error::invalid(format!("unable to map shared memory region '{name}': {e}")))?;
        Ok(SystemRegion {
            key: key.to_string(),
            offset,
            byte_size,
            file,
            map,
        })
    }

    /// Refuses to touch the mapping when its object has shrunk since registration: reading or
    /// writing past the end of a shared-memory object kills the process (SIGBUS).
    fn still_whole(&self, name: &str) -> Result<()> {
        let size = self.file.metadata().map(|m| m.len()).unwrap_or(0);
        if size < self.offset + self.byte_size {
            return Err(Error::invalid(format!(
                "shared memory region '{name}': key '{}' shrank to {size} bytes after it was registered",
                self.key
            )));
        }
        Ok(())
    }

    /// Copies `len` bytes at `at` (relative to the region's start; the caller checked the bounds).
    pub fn read(&self, name: &str, at: usize, len: usize) -> Result<Vec<u8>> {
        self.still_whole(name)?;
        let start = self.offset as usize + at;
        let mut out = vec![0u8; len];
        // SAFETY: start + len <= offset + byte_size == the mapping's length (checked by the caller
        // against byte_size) and the object still covers it; another process may write the bytes
        // concurrently, which is the shared-memory contract (a copy of whatever they hold).
        unsafe { std::ptr::copy_nonoverlapping(self.map.as_ptr().add(start), out.as_mut_ptr(), len) };
        Ok(out)
    }

    /// Writes `data` at `at` (relative to the region's start; the caller checked the bounds).
    pub fn write(&self, name: &str, at: usize, data: &[u8]) -> Result<()> {
        self.still_whole(name)?;
        let start = self.offset as usize + at;
        // SAFETY: as in `read`; the mapping is writable (opened read-write, mapped shared).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.map.as_mut_ptr().add(start), data.len()) };
        Ok(())
    }
}
