//! QUIC transport settings for the cluster link: quinn's defaults are tuned for the internet, and a
//! cluster needs the opposite trade-offs (fast failure detection, many streams, big tensors).
use std::sync::Arc;
use std::time::Duration;

use quinn::{IdleTimeout, MtuDiscoveryConfig, TransportConfig, VarInt};

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
/// Per-stream receive window: a 16 MiB tensor flows without waiting on window updates (quinn's
/// ~1.25 MB would stall it at every window on a fast link).
pub const STREAM_WINDOW: u32 = 16 << 20;
/// Per-connection receive window, shared by all streams of a link.
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
    // Probe up to the largest UDP payload: loopback and jumbo-frame networks then carry tensors in
    // far fewer packets; paths with a 1500-byte MTU stop where probes stop being answered.
    let mut mtu = MtuDiscoveryConfig::default();
    mtu.upper_bound(65_527);
    t.mtu_discovery_config(Some(mtu));
    Ok(Arc::new(t))
}
