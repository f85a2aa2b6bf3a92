//! Reads and writes frames on quinn streams: the receive side copies each arriving chunk once into an
//! aligned buffer sized by the (checked) prelude, and the send side hands quinn the tensors' `Bytes`.
use bytes::Bytes;
use quinn::{ReadError, RecvStream, SendStream};

use super::frame::{decode_header, Frame, FrameError, Limits, Prelude, Reserved, PRELUDE_LEN, TENSOR_ALIGN};

fn read_error(e: ReadError) -> FrameError {
    FrameError::Io(e.to_string())
}

/// Appends exactly `n` more bytes of the stream to `buf` (whose capacity was reserved).
async fn fill<const A: usize>(
    recv: &mut RecvStream,
    buf: &mut rkyv::util::AlignedVec<A>,
    n: usize,
) -> Result<(), FrameError> {
    let want = buf.len() + n;
    while buf.len() < want {
        match recv.read_chunk(want - buf.len(), true).await.map_err(read_error)? {
            Some(chunk) => buf.extend_from_slice(&chunk.bytes),
            None => {
                return Err(FrameError::Truncated {
                    expected: want as u64,
                    got: buf.len() as u64,
                })
            }
        }
    }
    Ok(())
}

/// Reads one frame; `Ok(None)` when the stream ended cleanly before a new frame began.
pub async fn read_frame(recv: &mut RecvStream, limits: &Limits) -> Result<Option<Frame>, FrameError> {
    let mut prelude = [0u8; PRELUDE_LEN];
    let mut got = 0;
    while got < PRELUDE_LEN {
        match recv.read(&mut prelude[got..]).await.map_err(read_error)? {
            Some(n) => got += n,
            None if got == 0 => return Ok(None),
            None => {
                return Err(FrameError::Truncated {
                    expected: PRELUDE_LEN as u64,
                    got: got as u64,
                })
            }
        }
    }
    let p = Prelude::decode(&prelude, limits)?;
    // Both sizes passed the limits above, and each is admitted by the receive budget before its
    // buffer is reserved: nothing is allocated from an unchecked number, and streams that declare
    // much and send nothing cannot pile up reservations.
    let header_reserved = limits.budget.reserve(p.header_len.into())?;
    let mut header = rkyv::util::AlignedVec::<16>::with_capacity(p.header_len as usize);
    fill(recv, &mut header, p.header_len as usize).await?;
    let message = decode_header(&header)?;
    drop(header);
    drop(header_reserved);
    let payload = if p.payload_len == 0 {
        Bytes::new()
    } else {
        let reserved = limits.budget.reserve(p.payload_len)?;
        let mut buf = rkyv::util::AlignedVec::<TENSOR_ALIGN>::with_capacity(p.payload_len as usize);
        fill(recv, &mut buf, p.payload_len as usize).await?;
        Bytes::from_owner(Payload {
            buf,
            _reserved: reserved,
        })
    };
    Ok(Some(Frame { message, payload }))
}

/// A received payload and its place in the budget, released together when the last slice drops.
struct Payload {
    buf: rkyv::util::AlignedVec<TENSOR_ALIGN>,
    _reserved: Reserved,
}

impl AsRef<[u8]> for Payload {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

/// Writes an encoded frame (the chunks of `frame::encode`) without copying its tensors.
pub async fn write_frame(send: &mut SendStream, mut chunks: Vec<Bytes>) -> Result<(), FrameError> {
    send.write_all_chunks(&mut chunks)
        .await
        .map_err(|e| FrameError::Io(e.to_string()))
}
