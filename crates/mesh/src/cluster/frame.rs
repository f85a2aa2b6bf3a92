//! Frames of the cluster link: a 16-byte prelude, an rkyv-archived header, then tensor bytes at
//! aligned offsets; every length is checked against limits before anything is allocated.
//!
//! ```text
//! prelude   "MSH" | version u8 | header_len u32 LE | payload_len u64 LE
//! header    header_len bytes: a validated rkyv archive of `msg::Message`
//! payload   payload_len bytes: tensors, each at a multiple of TENSOR_ALIGN
//! ```
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::msg::Message;

/// The frame format's magic, the first three bytes of every frame.
pub const MAGIC: [u8; 3] = *b"MSH";
/// The protocol version this build speaks; a frame with another one is refused with a reason.
pub const PROTOCOL_VERSION: u8 = 7;
pub const PRELUDE_LEN: usize = 16;
/// Set in a prelude's `header_len`: the payload lies in the receiver's shared-memory arena, and a
/// `shm::Descriptor` follows the header in its place (`payload_len` still counts its bytes).
pub const SHARED: u32 = 1 << 31;
/// Every tensor starts at a multiple of this in the payload, so the receive buffer (allocated with
/// this alignment) hands backends aligned slices.
pub const TENSOR_ALIGN: usize = 64;
/// Most dimensions a tensor shape may have on the link.
pub const MAX_DIMS: usize = 64;

/// Size limits every received frame is checked against before any allocation.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest archived header (the hello carries every model's config, so this is generous).
    pub max_header: u32,
    /// Largest payload (the tensors of one request or answer).
    pub max_payload: u64,
    /// Payload bytes all links of this process may hold at once, received or being received; a
    /// frame past it is refused as overloaded before its buffer is reserved. Shared by clones.
    pub budget: Arc<Budget>,
    /// A frame whose prelude reserved budget must deliver its header and payload within this plus
    /// one second per [`MIN_FRAME_RATE`] bytes, or the stream is reset and the budget returned:
    /// a peer cannot hold reservations by declaring a payload and sending it slowly.
    pub frame_deadline: Duration,
    /// The inbound shared-memory arenas of this process's links, where payloads named by a
    /// descriptor lie (`shm`). Shared by clones.
    pub arenas: Arc<super::shm::Arenas>,
}

/// The slowest rate, in bytes per second, at which a reserved frame may arrive.
pub const MIN_FRAME_RATE: u64 = 8 << 20;

impl Limits {
    /// How long a frame of `bytes` may take to arrive once its prelude is read.
    pub fn deadline(&self, bytes: u64) -> Duration {
        self.frame_deadline + Duration::from_secs_f64(bytes as f64 / MIN_FRAME_RATE as f64)
    }

    /// The limits of one link: a receive budget of its own, [`LINK_SHARE`] of the process's, whose
    /// reservations count against the process's too, so one peer cannot take the others' room.
    pub fn for_link(&self) -> Limits {
        Limits {
            budget: self.budget.for_link(self.budget.limit() / LINK_SHARE),
            ..self.clone()
        }
    }
}

/// A link may hold at most this fraction (one over it) of the process's receive budget.
pub const LINK_SHARE: u64 = 2;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_header: 16 << 20,
            max_payload: 1 << 30,
            budget: Arc::new(Budget::new(DEFAULT_BUDGET)),
            frame_deadline: Duration::from_secs(10),
            arenas: Arc::new(super::shm::Arenas::default()),
        }
    }
}

/// The receive budget of a process by default (`Limits::budget`).
pub const DEFAULT_BUDGET: u64 = 2 << 30;

/// How often a reservation that waits for room looks again.
const BUSY_RECHECK: Duration = Duration::from_millis(10);

/// Payload bytes held by received frames, against a limit: a peer can make this process reserve
/// at most the budget, however many streams declare large payloads and then send nothing. A link
/// has a budget of its own ([`Budget::for_link`]) whose reservations count against the process's
/// too, so one peer's streams can only exhaust its own.
#[derive(Debug)]
pub struct Budget {
    used: AtomicU64,
    limit: u64,
    /// The process's budget, for a link's.
    parent: Option<Arc<Budget>>,
}

/// Bytes admitted by the budget; released when dropped (with the last slice of the payload).
#[derive(Debug)]
pub struct Reserved {
    budget: Arc<Budget>,
    bytes: u64,
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.budget.give(self.bytes);
        if let Some(parent) = &self.budget.parent {
            parent.give(self.bytes);
        }
    }
}

impl Budget {
    pub fn new(limit: u64) -> Self {
        Budget {
            used: AtomicU64::new(0),
            limit,
            parent: None,
        }
    }

    /// A budget of `limit` bytes for one link, whose reservations also count against this one.
    pub fn for_link(self: &Arc<Self>, limit: u64) -> Arc<Budget> {
        Arc::new(Budget {
            used: AtomicU64::new(0),
            limit: limit.min(self.limit),
            parent: Some(self.clone()),
        })
    }

    /// Admits `bytes` (here and in the process's budget, for a link's) or says which one is busy.
    pub fn reserve(self: &Arc<Self>, bytes: u64) -> Result<Reserved, FrameError> {
        self.take(bytes)?;
        if let Some(parent) = &self.parent {
            if let Err(e) = parent.take(bytes) {
                self.give(bytes);
                return Err(e);
            }
        }
        Ok(Reserved {
            budget: self.clone(),
            bytes,
        })
    }

    /// Takes `bytes` from this budget alone.
    fn take(&self, bytes: u64) -> Result<(), FrameError> {
        // Compare-and-swap, so a large reservation that fails never makes a small one fail with it.
        let mut held = self.used.load(Ordering::Acquire);
        loop {
            let after = held
                .checked_add(bytes)
                .filter(|&n| n <= self.limit)
                .ok_or(FrameError::Busy {
                    bytes,
                    held,
                    limit: self.limit,
                })?;
            match self
                .used
                .compare_exchange_weak(held, after, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok(()),
                Err(now) => held = now,
            }
        }
    }

    fn give(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Admits `bytes`, waiting while the budget is full (back-pressure: the peer waits behind the
    /// transport's flow control), for a stream that must not fail for being busy (a link's control
    /// stream). A frame larger than the budget could never fit and is refused at once.
    pub async fn reserve_waiting(self: &Arc<Self>, bytes: u64) -> Result<Reserved, FrameError> {
        loop {
            match self.reserve(bytes) {
                Err(FrameError::Busy { limit, .. }) if bytes <= limit => {
                    tokio::time::sleep(BUSY_RECHECK).await;
                }
                other => return other,
            }
        }
    }

    /// Payload bytes held now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// Bytes it admits at most.
    pub fn limit(&self) -> u64 {
        self.limit
    }
}

/// What is wrong with a frame or the stream it came on; each ends that stream (or, on the control
/// stream, the connection) cleanly.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("not a mesh cluster frame (bad magic {0:02x?})")]
    NotMesh([u8; 3]),
    #[error("protocol version {got} is not supported; this build speaks version {PROTOCOL_VERSION}")]
    Version { got: u8 },
    #[error("{what} of {len} bytes is larger than the link's limit of {limit} bytes")]
    TooLarge { what: &'static str, len: u64, limit: u64 },
    #[error("the stream ended inside a frame ({got} of {expected} bytes)")]
    Truncated { expected: u64, got: u64 },
    #[error("corrupt frame header: {0}")]
    Corrupt(String),
    #[error("invalid frame: {0}")]
    Invalid(String),
    #[error("link error: {0}")]
    Io(String),
    #[error("busy: a {bytes}-byte frame would pass the link's receive budget ({held} of {limit} bytes held)")]
    Busy { bytes: u64, held: u64, limit: u64 },
    #[error("a frame of {bytes} bytes did not arrive within {} ms of its prelude", .after.as_millis())]
    Slow { bytes: u64, after: Duration },
}

impl From<FrameError> for crate::Error {
    fn from(e: FrameError) -> Self {
        match e {
            FrameError::Io(_) | FrameError::Truncated { .. } | FrameError::Slow { .. } => {
                crate::Error::unavailable(e.to_string())
            }
            FrameError::Busy { .. } => crate::Error::overloaded(e.to_string()),
            _ => crate::Error::invalid(e.to_string()),
        }
    }
}

/// The fixed start of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prelude {
    pub version: u8,
    pub header_len: u32,
    pub payload_len: u64,
}

impl Prelude {
    /// The payload lies in shared memory (see [`SHARED`]).
    pub fn shared(&self) -> bool {
        self.header_len & SHARED != 0
    }

    /// The header's length in bytes.
    pub fn header_bytes(&self) -> u32 {
        self.header_len & !SHARED
    }

    pub fn encode(&self) -> [u8; PRELUDE_LEN] {
        let mut b = [0u8; PRELUDE_LEN];
        b[..3].copy_from_slice(&MAGIC);
        b[3] = self.version;
        b[4..8].copy_from_slice(&self.header_len.to_le_bytes());
        b[8..16].copy_from_slice(&self.payload_len.to_le_bytes());
        b
    }

    /// The fields of a prelude, unchecked (for a frame this process encoded itself).
    pub fn read(b: &[u8; PRELUDE_LEN]) -> Prelude {
        Prelude {
            version: b[3],
            header_len: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            payload_len: u64::from_le_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]),
        }
    }

    /// Reads a prelude and checks magic, version and both lengths against `limits`.
    pub fn decode(b: &[u8; PRELUDE_LEN], limits: &Limits) -> Result<Prelude, FrameError> {
        let magic = [b[0], b[1], b[2]];
        if magic != MAGIC {
            return Err(FrameError::NotMesh(magic));
        }
        let p = Prelude::read(b);
        if p.version != PROTOCOL_VERSION {
            return Err(FrameError::Version { got: p.version });
        }
        if p.header_bytes() == 0 || p.header_bytes() > limits.max_header {
            return Err(FrameError::TooLarge {
                what: "frame header",
                len: p.header_bytes().into(),
                limit: limits.max_header.into(),
            });
        }
        if p.payload_len > limits.max_payload {
            return Err(FrameError::TooLarge {
                what: "frame payload",
                len: p.payload_len,
                limit: limits.max_payload,
            });
        }
        Ok(p)
    }
}

/// The tensor bytes of a frame being built: shared `Bytes`, placed at aligned offsets (no copies).
#[derive(Debug, Default)]
pub struct Payload {
    parts: Vec<Bytes>,
    len: u64,
}

static ZEROS: [u8; TENSOR_ALIGN] = [0; TENSOR_ALIGN];

impl Payload {
    /// Appends one tensor's bytes after padding to `TENSOR_ALIGN`; returns its offset and length.
    pub fn push(&mut self, data: Bytes) -> (u64, u64) {
        let pad = (TENSOR_ALIGN as u64 - self.len % TENSOR_ALIGN as u64) % TENSOR_ALIGN as u64;
        if pad > 0 && !data.is_empty() {
            self.parts.push(Bytes::from_static(&ZEROS[..pad as usize]));
            self.len += pad;
        }
        let at = self.len;
        let len = data.len() as u64;
        if len > 0 {
            self.parts.push(data);
            self.len += len;
        }
        (at, len)
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Encodes a frame as the chunks to write: prelude and header in one, then the payload's parts as
/// they are. A frame over `limits` is refused here, before anything is sent.
pub fn encode(message: &Message, payload: Payload, limits: &Limits) -> Result<Vec<Bytes>, FrameError> {
    let header = rkyv::to_bytes::<rkyv::rancor::Error>(message)
        .map_err(|e| FrameError::Invalid(format!("cannot archive the frame header: {e}")))?;
    let header_len = u32::try_from(header.len())
        .ok()
        .filter(|&n| n <= limits.max_header)
        .ok_or(FrameError::TooLarge {
            what: "frame header",
            len: header.len() as u64,
            limit: limits.max_header.into(),
        })?;
    if payload.len > limits.max_payload {
        return Err(FrameError::TooLarge {
            what: "frame payload",
            len: payload.len,
            limit: limits.max_payload,
        });
    }
    let prelude = Prelude {
        version: PROTOCOL_VERSION,
        header_len,
        payload_len: payload.len,
    };
    let mut first = Vec::with_capacity(PRELUDE_LEN + header.len());
    first.extend_from_slice(&prelude.encode());
    first.extend_from_slice(&header);
    let mut chunks = Vec::with_capacity(1 + payload.parts.len());
    chunks.push(Bytes::from(first));
    chunks.extend(payload.parts);
    Ok(chunks)
}

/// Validates an archived header (bytecheck, never unchecked access) and deserializes it. `header`
/// must be 16-byte aligned, as an `rkyv::util::AlignedVec` is.
pub fn decode_header(header: &[u8]) -> Result<Message, FrameError> {
    rkyv::from_bytes::<Message, rkyv::rancor::Error>(header).map_err(|e| FrameError::Corrupt(e.to_string()))
}

/// The bytes of one tensor: a slice of the received payload (no copy), after checking the range.
pub fn slice(payload: &Bytes, offset: u64, len: u64) -> Result<Bytes, FrameError> {
    let end = offset
        .checked_add(len)
        .filter(|&end| end <= payload.len() as u64)
        .ok_or_else(|| {
            FrameError::Invalid(format!(
                "tensor bytes {offset}+{len} lie outside the {}-byte payload",
                payload.len()
            ))
        })?;
    Ok(payload.slice(offset as usize..end as usize))
}

/// A received frame: its header, and its payload in one aligned buffer that tensors slice.
#[derive(Debug)]
pub struct Frame {
    pub message: Message,
    pub payload: Bytes,
}

/// A whole frame held in memory, for tests and the simulated link: decodes what `encode` made.
pub fn decode_all(bytes: &[u8], limits: &Limits) -> Result<Frame, FrameError> {
    let prelude: &[u8; PRELUDE_LEN] =
        bytes
            .get(..PRELUDE_LEN)
            .and_then(|b| b.try_into().ok())
            .ok_or(FrameError::Truncated {
                expected: PRELUDE_LEN as u64,
                got: bytes.len() as u64,
            })?;
    let p = Prelude::decode(prelude, limits)?;
    if p.shared() {
        return Err(FrameError::Invalid(
            "a frame whose payload lies in shared memory cannot be read from bytes alone".into(),
        ));
    }
    let rest = &bytes[PRELUDE_LEN..];
    let total = p.header_len as u64 + p.payload_len;
    if (rest.len() as u64) < total {
        return Err(FrameError::Truncated {
            expected: total,
            got: rest.len() as u64,
        });
    }
    let mut header = rkyv::util::AlignedVec::<16>::with_capacity(p.header_len as usize);
    header.extend_from_slice(&rest[..p.header_len as usize]);
    let message = decode_header(&header)?;
    let mut payload = rkyv::util::AlignedVec::<TENSOR_ALIGN>::with_capacity(p.payload_len as usize);
    payload.extend_from_slice(&rest[p.header_len as usize..total as usize]);
    Ok(Frame {
        message,
        payload: Bytes::from_owner(payload),
    })
}
