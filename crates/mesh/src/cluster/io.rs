//! Reads and writes frames on quinn streams: the receive side copies each arriving chunk once into an
//! aligned buffer sized by the (checked) prelude, and the send side hands quinn the tensors' `Bytes`.
use bytes::Bytes;
use quinn::{ReadError, RecvStream, SendStream};

use super::frame::{decode_header, Frame, FrameError, Limits, Prelude, Reserved, PRELUDE_LEN, SHARED, TENSOR_ALIGN};
use super::shm::{Descriptor, Outbound, DESCRIPTOR_LEN, MIN_PAYLOAD};

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

/// Runs a fill of `bytes` reserved bytes within the limits' deadline for it; past it the reservation
/// is given back (the caller's guard drops) and the stream is to be reset.
async fn in_time(
    limits: &Limits,
    bytes: u64,
    fill: impl std::future::Future<Output = Result<(), FrameError>>,
) -> Result<(), FrameError> {
    let after = limits.deadline(bytes);
    tokio::time::timeout(after, fill)
        .await
        .map_err(|_| FrameError::Slow { bytes, after })?
}

/// Reads the prelude of the next frame: `Ok(None)` when the stream ended cleanly before one began.
/// Once its first byte arrived, the rest must follow within the frame deadline.
async fn read_prelude(recv: &mut RecvStream, limits: &Limits) -> Result<Option<[u8; PRELUDE_LEN]>, FrameError> {
    let mut prelude = [0u8; PRELUDE_LEN];
    let got = match recv.read(&mut prelude).await.map_err(read_error)? {
        Some(n) => n,
        None => return Ok(None),
    };
    let rest = async {
        let mut got = got;
        while got < PRELUDE_LEN {
            match recv.read(&mut prelude[got..]).await.map_err(read_error)? {
                Some(n) => got += n,
                None => {
                    return Err(FrameError::Truncated {
                        expected: PRELUDE_LEN as u64,
                        got: got as u64,
                    })
                }
            }
        }
        Ok(())
    };
    in_time(limits, PRELUDE_LEN as u64, rest).await?;
    Ok(Some(prelude))
}

/// How a read takes its room in the receive budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Room {
    /// Refused as busy when there is none: the stream fails (the request was never read).
    Now,
    /// For a link's control stream, whose failure would end the link: the header is not charged (the
    /// stream reads one frame at a time, so it holds at most one header limit), and a payload waits
    /// for room (back-pressure) instead of failing.
    Control,
}

async fn reserve(limits: &Limits, bytes: u64, room: Room) -> Result<super::frame::Reserved, FrameError> {
    match room {
        Room::Now => limits.budget.reserve(bytes),
        Room::Control => limits.budget.reserve_waiting(bytes).await,
    }
}

/// Reads one frame; `Ok(None)` when the stream ended cleanly before a new frame began.
pub async fn read_frame(recv: &mut RecvStream, limits: &Limits) -> Result<Option<Frame>, FrameError> {
    read(recv, limits, Room::Now).await
}

/// Reads one frame of a link's control stream, which a full receive budget never fails (that would
/// end the link): its header is read outside the budget, and a payload waits for room (the peer
/// waits behind flow control).
pub async fn read_control_frame(recv: &mut RecvStream, limits: &Limits) -> Result<Option<Frame>, FrameError> {
    read(recv, limits, Room::Control).await
}

async fn read(recv: &mut RecvStream, limits: &Limits, room: Room) -> Result<Option<Frame>, FrameError> {
    let Some(prelude) = read_prelude(recv, limits).await? else {
        return Ok(None);
    };
    let p = Prelude::decode(&prelude, limits)?;
    // Both sizes passed the limits above, and each is admitted by the receive budget before its
    // buffer is reserved: nothing is allocated from an unchecked number, and streams that declare
    // much and send nothing cannot pile up reservations.
    let header_len = p.header_bytes();
    let header_reserved = match room {
        Room::Now => Some(limits.budget.reserve(header_len.into())?),
        Room::Control => None,
    };
    let mut header = rkyv::util::AlignedVec::<16>::with_capacity(header_len as usize);
    in_time(limits, header_len.into(), fill(recv, &mut header, header_len as usize)).await?;
    let message = decode_header(&header)?;
    drop(header);
    drop(header_reserved);
    let shared = match p.shared() {
        true => {
            let mut d = [0u8; DESCRIPTOR_LEN];
            let read = async { recv.read_exact(&mut d).await.map_err(|e| FrameError::Io(e.to_string())) };
            in_time(limits, DESCRIPTOR_LEN as u64, read).await?;
            let d = Descriptor::decode(&d);
            Some((limits.arenas.find(d.arena).map_err(FrameError::Invalid)?, d))
        }
        false => None,
    };
    let payload = if p.payload_len == 0 {
        Bytes::new()
    } else {
        let reserved = match reserve(limits, p.payload_len, room).await {
            Ok(r) => r,
            Err(e) => {
                if let Some((arena, d)) = &shared {
                    arena.refuse(d);
                }
                return Err(e);
            }
        };
        let mut buf = rkyv::util::AlignedVec::<TENSOR_ALIGN>::with_capacity(p.payload_len as usize);
        match &shared {
            Some((arena, d)) => arena.take(d, p.payload_len, &mut buf).map_err(FrameError::Invalid)?,
            None => in_time(limits, p.payload_len, fill(recv, &mut buf, p.payload_len as usize)).await?,
        }
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

/// Takes the end of a stream whose last frame was read, when the end has already arrived (it
/// usually travels in the same packet as that frame); true when it had. Never waits.
pub fn take_end(recv: &mut RecvStream) -> bool {
    use futures::FutureExt;
    matches!(
        recv.read_chunk(usize::MAX, true).now_or_never(),
        Some(Ok(None) | Err(_))
    )
}

/// Most bytes [`finish_reading`] reads and drops after a stream's last frame: credit frames that a
/// caller sent before it saw the final answer. A peer that sends more is stopped.
pub const END_SLACK: usize = 64 << 10;

/// Lets go of a stream whose last frame was read without costing either side a STOP_SENDING: quinn
/// sends one for a stream dropped before its end was read, a packet and a wake-up on both ends for
/// every request. When the end has arrived (it usually travels with the last frame) the stream is
/// dropped at once; else a task reads on to the end, for at most `wait` and [`END_SLACK`] bytes,
/// and drops it then. A peer that ends its streams (every mesh peer does) never gets a
/// STOP_SENDING; one that does not gets it after `wait`. Never waits itself; needs a tokio runtime.
pub fn finish_reading(mut recv: RecvStream, wait: std::time::Duration) {
    if take_end(&mut recv) {
        return;
    }
    tokio::spawn(async move {
        let mut read = 0usize;
        let to_end = async {
            while let Ok(Some(chunk)) = recv.read_chunk(END_SLACK, true).await {
                read += chunk.bytes.len();
                if read > END_SLACK {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(wait, to_end).await;
    });
}

/// The chunks of an encoded frame (`frame::encode`: prelude and header, then the payload's parts)
/// as they go to a peer that shares memory with this process (`out`): a payload of
/// `shm::MIN_PAYLOAD` bytes or more is copied into the peer's arena and the frame carries its
/// descriptor instead. Unchanged when there is no arena, the payload is small, or the arena is full.
pub fn via(chunks: Vec<Bytes>, out: Option<&Outbound>) -> Vec<Bytes> {
    let (Some(out), Some(first)) = (out, chunks.first()) else {
        return chunks;
    };
    let Some(prelude) = first.get(..PRELUDE_LEN).and_then(|b| b.try_into().ok()) else {
        return chunks;
    };
    let prelude = Prelude::read(prelude);
    let parts = &chunks[1..];
    let whole = parts.iter().map(|p| p.len() as u64).sum::<u64>() == prelude.payload_len;
    if prelude.payload_len < MIN_PAYLOAD || prelude.shared() || !whole {
        return chunks;
    }
    let Some(d) = out.put(parts, prelude.payload_len) else {
        return chunks;
    };
    let shared = Prelude {
        header_len: prelude.header_len | SHARED,
        ..prelude
    };
    let mut head = Vec::with_capacity(first.len() + DESCRIPTOR_LEN);
    head.extend_from_slice(&shared.encode());
    head.extend_from_slice(&first[PRELUDE_LEN..]);
    head.extend_from_slice(&d.encode());
    vec![Bytes::from(head)]
}

/// Writes an encoded frame (the chunks of `frame::encode`) without copying its tensors.
pub async fn write_frame(send: &mut SendStream, mut chunks: Vec<Bytes>) -> Result<(), FrameError> {
    send.write_all_chunks(&mut chunks)
        .await
        .map_err(|e| FrameError::Io(e.to_string()))
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::cluster::frame::{Budget, Prelude, PROTOCOL_VERSION};

    /// A peer that declares a frame, sends part of it and goes quiet: the reader gives up at the
    /// deadline with `Slow`, and the budget its prelude reserved is back to zero.
    #[tokio::test]
    async fn a_frame_that_stalls_after_its_prelude_gives_its_budget_back() {
        let local = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
        let server_crypto = crate::cluster::tls::insecure_server_crypto().unwrap();
        let server = quinn::Endpoint::server(quinn::ServerConfig::with_crypto(server_crypto), local).unwrap();
        let addr = server.local_addr().unwrap();
        let mut client = quinn::Endpoint::client(local).unwrap();
        client.set_default_client_config(quinn::ClientConfig::new(
            crate::cluster::tls::insecure_client_crypto().unwrap(),
        ));
        let limits = Limits {
            frame_deadline: Duration::from_millis(300),
            budget: Arc::new(Budget::new(1 << 30)),
            ..Limits::default()
        };
        let budget = limits.budget.clone();
        let reader = tokio::spawn(async move {
            let conn = server.accept().await.unwrap().await.unwrap();
            let (_send, mut recv) = conn.accept_bi().await.unwrap();
            let started = Instant::now();
            let read = read_frame(&mut recv, &limits).await;
            (read.map(|_| ()), started.elapsed(), conn)
        });
        let conn = client.connect(addr, "mesh").unwrap().await.unwrap();
        let (mut send, _recv) = conn.open_bi().await.unwrap();
        let prelude = Prelude {
            version: PROTOCOL_VERSION,
            header_len: 64,
            payload_len: 1 << 20,
        };
        send.write_all(&prelude.encode()).await.unwrap();
        send.write_all(&[0u8; 10]).await.unwrap();
        let (read, took, _conn) = reader.await.unwrap();
        assert!(matches!(read, Err(FrameError::Slow { bytes: 64, .. })), "{read:?}");
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(5),
            "{took:?}"
        );
        assert_eq!(budget.used(), 0);
    }
}
