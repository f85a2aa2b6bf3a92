//! QUIC transport settings for the cluster link: quinn's defaults are tuned for the internet, and a
//! cluster needs the opposite trade-offs (fast failure detection, many streams, big tensors).
use std::sync::Arc;
use std::time::Duration;

use std::net::SocketAddr;

use quinn::{EndpointConfig, IdleTimeout, TransportConfig, VarInt};

/// QUIC application close codes on the cluster link (the reason text travels with them).
pub mod close {
    /// A clean goodbye or shutdown.
    pub const NORMAL: u32 = 0;
    /// The peer broke the protocol (garbage, a corrupt frame on the control stream).
    pub const PROTOCOL: u32 = 1;
    /// The join was refused (another protocol version, a bad hello); the reason says why.
    pub const REFUSED: u32 = 2;
    /// A newer incarnation of the same node joined; this link is obsolete.
    pub const REPLACED: u32 = 3;
    /// The peer's certificate is on the revocation list now (`mesh-ops certs revoke`); the reason names it.
    pub const REVOKED: u32 = 4;
    /// The peer's certificate expired while the link was up; it may dial again with a renewed one.
    pub const EXPIRED: u32 = 5;
    /// Too many handshakes in flight for the peer's name; it may dial again soon.
    pub const BUSY: u32 = 6;
}

/// QUIC stream error codes (reset / stop-sending) on request streams.
pub mod stream_code {
    /// The request was cancelled by the side that sent it (its client went away).
    pub const CANCELLED: u32 = 1;
    /// The stream broke the protocol (a corrupt or unexpected frame).
    pub const PROTOCOL: u32 = 2;
}

/// The few transport knobs operators may change (flags on router and node).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// How often an idle link sends a keep-alive.
    pub keep_alive: Duration,
    /// A link that hears nothing for this long is dead: every request on it fails over.
    pub idle_timeout: Duration,
}

impl Default for Tuning {
    /// Keep-alive every 150 ms and an idle timeout of 750 ms: a node that is killed, frozen
    /// (SIGSTOP) or cut off stops acknowledging, and the router closes its link within 750 ms,
    /// inside the 1 s budget for taking it out of routing. Five keep-alives fit in the timeout, so
    /// one late packet on a busy host is not a false alarm. quinn's defaults (no keep-alive, 30 s)
    /// would keep a dead node "up" for 30 s.
    fn default() -> Self {
        Tuning {
            keep_alive: Duration::from_millis(150),
            idle_timeout: Duration::from_millis(750),
        }
    }
}

/// Streams either side may have open at once on one link: one per in-flight request (quinn's 100
/// would cap a router at 100 concurrent requests per node).
pub const MAX_STREAMS: u32 = 4096;
/// Per-stream receive window: several times quinn's ~1.25 MB, so a large tensor streams without
/// waiting on window updates, yet well under the socket buffer, so one stream's burst does not
/// overflow it (a drop costs the congestion window).
pub const STREAM_WINDOW: u32 = 4 << 20;
/// Per-connection receive window, shared by all streams of a link (the control stream too): room
/// for several large tensors in flight at once, so load reports are not starved by bulk answers;
/// it also bounds what one link buffers unread.
pub const CONNECTION_WINDOW: u32 = 64 << 20;

/// The transport config both ends of a link use.
pub fn transport_config(tuning: &Tuning) -> Result<Arc<TransportConfig>, String> {
    let mut t = TransportConfig::default();
    let idle = IdleTimeout::try_from(tuning.idle_timeout)
        .map_err(|_| format!("idle timeout {:?} is out of range", tuning.idle_timeout))?;
    if tuning.keep_alive >= tuning.idle_timeout {
        return Err(format!(
            "keep-alive {:?} must be shorter than the idle timeout {:?}",
            tuning.keep_alive, tuning.idle_timeout
        ));
    }
    t.max_idle_timeout(Some(idle))
        .keep_alive_interval(Some(tuning.keep_alive))
        .max_concurrent_bidi_streams(VarInt::from_u32(MAX_STREAMS))
        .max_concurrent_uni_streams(VarInt::from_u32(0))
        .stream_receive_window(VarInt::from_u32(STREAM_WINDOW))
        .receive_window(VarInt::from_u32(CONNECTION_WINDOW))
        .send_window(u64::from(CONNECTION_WINDOW))
        .datagram_receive_buffer_size(None);
    Ok(Arc::new(t))
}

/// Largest UDP payload an endpoint sends or takes: quinn's Ethernet-sized default, with its own MTU
/// discovery below it. Measured here, jumbo datagrams (up to 8972 or 65527 bytes) moved 16 MiB
/// tensors at about half the speed: bursts of large datagrams were lost, and every suspected black
/// hole dropped the path to 1200 bytes (benches/results/rounds.md, "Issue 7: the cluster").
pub const MAX_UDP_PAYLOAD: u16 = 1472;

/// Socket buffer the link asks the kernel for, each way. At the default 208 KiB a burst of a large
/// tensor overflows the receive buffer even on loopback, and every drop halves the congestion
/// window. The kernel caps it at `net.core.rmem_max` / `wmem_max` (raise those on busy hosts).
pub const SOCKET_BUFFER: usize = 8 << 20;

/// A UDP socket for a link endpoint, bound to `addr`, with large kernel buffers.
pub fn socket(addr: SocketAddr) -> Result<std::net::UdpSocket, String> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))
        .map_err(|e| format!("cannot open a UDP socket for {addr}: {e}"))?;
    // Best effort: the kernel caps the sizes silently, and a smaller buffer only costs speed.
    let _ = s.set_recv_buffer_size(SOCKET_BUFFER);
    let _ = s.set_send_buffer_size(SOCKET_BUFFER);
    if addr.is_ipv6() {
        let _ = s.set_only_v6(false);
    }
    s.bind(&addr.into())
        .map_err(|e| format!("cannot bind UDP {addr}: {e}"))?;
    Ok(s.into())
}

/// A QUIC endpoint for the cluster link on `addr`: a listener when `server` is given (the router),
/// else a dialer (a node).
pub fn endpoint(addr: SocketAddr, server: Option<quinn::ServerConfig>) -> Result<quinn::Endpoint, String> {
    let mut config = EndpointConfig::default();
    config
        .max_udp_payload_size(MAX_UDP_PAYLOAD)
        .map_err(|e| format!("bad UDP payload size: {e}"))?;
    quinn::Endpoint::new(config, server, socket(addr)?, Arc::new(quinn::TokioRuntime))
        .map_err(|e| format!("cannot open the cluster endpoint on {addr}: {e}"))
}

/// Send priority of the control stream: its frames go out before request data whenever the link
/// has credit, so membership and load reports keep flowing under bulk transfers.
pub const CONTROL_PRIORITY: i32 = 100;

/// A control frame the peer does not take within this long ends the link: the peer is stuck or
/// grants no credit. Generous, because a link moving large tensors on a busy host may hold control
/// frames for a while without anything being wrong.
pub const CONTROL_WRITE_TIMEOUT: Duration = Duration::from_secs(30);
