//! Shared memory for the tensor bytes of a link whose two ends run on the same host: a frame's
//! payload is copied once into an arena the receiver created, instead of travelling as QUIC packets.
//!
//! Each end of a link creates an *inbound* arena (a fresh, private file under `/dev/shm`) and offers
//! it in its hello or welcome, over the authenticated control stream. The peer opens the offered
//! file; when it exists and carries the offered id, both ends share a host, and the peer writes
//! large payloads into it. A peer on another host (or in another container) cannot open it, and
//! every frame keeps travelling over QUIC. Nothing else changes: the frame's prelude and header
//! still go over the stream, followed by a [`Descriptor`] in place of the payload.
//!
//! ```text
//! arena      header (64 bytes: magic, id) | slots ...
//! slot       state u64 | 56 bytes unused | payload (rounded up to 64 bytes)
//! state      seq << 2 | SENT / TAKEN / DONE (0: free or reclaimed)
//! ```
//!
//! The writer keeps its own list of the slots it handed out and reuses a slot once the reader
//! marked it DONE (or it is older than [`RECLAIM_AFTER`]); the reader claims a slot with a
//! compare-and-swap from SENT to TAKEN for the sequence number in the descriptor, copies the bytes
//! out and marks it DONE. So a slot is never read after it is reused, and neither side trusts
//! anything the other wrote into the arena beyond the bytes it copies: offsets are checked, and a
//! state word that does not match fails that one frame.
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use memmap2::MmapMut;

use super::msg::ArenaOffer;

/// Bytes of one inbound arena (one per link and direction). The file is sparse: memory is used for
/// the pages payloads have touched, at most this much per link.
pub const ARENA_BYTES: u64 = 128 << 20;
/// Payloads smaller than this travel inline: a few QUIC packets cost less than a slot's bookkeeping.
pub const MIN_PAYLOAD: u64 = 64 << 10;
/// A slot the reader has not marked done for this long is taken back (the frame was never read:
/// its stream was reset, or the request was abandoned). Far past any frame deadline.
pub const RECLAIM_AFTER: Duration = Duration::from_secs(60);
/// Where arenas are created: shared memory on Linux.
pub const DIR: &str = "/dev/shm";
/// Every arena file's name starts with this (the rest: creator pid and id), and an offered path
/// must be a file of this name directly in [`DIR`].
pub const PREFIX: &str = "mesh-link-";
/// Bytes of a descriptor on the wire: arena id (16), slot offset (8), sequence number (8).
pub const DESCRIPTOR_LEN: usize = 32;

const MAGIC: [u8; 8] = *b"MESHSHM1";
const HEADER: u64 = 64;
/// A slot's header, and the alignment of every slot: a payload keeps its tensors' 64-byte alignment.
const SLOT_HEADER: u64 = 64;
const SENT: u64 = 1;
const TAKEN: u64 = 2;
const DONE: u64 = 3;

/// Where a payload lies in the receiver's arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Descriptor {
    pub arena: u128,
    pub slot: u64,
    pub seq: u64,
}

impl Descriptor {
    pub fn encode(&self) -> [u8; DESCRIPTOR_LEN] {
        let mut b = [0u8; DESCRIPTOR_LEN];
        b[..16].copy_from_slice(&self.arena.to_le_bytes());
        b[16..24].copy_from_slice(&self.slot.to_le_bytes());
        b[24..].copy_from_slice(&self.seq.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; DESCRIPTOR_LEN]) -> Descriptor {
        let mut arena = [0u8; 16];
        arena.copy_from_slice(&b[..16]);
        let word = |r: std::ops::Range<usize>| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[r]);
            u64::from_le_bytes(w)
        };
        Descriptor {
            arena: u128::from_le_bytes(arena),
            slot: word(16..24),
            seq: word(24..32),
        }
    }
}

/// A mapping shared with another process; touched only through raw pointers and atomics.
struct Shared {
    _map: MmapMut,
    ptr: *mut u8,
    len: u64,
}

// SAFETY: the mapping lives as long as the struct; every access goes through `copy_*` of ranges
// checked against `len`, or through 8-byte-aligned atomics, which are sound under concurrent access
// by any process (a racing peer can only change what is copied, never what is accessed).
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

impl Shared {
    fn new(mut map: MmapMut) -> Shared {
        let (ptr, len) = (map.as_mut_ptr(), map.len() as u64);
        Shared { _map: map, ptr, len }
    }

    /// The state word of the slot at `slot` (checked: aligned, inside the arena).
    fn state(&self, slot: u64) -> &AtomicU64 {
        assert!(slot.is_multiple_of(8) && slot + 8 <= self.len);
        // SAFETY: in bounds and aligned (the map is page-aligned); AtomicU64 has u64's layout.
        unsafe { &*(self.ptr.add(slot as usize) as *const AtomicU64) }
    }
}

/// Opens a fresh file of this process's own: never an existing one, never through a symlink, 0600.
fn create_private(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// An arena this process created for a peer to write into; the file is removed when the peer first
/// wrote to it (it stays mapped on both sides) or when this drops.
pub struct Inbound {
    id: u128,
    shared: Shared,
    path: Mutex<Option<PathBuf>>,
}

impl Inbound {
    /// Creates an arena of `len` bytes in `dir`, after removing arenas there that processes which
    /// no longer exist left behind (a killed process cannot remove its own).
    pub fn create(dir: &Path, len: u64) -> io::Result<Inbound> {
        sweep(dir);
        let id = rand::random::<u128>() | 1;
        let path = dir.join(format!("{PREFIX}{}-{id:032x}", std::process::id()));
        let file = create_private(&path)?;
        let mut header = [0u8; 24];
        header[..8].copy_from_slice(&MAGIC);
        header[8..].copy_from_slice(&id.to_le_bytes());
        // Written through the file, so a full file system is an error here, not a SIGBUS.
        let made = file.set_len(len).and_then(|()| {
            use std::os::unix::fs::FileExt;
            file.write_all_at(&header, 0)
        });
        let made = made.and_then(|()| {
            // SAFETY: a file this process just created and sized; the peer only writes payload bytes
            // and state words into it, which are read with copies and atomics.
            unsafe { MmapMut::map_mut(&file) }
        });
        let map = match made {
            Ok(m) => m,
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
        };
        Ok(Inbound {
            id,
            shared: Shared::new(map),
            path: Mutex::new(Some(path)),
        })
    }

    pub fn id(&self) -> u128 {
        self.id
    }

    /// What the peer is told in the hello or welcome.
    pub fn offer(&self) -> Option<ArenaOffer> {
        let path = self.path.lock().unwrap_or_else(|p| p.into_inner()).clone()?;
        Some(ArenaOffer {
            path: path.to_string_lossy().into_owned(),
            id: self.id,
        })
    }

    fn unlink(&self) {
        if let Some(path) = self.path.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = std::fs::remove_file(path);
        }
    }

    /// Where the `len` payload bytes of the slot a descriptor names lie, if that is a slot of this
    /// arena: past the header, aligned, with its bytes inside the arena (every sum checked).
    fn payload(&self, d: &Descriptor, len: u64) -> Result<std::ops::Range<u64>, String> {
        let bad = |why: &str| format!("shared-memory payload at {}: {why}", d.slot);
        let end = d
            .slot
            .checked_add(SLOT_HEADER)
            .and_then(|s| s.checked_add(len))
            .filter(|&end| end <= self.shared.len)
            .ok_or_else(|| bad("outside the arena"))?;
        if d.slot < HEADER || !d.slot.is_multiple_of(SLOT_HEADER) || d.seq == 0 || d.seq >= 1 << 62 {
            return Err(bad("not a slot"));
        }
        Ok(end - len..end)
    }

    /// Frees the slot of a payload this process will not read (its budget refused the frame).
    pub fn refuse(&self, d: &Descriptor) {
        if self.payload(d, 0).is_ok() {
            let _ = self.shared.state(d.slot).compare_exchange(
                d.seq << 2 | SENT,
                d.seq << 2 | DONE,
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
        }
    }

    /// Copies `len` payload bytes out of the slot the descriptor names, and frees the slot; says why
    /// not when the descriptor names no slot written for it.
    pub fn take<const A: usize>(
        &self,
        d: &Descriptor,
        len: u64,
        into: &mut rkyv::util::AlignedVec<A>,
    ) -> Result<(), String> {
        let bytes = self.payload(d, len)?;
        // The peer reached the file, so it no longer needs its name.
        self.unlink();
        let state = self.shared.state(d.slot);
        state
            .compare_exchange(
                d.seq << 2 | SENT,
                d.seq << 2 | TAKEN,
                Ordering::Acquire,
                Ordering::Relaxed,
            )
            .map_err(|_| {
                format!(
                    "shared-memory payload at {}: not written, or already taken back",
                    d.slot
                )
            })?;
        // SAFETY: `bytes` lies inside the mapping (`payload` checked it); `into` has room reserved
        // by the caller for `len` more bytes, and the two never overlap (one is this process's heap).
        unsafe {
            let from = std::slice::from_raw_parts(self.shared.ptr.add(bytes.start as usize), len as usize);
            into.extend_from_slice(from);
        }
        state.store(d.seq << 2 | DONE, Ordering::Release);
        metrics::counter!("mesh_link_shared_memory_bytes_total", "direction" => "received").increment(len);
        Ok(())
    }
}

impl Drop for Inbound {
    fn drop(&mut self) {
        self.unlink();
    }
}

/// Removes arena files in `dir` whose creator process is gone.
fn sweep(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// One slot this writer handed out and the reader has not given back yet.
struct Slot {
    at: u64,
    size: u64,
    seq: u64,
    sent: Instant,
}

#[derive(Default)]
struct Ring {
    live: VecDeque<Slot>,
    seq: u64,
}

/// A peer's inbound arena, mapped by this process to write payloads into.
pub struct Outbound {
    id: u128,
    shared: Shared,
    ring: Mutex<Ring>,
    /// The arena's file, to reserve a slot's pages before writing to them.
    file: File,
}

impl Outbound {
    /// Maps the arena a peer offered, if this process can reach it: a file named as arenas are,
    /// directly in `dir`, not a symlink, of `len` bytes, carrying the offered id.
    pub fn open(offer: &ArenaOffer, dir: &Path, len: u64) -> Result<Outbound, String> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = Path::new(&offer.path);
        let named = path.parent() == Some(dir)
            && path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(PREFIX) && !n.contains(['/', '\\']));
        if !named {
            return Err(format!("'{}' is not an arena path under {}", offer.path, dir.display()));
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(|e| format!("cannot open {}: {e}", offer.path))?;
        let meta = file.metadata().map_err(|e| e.to_string())?;
        if !meta.is_file() || meta.len() != len {
            return Err(format!("{} is not an arena of {len} bytes", offer.path));
        }
        // SAFETY: a regular file of the expected size; accessed only by checked copies and atomics.
        let map = unsafe { MmapMut::map_mut(&file) }.map_err(|e| e.to_string())?;
        if map[..8] != MAGIC || map[8..24] != offer.id.to_le_bytes() {
            return Err(format!("{} does not carry the offered arena id", offer.path));
        }
        Ok(Outbound {
            id: offer.id,
            shared: Shared::new(map),
            ring: Mutex::new(Ring::default()),
            file,
        })
    }

    /// Copies a payload (the parts in order, `len` bytes in all) into a free slot and returns where
    /// it lies; `None` when the arena has no room now (the frame then travels inline).
    pub fn put(&self, parts: &[Bytes], len: u64) -> Option<Descriptor> {
        let size = SLOT_HEADER + len.div_ceil(SLOT_HEADER) * SLOT_HEADER;
        let (at, seq) = {
            let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
            self.reclaim(&mut ring, Instant::now());
            let at = place(&ring.live, size, self.shared.len)?;
            // A sparse file's pages are allocated as they are first written; on a full /dev/shm
            // that write would be a SIGBUS. Reserving them first turns it into an error, and the
            // frame travels inline.
            if let Err(e) = self.reserve(at, size) {
                tracing::debug!("no room in the arena's file system for {size} bytes, sending inline: {e}");
                return None;
            }
            ring.seq += 1;
            let seq = ring.seq;
            ring.live.push_back(Slot {
                at,
                size,
                seq,
                sent: Instant::now(),
            });
            (at, seq)
        };
        let mut to = at + SLOT_HEADER;
        for part in parts {
            // SAFETY: the slot `at..at+size` is inside the mapping (`place` checked it) and this
            // writer's alone until the reader gives it back; `len` bytes of parts fit in it.
            unsafe {
                std::ptr::copy_nonoverlapping(part.as_ptr(), self.shared.ptr.add(to as usize), part.len());
            }
            to += part.len() as u64;
        }
        debug_assert_eq!(to, at + SLOT_HEADER + len);
        self.shared.state(at).store(seq << 2 | SENT, Ordering::Release);
        metrics::counter!("mesh_link_shared_memory_bytes_total", "direction" => "sent").increment(len);
        Some(Descriptor {
            arena: self.id,
            slot: at,
            seq,
        })
    }

    /// Allocates the file's pages under `at..at + size` (a no-op for pages already there).
    fn reserve(&self, at: u64, size: u64) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let (at, size) = (at as libc::off_t, size as libc::off_t);
        // SAFETY: a plain syscall on an open descriptor this struct owns.
        match unsafe { libc::fallocate(self.file.as_raw_fd(), 0, at, size) } {
            0 => Ok(()),
            _ => Err(io::Error::last_os_error()),
        }
    }

    /// Frees the oldest slots the reader gave back, and those abandoned for [`RECLAIM_AFTER`].
    fn reclaim(&self, ring: &mut Ring, now: Instant) {
        while let Some(s) = ring.live.front() {
            let state = self.shared.state(s.at);
            let word = state.load(Ordering::Acquire);
            // A slot being copied out is never taken back; any other word past the limit is (a
            // compare-and-swap, so a reader claiming it meanwhile keeps it).
            let free = word == s.seq << 2 | DONE
                || (now.duration_since(s.sent) >= RECLAIM_AFTER
                    && word != s.seq << 2 | TAKEN
                    && state
                        .compare_exchange(word, 0, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok());
            if !free {
                return;
            }
            ring.live.pop_front();
        }
    }

    /// Payload bytes in slots not given back yet.
    #[cfg(test)]
    fn held(&self) -> u64 {
        self.ring
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .live
            .iter()
            .map(|s| s.size)
            .sum()
    }
}

/// Where a slot of `size` bytes fits after the live slots (a ring: oldest first), if anywhere.
fn place(live: &VecDeque<Slot>, size: u64, len: u64) -> Option<u64> {
    let (Some(first), Some(last)) = (live.front(), live.back()) else {
        return (HEADER + size <= len).then_some(HEADER);
    };
    let end = last.at + last.size;
    if last.at >= first.at {
        // Not wrapped: after the newest, else from the start up to the oldest.
        if end + size <= len {
            Some(end)
        } else {
            (HEADER + size <= first.at).then_some(HEADER)
        }
    } else {
        (end + size <= first.at).then_some(end)
    }
}

/// The inbound arenas of this process's links, by id: a frame's descriptor names the one it uses.
pub struct Arenas {
    inbound: Mutex<HashMap<u128, Arc<Inbound>>>,
    /// Shared memory off (`--cluster-shared-memory false`): no arena is offered or opened.
    pub off: bool,
    /// Where arenas are made and looked for ([`DIR`]).
    dir: PathBuf,
    /// Bytes of each arena ([`ARENA_BYTES`]).
    len: u64,
}

impl Default for Arenas {
    fn default() -> Self {
        Arenas::in_dir(Path::new(DIR), ARENA_BYTES)
    }
}

impl std::fmt::Debug for Arenas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arenas").field("off", &self.off).finish_non_exhaustive()
    }
}

/// An inbound arena registered for reading; unregistered (and removed) when the link drops it.
pub struct Registered {
    arenas: Arc<Arenas>,
    inbound: Arc<Inbound>,
}

impl Registered {
    pub fn offer(&self) -> Option<ArenaOffer> {
        self.inbound.offer()
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.arenas
            .inbound
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.inbound.id);
    }
}

impl Arenas {
    pub fn off() -> Arenas {
        Arenas {
            off: true,
            ..Arenas::default()
        }
    }

    /// Arenas of `len` bytes in `dir` (tests use a directory of their own).
    pub fn in_dir(dir: &Path, len: u64) -> Arenas {
        Arenas {
            inbound: Mutex::default(),
            off: false,
            dir: dir.to_path_buf(),
            len,
        }
    }

    /// Creates and registers an inbound arena for a new link; `None` (logged) when shared memory is
    /// off or cannot be had here, and the link carries every payload inline.
    pub fn inbound(self: &Arc<Self>) -> Option<Registered> {
        if self.off {
            return None;
        }
        match Inbound::create(&self.dir, self.len) {
            Ok(a) => {
                let inbound = Arc::new(a);
                let mut map = self.inbound.lock().unwrap_or_else(|p| p.into_inner());
                map.insert(inbound.id, inbound.clone());
                Some(Registered {
                    arenas: self.clone(),
                    inbound,
                })
            }
            Err(e) => {
                let dir = self.dir.display();
                tracing::info!(
                    "no shared memory for this link (tensors travel over QUIC): cannot create an arena in {dir}: {e}"
                );
                None
            }
        }
    }

    /// Maps the arena a peer offered; `None` when there is none or it is on another host.
    pub fn outbound(&self, offer: Option<&ArenaOffer>, peer: &str) -> Option<Arc<Outbound>> {
        if self.off {
            return None;
        }
        match Outbound::open(offer?, &self.dir, self.len) {
            Ok(o) => {
                tracing::info!(
                    peer,
                    "same host: tensors of {} KiB and more go to {peer} through shared memory",
                    MIN_PAYLOAD >> 10
                );
                Some(Arc::new(o))
            }
            Err(e) => {
                tracing::debug!(peer, "tensors go to {peer} over QUIC: {e}");
                None
            }
        }
    }

    /// The registered arena a descriptor names.
    pub fn find(&self, id: u128) -> Result<Arc<Inbound>, String> {
        let map = self.inbound.lock().unwrap_or_else(|p| p.into_inner());
        map.get(&id)
            .cloned()
            .ok_or_else(|| format!("no shared-memory arena {id:032x} on this link"))
    }
}

#[cfg(test)]
#[path = "shm_tests.rs"]
mod tests;
