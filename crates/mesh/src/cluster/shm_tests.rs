//! The link's shared-memory arenas on real files: payloads go in and come out whole, slots are
//! reused only once given back, a hostile descriptor or offer fails cleanly, and frames written
//! through an arena arrive over a real QUIC stream.
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use rkyv::util::AlignedVec;

use super::*;
use crate::cluster::convert::{request_frame, request_from};
use crate::cluster::frame::Limits;
use crate::cluster::io::{read_frame, via, write_frame};
use crate::cluster::msg::Message;
use crate::cluster::tls;
use crate::request::InferRequest;
use crate::tensor::{NamedTensor, Tensor};

/// A small arena: the header and room for `slots` slots of `slot` payload bytes.
fn arena(dir: &Path, slots: u64, slot: u64) -> (Inbound, Outbound) {
    let len = HEADER + slots * (SLOT_HEADER + slot);
    let inbound = Inbound::create(dir, len).unwrap();
    let outbound = Outbound::open(&inbound.offer().unwrap(), dir, len).unwrap();
    (inbound, outbound)
}

fn bytes(n: usize, seed: u8) -> Bytes {
    Bytes::from(
        (0..n)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect::<Vec<_>>(),
    )
}

fn take(inbound: &Inbound, d: &Descriptor, len: u64) -> Result<Vec<u8>, String> {
    let mut buf = AlignedVec::<64>::with_capacity(len as usize);
    inbound.take(d, len, &mut buf)?;
    Ok(buf.to_vec())
}

#[test]
fn a_payload_put_in_parts_comes_out_whole_once() {
    let dir = tempfile::tempdir().unwrap();
    let (inbound, outbound) = arena(dir.path(), 4, 4096);
    let parts = [bytes(100, 1), bytes(28, 2), bytes(3000, 3)];
    let d = outbound.put(&parts, 3128).unwrap();
    assert_eq!(d.arena, inbound.id());
    assert_eq!(take(&inbound, &d, 3128).unwrap(), parts.concat());
    // The slot is given back: a second read of it is refused, and the writer reuses it.
    let again = take(&inbound, &d, 3128).unwrap_err();
    assert!(
        again.to_string().contains("not written, or already taken back"),
        "{again}"
    );
    let next = outbound.put(&[bytes(64, 4)], 64).unwrap();
    assert_eq!(next.slot, d.slot, "the freed slot is the first free place");
    assert_eq!(outbound.held(), SLOT_HEADER + 64);
}

#[test]
fn a_full_arena_refuses_a_payload_until_the_oldest_slot_is_taken() {
    let dir = tempfile::tempdir().unwrap();
    let (inbound, outbound) = arena(dir.path(), 3, 1024);
    let ds: Vec<_> = (0..3).map(|i| outbound.put(&[bytes(1024, i)], 1024).unwrap()).collect();
    assert!(
        outbound.put(&[bytes(1024, 9)], 1024).is_none(),
        "no room: the frame goes inline"
    );
    // Taking a later slot frees nothing yet: the ring frees from its oldest slot.
    assert_eq!(take(&inbound, &ds[1], 1024).unwrap(), bytes(1024, 1));
    assert!(outbound.put(&[bytes(1024, 9)], 1024).is_none());
    assert_eq!(take(&inbound, &ds[0], 1024).unwrap(), bytes(1024, 0));
    // Now both are free, and the ring wraps around to the start, where their room is one.
    let wrapped = outbound.put(&[bytes(2048, 7)], 2048).unwrap();
    assert_eq!(wrapped.slot, HEADER);
    assert!(
        outbound.put(&[bytes(1024, 5)], 1024).is_none(),
        "the newest slot is right behind the oldest"
    );
    assert_eq!(take(&inbound, &ds[2], 1024).unwrap(), bytes(1024, 2));
    assert_eq!(take(&inbound, &wrapped, 2048).unwrap(), bytes(2048, 7));
}

#[test]
fn descriptors_that_do_not_name_a_written_slot_fail_without_touching_memory() {
    let dir = tempfile::tempdir().unwrap();
    let (inbound, outbound) = arena(dir.path(), 2, 4096);
    let d = outbound.put(&[bytes(4096, 1)], 4096).unwrap();
    let cases = [
        (Descriptor { seq: d.seq + 1, ..d }, 4096, "not written"),
        (Descriptor { slot: d.slot + 8, ..d }, 4096, "not a slot"),
        (Descriptor { slot: 0, ..d }, 16, "not a slot"),
        (
            Descriptor {
                slot: u64::MAX - 8,
                ..d
            },
            16,
            "outside the arena",
        ),
        (d, u64::MAX, "outside the arena"),
        (d, 1 << 40, "outside the arena"),
        (Descriptor { seq: 0, ..d }, 16, "not a slot"),
    ];
    for (bad, len, why) in cases {
        let mut buf = AlignedVec::<64>::new();
        let e = inbound.take(&bad, len, &mut buf).unwrap_err();
        assert!(e.contains(why), "{bad:?} {len}: {e}");
        assert!(buf.is_empty());
    }
    // The real one is still there.
    assert_eq!(take(&inbound, &d, 4096).unwrap(), bytes(4096, 1));
}

#[test]
fn a_slot_never_read_is_taken_back_after_the_limit_and_then_cannot_be_read() {
    let dir = tempfile::tempdir().unwrap();
    let (inbound, outbound) = arena(dir.path(), 2, 1024);
    let lost = outbound.put(&[bytes(1024, 1)], 1024).unwrap();
    let kept = outbound.put(&[bytes(1024, 2)], 1024).unwrap();
    let mut ring = outbound.ring.lock().unwrap();
    outbound.reclaim(&mut ring, Instant::now());
    assert_eq!(ring.live.len(), 2, "young slots stay");
    outbound.reclaim(&mut ring, Instant::now() + RECLAIM_AFTER);
    assert!(ring.live.is_empty(), "both were abandoned");
    drop(ring);
    assert!(take(&inbound, &lost, 1024).is_err(), "a reclaimed slot is never read");
    assert!(take(&inbound, &kept, 1024).is_err());
}

#[test]
fn a_slot_being_copied_out_is_not_taken_back() {
    let dir = tempfile::tempdir().unwrap();
    let (_inbound, outbound) = arena(dir.path(), 2, 1024);
    let d = outbound.put(&[bytes(1024, 1)], 1024).unwrap();
    // The reader has claimed it (as `take` does before copying).
    outbound
        .shared
        .state(d.slot)
        .store(d.seq << 2 | TAKEN, Ordering::Release);
    let mut ring = outbound.ring.lock().unwrap();
    outbound.reclaim(&mut ring, Instant::now() + RECLAIM_AFTER);
    assert_eq!(ring.live.len(), 1);
}

#[test]
fn a_refused_payload_gives_its_slot_back() {
    let dir = tempfile::tempdir().unwrap();
    let (inbound, outbound) = arena(dir.path(), 1, 1024);
    let d = outbound.put(&[bytes(1024, 1)], 1024).unwrap();
    // A descriptor that names no slot is ignored, without overflowing its sums.
    inbound.refuse(&Descriptor {
        slot: u64::MAX - 8,
        ..d
    });
    inbound.refuse(&Descriptor { slot: d.slot + 8, ..d });
    assert!(outbound.put(&[bytes(1024, 2)], 1024).is_none(), "still held");
    inbound.refuse(&d);
    assert!(outbound.put(&[bytes(1024, 2)], 1024).is_some());
}

#[test]
fn only_the_offered_arena_file_is_opened() {
    let dir = tempfile::tempdir().unwrap();
    let len = HEADER + 4096;
    let inbound = Inbound::create(dir.path(), len).unwrap();
    let offer = inbound.offer().unwrap();
    let meta = std::fs::metadata(&offer.path).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(meta.permissions().mode() & 0o777, 0o600, "private to its owner");
    let other = tempfile::tempdir().unwrap();
    let link = dir.path().join(format!("{PREFIX}link"));
    std::os::unix::fs::symlink(&offer.path, &link).unwrap();
    let plain = dir.path().join("not-an-arena");
    std::fs::write(&plain, vec![0u8; len as usize]).unwrap();
    let cases = [
        (
            ArenaOffer {
                id: offer.id ^ 1,
                ..offer.clone()
            },
            dir.path(),
            len,
            "does not carry",
        ),
        (offer.clone(), other.path(), len, "is not an arena path"),
        (offer.clone(), dir.path(), len + 64, "is not an arena of"),
        (
            ArenaOffer {
                path: link.display().to_string(),
                ..offer.clone()
            },
            dir.path(),
            len,
            "cannot open",
        ),
        (
            ArenaOffer {
                path: plain.display().to_string(),
                ..offer.clone()
            },
            dir.path(),
            len,
            "is not an arena path",
        ),
        (
            ArenaOffer {
                path: format!("{}/../x/{PREFIX}1", dir.path().display()),
                ..offer.clone()
            },
            dir.path(),
            len,
            "is not an arena path",
        ),
        (
            ArenaOffer {
                path: "relative".into(),
                ..offer.clone()
            },
            dir.path(),
            len,
            "is not an arena path",
        ),
    ];
    for (bad, at, len, why) in cases {
        let e = Outbound::open(&bad, at, len).err().expect("refused");
        assert!(e.contains(why), "{bad:?}: {e}");
    }
    assert!(Outbound::open(&offer, dir.path(), len).is_ok());
    // Its name goes with the arena.
    drop(inbound);
    assert!(!Path::new(&offer.path).exists());
}

#[test]
fn an_arena_is_never_created_over_an_existing_file_or_symlink() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target");
    std::fs::write(&target, b"keep").unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    assert!(create_private(&link).is_err());
    assert!(create_private(&target).is_err());
    assert_eq!(std::fs::read(&target).unwrap(), b"keep");
}

#[test]
fn arenas_left_by_processes_that_are_gone_are_swept() {
    let dir = tempfile::tempdir().unwrap();
    // No process has pid 4194305 (above the kernel's largest pid_max).
    let dead = dir.path().join(format!("{PREFIX}4194305-00"));
    let foreign = dir.path().join("other-file");
    for f in [&dead, &foreign] {
        std::fs::write(f, b"x").unwrap();
    }
    let live = Inbound::create(dir.path(), HEADER + 64).unwrap();
    assert!(!dead.exists());
    assert!(foreign.exists());
    let _second = Inbound::create(dir.path(), HEADER + 64).unwrap();
    assert!(
        Path::new(&live.offer().unwrap().path).exists(),
        "this process's own arena stays"
    );
}

/// On a full file system (a small tmpfs, as a container's default /dev/shm is), a slot whose pages
/// cannot be had is refused and the frame goes inline: writing to them would be a SIGBUS.
#[test]
fn a_full_file_system_refuses_a_slot_instead_of_crashing() {
    let dir = tempfile::tempdir().unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(dir.path())
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    let result = std::panic::catch_unwind(|| {
        let (inbound, outbound) = arena(dir.path(), 2, 4 << 20);
        assert!(
            outbound.put(&[bytes(2 << 20, 1)], 2 << 20).is_none(),
            "2 MiB on a 1 MiB tmpfs"
        );
        let d = outbound.put(&[bytes(256 << 10, 2)], 256 << 10).expect("256 KiB fits");
        assert_eq!(take(&inbound, &d, 256 << 10).unwrap(), bytes(256 << 10, 2));
    });
    let _ = std::process::Command::new("umount").arg(dir.path()).status();
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

#[test]
fn descriptors_survive_the_wire() {
    let d = Descriptor {
        arena: 0x0123_4567_89ab_cdef_0011_2233_4455_6677,
        slot: 4096,
        seq: 77,
    };
    assert_eq!(Descriptor::decode(&d.encode()), d);
}

#[test]
fn the_registry_finds_a_links_arena_until_the_link_drops_it() {
    let dir = tempfile::tempdir().unwrap();
    let arenas = Arc::new(Arenas::in_dir(dir.path(), HEADER + 4096));
    let registered = arenas.inbound().unwrap();
    let offer = registered.offer().unwrap();
    assert!(arenas.find(offer.id).is_ok());
    assert!(arenas.outbound(Some(&offer), "peer").is_some());
    assert!(arenas.outbound(None, "peer").is_none());
    drop(registered);
    assert!(arenas.find(offer.id).is_err());
    let off = Arc::new(Arenas {
        off: true,
        ..Arenas::in_dir(dir.path(), HEADER + 4096)
    });
    assert!(off.inbound().is_none(), "shared memory off: nothing offered");
}

fn request(n: usize) -> InferRequest {
    InferRequest {
        model_name: "m".into(),
        inputs: vec![
            NamedTensor {
                name: "small".into(),
                tensor: Tensor::from_values(vec![3], &[1i32, 2, 3]),
            },
            NamedTensor {
                name: "big".into(),
                tensor: Tensor::from_values(vec![n as i64], &(0..n as i32).collect::<Vec<_>>()),
            },
        ],
        ..Default::default()
    }
}

/// Frames written through an arena over a real QUIC stream: a large payload travels as a
/// descriptor and reads back equal to the original; a small one travels inline.
#[tokio::test]
async fn frames_through_an_arena_read_back_as_sent() {
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits {
        arenas: Arc::new(Arenas::in_dir(dir.path(), 64 << 20)),
        ..Limits::default()
    };
    let registered = limits.arenas.inbound().unwrap();
    let out = limits.arenas.outbound(registered.offer().as_ref(), "peer").unwrap();

    let local = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
    let server = quinn::Endpoint::server(
        quinn::ServerConfig::with_crypto(tls::insecure_server_crypto().unwrap()),
        local,
    )
    .unwrap();
    let addr = server.local_addr().unwrap();
    let mut client = quinn::Endpoint::client(local).unwrap();
    client.set_default_client_config(quinn::ClientConfig::new(tls::insecure_client_crypto().unwrap()));
    let reader_limits = limits.clone();
    let reader = tokio::spawn(async move {
        let conn = server.accept().await.unwrap().await.unwrap();
        let mut got = Vec::new();
        for _ in 0..2 {
            let (_send, mut recv) = conn.accept_bi().await.unwrap();
            got.push(read_frame(&mut recv, &reader_limits).await.unwrap().unwrap());
        }
        got
    });
    let conn = client.connect(addr, "mesh").unwrap().await.unwrap();
    let mut sizes = Vec::new();
    for n in [1 << 20, 16] {
        let chunks = via(request_frame(&request(n), false, None, &limits).unwrap(), Some(&out));
        sizes.push(chunks.iter().map(Bytes::len).sum::<usize>());
        let (mut send, _recv) = conn.open_bi().await.unwrap();
        write_frame(&mut send, chunks).await.unwrap();
        send.finish().unwrap();
    }
    assert!(
        sizes[0] < 4096,
        "the 4 MiB payload went through the arena: {} bytes on the stream",
        sizes[0]
    );
    let frames = reader.await.unwrap();
    for (frame, n) in frames.into_iter().zip([1 << 20, 16]) {
        let Message::Request(head) = frame.message else {
            panic!("a request")
        };
        let (got, _) = request_from(head, &frame.payload).unwrap();
        assert_eq!(got.inputs, request(n).inputs);
    }
    assert_eq!(
        out.held(),
        SLOT_HEADER + (4 << 20) + 64,
        "until the next put reclaims it"
    );
    assert!(out.put(&[bytes(64, 0)], 64).is_some());
    assert_eq!(out.held(), SLOT_HEADER + 64);
}
