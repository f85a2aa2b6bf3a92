//! Test support for driving a real router or node with a fake peer (cargo feature `testkit`, for
//! the node's and router's integration tests only): frames as bytes, how a stream ended, waiting
//! for a condition, free ports, certificates on disk.
use std::net::{TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use quinn::{ReadError, ReadToEndError, RecvStream, SendStream};

use super::certs::{CertificateAuthority, LeafRequest, Role};
use super::frame::{self, Frame, Limits};
use super::msg::Message;

/// A message as one frame's bytes.
pub fn encode(message: &Message) -> Vec<u8> {
    frame::encode(message, Default::default(), &Limits::default())
        .expect("encode a frame")
        .concat()
}

/// Writes one frame on `tx`.
pub async fn send(tx: &mut SendStream, message: &Message) {
    tx.write_all(&encode(message)).await.expect("write a frame");
}

/// How a stream the other side answered ended.
#[derive(Debug)]
pub enum End {
    /// It wrote whole frames (or none) and finished.
    Frames(Vec<Message>),
    /// It reset the stream with this code.
    Reset(u64),
    /// The connection went away, or the bytes were not frames.
    Broken(String),
}

/// Reads `rx` to its end: the frames on it, or how it broke.
pub async fn read_end(rx: &mut RecvStream) -> End {
    let read = tokio::time::timeout(Duration::from_secs(10), rx.read_to_end(64 << 20))
        .await
        .expect("the stream did not end in 10 s");
    let bytes = match read {
        Ok(b) => b,
        Err(ReadToEndError::Read(ReadError::Reset(code))) => return End::Reset(code.into_inner()),
        Err(e) => return End::Broken(e.to_string()),
    };
    let mut frames = Vec::new();
    let mut rest = &bytes[..];
    while !rest.is_empty() {
        match frame::decode_all(rest, &Limits::default()) {
            Ok(Frame { message, .. }) => {
                // decode_all checked the prelude, so both lengths are there and within `rest`.
                let header = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]) as usize;
                let mut len = [0u8; 8];
                len.copy_from_slice(&rest[8..16]);
                let payload = u64::from_le_bytes(len) as usize;
                frames.push(message);
                rest = &rest[frame::PRELUDE_LEN + header + payload..];
            }
            Err(e) => return End::Broken(format!("not a frame: {e}")),
        }
    }
    End::Frames(frames)
}

/// Polls `check` until it gives a value, failing the test after `limit` with what it waited for.
pub async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn free_tcp_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

pub fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Issues `name`'s certificate in `role` from `ca` into `dir` as NAME.pem and NAME.key.
pub fn write_leaf(dir: &Path, ca: &CertificateAuthority, name: &str, role: Role) -> (PathBuf, PathBuf) {
    let leaf = ca.issue(&LeafRequest::new(name, role)).expect("issue a certificate");
    let (cert, key) = (dir.join(format!("{name}.pem")), dir.join(format!("{name}.key")));
    std::fs::write(&cert, &leaf.cert_pem).unwrap();
    std::fs::write(&key, &leaf.key_pem).unwrap();
    (cert, key)
}
