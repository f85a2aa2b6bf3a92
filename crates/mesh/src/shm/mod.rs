//! The shared-memory extensions: named regions (system `/dev/shm` objects or CUDA IPC memory) a
//! client registers once, then names in requests instead of carrying tensor bytes. One registry
//! serves HTTP and gRPC alike, on a node or a router; a region being used by a request stays
//! mapped until that request is done, even when it is unregistered meanwhile.
mod cuda;
mod system;

/// Regions one server holds at most (each keeps a descriptor open).
pub const MAX_REGIONS: usize = 512;

/// The start of the /dev/shm names a mesh-node creates for its Python stubs (followed by its pid
/// and 128 random bits); a client's registration of such a key is refused.
pub const OWN_SHM_PREFIX: &str = "mesh-node-";

use crate::sync::Locked;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::error::{Code, Error, Result};
use crate::request::{Param, Params};

pub use cuda::HANDLE_SIZE as CUDA_HANDLE_SIZE;

/// The request parameters that point an input or output at a region.
pub const REGION: &str = "shared_memory_region";
pub const BYTE_SIZE: &str = "shared_memory_byte_size";
pub const OFFSET: &str = "shared_memory_offset";

enum Memory {
    System(system::SystemRegion),
    Cuda(cuda::CudaRegion),
}

struct Region {
    name: String,
    memory: Memory,
}

impl Region {
    fn byte_size(&self) -> u64 {
        match &self.memory {
            Memory::System(r) => r.byte_size,
            Memory::Cuda(r) => r.byte_size,
        }
    }
}

/// A system region as the status endpoints report it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SystemStatus {
    pub name: String,
    pub key: String,
    pub offset: u64,
    pub byte_size: u64,
}

/// A CUDA region as the status endpoints report it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CudaStatus {
    pub name: String,
    pub device_id: i64,
    pub byte_size: u64,
}

/// Every registered region of the server, by name (system and CUDA share one namespace).
pub struct SharedMemory {
    regions: Mutex<BTreeMap<String, Arc<Region>>>,
    limit: usize,
}

impl Default for SharedMemory {
    fn default() -> Self {
        SharedMemory::with_limit(MAX_REGIONS)
    }
}

impl SharedMemory {
    /// A registry holding at most `limit` regions.
    pub fn with_limit(limit: usize) -> Self {
        SharedMemory {
            regions: Mutex::default(),
            limit,
        }
    }

    fn regions(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<Region>>> {
        self.regions.locked()
    }

    /// A region needs a name: Triton's words and class (its HTTP's; its gRPC would register a
    /// nameless region, which no request could then name).
    pub fn require_name(name: &str, kind: &str) -> Result<()> {
        match name.is_empty() {
            true => Err(Error::invalid(format!(
                "'region name' is necessary to register {kind} shared memory region"
            ))),
            false => Ok(()),
        }
    }

    fn refuse_taken(&self, name: &str) -> Result<()> {
        let regions = self.regions();
        if regions.contains_key(name) {
            return Err(Error::new(
                Code::AlreadyExists,
                format!("shared memory region '{name}' already in manager"),
            ));
        }
        if regions.len() >= self.limit {
            return Err(Error::invalid(format!(
                "cannot register shared memory region '{name}': {} regions are registered already; unregister some",
                self.limit
            )));
        }
        Ok(())
    }

    fn insert(&self, name: &str, memory: Memory) -> Result<()> {
        let mut regions = self.regions();
        if regions.contains_key(name) || regions.len() >= self.limit {
            return Err(Error::new(
                Code::AlreadyExists,
                format!("shared memory region '{name}' already in manager"),
            ));
        }
        let region = Region {
            name: name.to_string(),
            memory,
        };
        regions.insert(name.to_string(), Arc::new(region));
        Ok(())
    }

    /// Registers `byte_size` bytes from `offset` of the system shared-memory object `key`. The
    /// checks run in Triton's order (the name taken, the key opened, then the region's bounds), so a
    /// registration with neither name nor key gets its `Unable to open shared memory region: ''`.
    pub fn register_system(&self, name: &str, key: &str, offset: u64, byte_size: u64) -> Result<()> {
        self.refuse_taken(name)?;
        let region = system::SystemRegion::open(name, key, offset, byte_size)?;
        Self::require_name(name, "system")?;
        self.insert(name, Memory::System(region))
    }

    /// Registers CUDA memory exported by another process (`raw_handle` is its cudaIpcMemHandle_t);
    /// a malformed handle is Triton's `failed to register shared memory region ...: invalid args`
    /// whatever the name.
    pub fn register_cuda(&self, name: &str, raw_handle: &[u8], device_id: i64, byte_size: u64) -> Result<()> {
        self.refuse_taken(name)?;
        let region = cuda::CudaRegion::open(name, raw_handle, device_id, byte_size)?;
        Self::require_name(name, "cuda")?;
        self.insert(name, Memory::Cuda(region))
    }

    /// Unregisters one region of the kind (`cuda` false: system), or every one of it when `name`
    /// is empty. A region an inference is using stays, with Triton's error (`Cannot unregister
    /// shared memory region 'X', it is currently in use.`); unregistering all of a kind removes the
    /// others and names those.
    fn unregister(&self, name: &str, cuda: bool) -> Result<()> {
        let is_kind = |r: &Region| matches!(r.memory, Memory::Cuda(_)) == cuda;
        // The registry holds one reference; each request using the region holds another.
        let in_use = |r: &Arc<Region>| Arc::strong_count(r) > 1;
        let busy = |name: &str| {
            Error::invalid(format!(
                "Cannot unregister shared memory region '{name}', it is currently in use."
            ))
        };
        let mut regions = self.regions();
        if name.is_empty() {
            let mut kept = Vec::new();
            regions.retain(|n, r| {
                let keep = !is_kind(r) || in_use(r);
                if is_kind(r) && in_use(r) {
                    kept.push(n.clone());
                }
                keep
            });
            return match kept.is_empty() {
                true => Ok(()),
                // Triton's words and separator.
                false => Err(Error::invalid(format!(
                    "Failed to unregister the following {} shared memory regions: {}",
                    if cuda { "cuda" } else { "system" },
                    kept.join(" ,")
                ))),
            };
        }
        match regions.get(name) {
            Some(r) if is_kind(r) && in_use(r) => Err(busy(name)),
            Some(r) if is_kind(r) => {
                regions.remove(name);
                Ok(())
            }
            Some(_) => Err(Error::invalid(format!(
                "shared memory region '{name}' is not a {} region",
                if cuda { "CUDA" } else { "system" }
            ))),
            None => Ok(()),
        }
    }

    pub fn unregister_system(&self, name: &str) -> Result<()> {
        self.unregister(name, false)
    }

    pub fn unregister_cuda(&self, name: &str) -> Result<()> {
        self.unregister(name, true)
    }

    /// The regions of one kind (`name` empty: all of them), or an error naming an unknown region.
    fn status<T>(&self, name: &str, kind: &str, pick: impl Fn(&Region) -> Option<T>) -> Result<Vec<T>> {
        let regions = self.regions();
        if name.is_empty() {
            return Ok(regions.values().filter_map(|r| pick(r)).collect());
        }
        regions
            .get(name)
            .and_then(|r| pick(r))
            .map(|s| vec![s])
            .ok_or_else(|| Error::not_found(format!("Unable to find {kind} shared memory region: '{name}'")))
    }

    pub fn system_status(&self, name: &str) -> Result<Vec<SystemStatus>> {
        self.status(name, "system", |r| match &r.memory {
            Memory::System(s) => Some(SystemStatus {
                name: r.name.clone(),
                key: s.key.clone(),
                offset: s.offset,
                byte_size: s.byte_size,
            }),
            Memory::Cuda(_) => None,
        })
    }

    pub fn cuda_status(&self, name: &str) -> Result<Vec<CudaStatus>> {
        self.status(name, "cuda", |r| match &r.memory {
            Memory::Cuda(c) => Some(CudaStatus {
                name: r.name.clone(),
                device_id: c.device_id,
                byte_size: c.byte_size,
            }),
            Memory::System(_) => None,
        })
    }

    /// Takes the shared-memory parameters out of an input's or output's `params` and resolves the
    /// region they name; None when there are none. `kind` ("input", "output") and `tensor` name it
    /// in errors.
    pub fn take_ref(&self, kind: &str, tensor: &str, params: &mut Params) -> Result<Option<ShmRef>> {
        if params.is_empty() {
            return Ok(None);
        }
        let what = format!("{kind} '{tensor}'");
        let mut take = |key: &str| params.iter().position(|(k, _)| k == key).map(|i| params.remove(i).1);
        let (region, size, offset) = (take(REGION), take(BYTE_SIZE), take(OFFSET));
        let Some(region) = region else {
            if size.is_some() || offset.is_some() {
                return Err(Error::invalid(format!(
                    "{what}: '{BYTE_SIZE}' or '{OFFSET}' given without '{REGION}'"
                )));
            }
            return Ok(None);
        };
        let Param::String(name) = region else {
            return Err(Error::invalid(format!("{what}: '{REGION}' must be a string")));
        };
        let number = |key: &str, value: Option<Param>| -> Result<Option<u64>> {
            value
                .map(|v| {
                    v.as_u64()
                        .ok_or_else(|| Error::invalid(format!("{what}: '{key}' must be a non-negative integer")))
                })
                .transpose()
        };
        let byte_size = number(BYTE_SIZE, size)?
            .ok_or_else(|| Error::invalid(format!("{what}: '{REGION}' needs '{BYTE_SIZE}' as well")))?;
        let offset = number(OFFSET, offset)?.unwrap_or(0);
        let region = self.regions().get(&name).cloned().ok_or_else(|| {
            Error::not_found(format!(
                "Unable to find shared memory region: '{name}' (named by {what})"
            ))
        })?;
        let total = region.byte_size();
        // Triton's words first (its clients' tests match on them), then what was asked.
        if offset >= total && total > 0 {
            return Err(Error::invalid(format!(
                "Invalid offset for shared memory region: '{name}' ({what}: offset {offset} is past its {total} bytes)"
            )));
        }
        if offset.checked_add(byte_size).is_none_or(|end| end > total) {
            return Err(Error::invalid(format!(
                "Invalid offset + byte size for shared memory region: '{name}' ({what}: offset {offset} + byte size {byte_size} is beyond the {total} bytes of shared memory region '{name}')"
            )));
        }
        // Both fit in the region, which is mapped in this process, so they fit in usize.
        Ok(Some(ShmRef {
            region,
            offset: offset as usize,
            byte_size: byte_size as usize,
        }))
    }
}

/// The regions one request uses: the outputs to be written to shared memory, by output name, and
/// the input regions it was read from. Both stay in use, as Triton holds them, until the request's
/// answer is out (the value is dropped), so none can be unregistered meanwhile.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShmInUse {
    outputs: Vec<(String, ShmRef)>,
    inputs: Vec<ShmRef>,
}

impl ShmInUse {
    pub fn new() -> Self {
        Self::default()
    }

    /// Output `name` is to be written to `region`.
    pub fn push_output(&mut self, name: String, region: ShmRef) {
        self.outputs.push((name, region));
    }

    /// An input was read from `region`: it stays in use until the answer is out.
    pub fn hold_input(&mut self, region: ShmRef) {
        self.inputs.push(region);
    }

    /// Where output `name` is to be written, if in shared memory.
    pub fn target(&self, name: &str) -> Option<&ShmRef> {
        self.outputs.iter().find(|(n, _)| n == name).map(|(_, r)| r)
    }
}

/// Part of a registered region, named by one input or output of a request.
#[derive(Clone)]
pub struct ShmRef {
    region: Arc<Region>,
    offset: usize,
    byte_size: usize,
}

impl std::fmt::Debug for ShmRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ShmRef({}, {}+{})", self.region.name, self.offset, self.byte_size)
    }
}

impl PartialEq for ShmRef {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.region, &other.region) && self.offset == other.offset && self.byte_size == other.byte_size
    }
}

impl ShmRef {
    /// An input's bytes: its size is checked against its type and shape first (for types of
    /// fixed size), so nothing is read, or allocated, for a size the tensor cannot have.
    pub fn read_input(&self, model: &str, input: &str, dtype: crate::DataType, shape: &[i64]) -> Result<Bytes> {
        let want =
            crate::tensor::byte_size(dtype, shape).map_err(|e| Error::invalid(format!("input '{input}': {e}")))?;
        if let Some(want) = want.filter(|&n| n != self.byte_size) {
            return Err(Error::invalid(format!(
                "input byte size mismatch for input '{input}' for model '{model}'. Expected {want}, got {}",
                self.byte_size
            )));
        }
        self.read()
    }

    /// The bytes this reference covers, copied out of the region.
    pub fn read(&self) -> Result<Bytes> {
        let name = &self.region.name;
        let data = match &self.region.memory {
            Memory::System(r) => r.read(name, self.offset, self.byte_size)?,
            Memory::Cuda(r) => r.read(name, self.offset, self.byte_size)?,
        };
        Ok(Bytes::from(data))
    }

    /// Writes an output's bytes at the start of this reference, which must hold them.
    pub fn write(&self, output: &str, data: &[u8]) -> Result<()> {
        let name = &self.region.name;
        if data.len() > self.byte_size {
            return Err(Error::invalid(format!(
                "shared memory size specified with the request for output '{output}' ({} bytes) should be at least {} bytes to hold the results (shared memory region '{name}')",
                self.byte_size,
                data.len()
            )));
        }
        match &self.region.memory {
            Memory::System(r) => r.write(name, self.offset, data),
            Memory::Cuda(r) => r.write(name, self.offset, data),
        }
    }
}

#[cfg(test)]
mod tests;
