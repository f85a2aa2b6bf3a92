//! A real mesh-router whose operator revokes a node's certificate and renews the router's own, with mesh-ops' own
//! certificate commands, while fake nodes are linked: the revoked node's link is cut and it cannot come back; the
//! other node stays; a renewed certificate is served without a restart.
mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use common::*;
use mesh::cluster::crl::Serial;
use mesh::cluster::reload::peer_cert;
use mesh::cluster::tls::TlsFiles;
use mesh::cluster::transport::close;

/// Runs a `mesh-ops` command line as the operator types it (the binary's own parsing and code).
fn ops(args: &[&str]) -> String {
    let cli = mesh_ops::cli::Cli::try_parse_from(std::iter::once("mesh-ops").chain(args.iter().copied()))
        .unwrap_or_else(|e| panic!("mesh-ops {args:?}: {e}"));
    mesh_ops::cli::run(cli).unwrap_or_else(|e| panic!("mesh-ops {args:?}: {e:#}"))
}

/// A CA directory made with `mesh-ops certs init` and a certificate per (name, role, hours).
fn pki(certs: &Certs, members: &[(&str, &str, &str)]) -> PathBuf {
    let dir = certs.path().join("pki");
    let d = dir.to_str().expect("utf-8 path");
    ops(&["certs", "init", d]);
    for (name, role, hours) in members {
        ops(&["certs", "issue", d, name, "--role", role, "--hours", hours]);
    }
    dir
}

fn serial(dir: &Path, name: &str) -> Serial {
    Serial::of_pem(&std::fs::read_to_string(dir.join(format!("{name}.pem"))).expect("certificate")).expect("serial")
}

async fn until_up(router: &Router, name: &str) {
    eventually(&format!("{name} to be up"), Duration::from_secs(30), || async move {
        cluster_node(router, name).await.filter(|n| n["state"] == "up")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_node_is_cut_and_refused_while_another_node_stays() {
    let certs = Certs::new();
    let dir = pki(
        &certs,
        &[
            ("router", "router", "24"),
            ("node-a", "node", "24"),
            ("node-b", "node", "24"),
        ],
    );
    let mut router = start_router(&certs, Some(&TlsFiles::in_dir(&dir, "router")), &[]).await;
    let a_files = TlsFiles::in_dir(&dir, "node-a");
    let mut a = join_as(&a_files, &router, "node-a").await;
    let mut b = join_as(&TlsFiles::in_dir(&dir, "node-b"), &router, "node-b").await;
    send_load_report(&mut a).await;
    send_load_report(&mut b).await;
    until_up(&router, "node-a").await;
    until_up(&router, "node-b").await;

    let revoked = ops(&[
        "certs",
        "revoke",
        dir.to_str().unwrap(),
        "node-a",
        "--reason",
        "key-compromise",
    ]);
    assert!(revoked.contains("('node-a')"), "{revoked}");

    // The live link is cut, with a reason that names the certificate.
    let (code, reason) = closed_by_app(&a.conn).await;
    assert_eq!(code, u64::from(close::REVOKED), "{reason}");
    assert!(
        reason.contains("certificate 'node-a'") && reason.contains("was revoked") && reason.contains("key-compromise"),
        "{reason}"
    );
    let log = eventually("the router to log the cut", Duration::from_secs(30), || {
        let out = router.proc.output();
        async move {
            out.contains("node-a")
                .then_some(())
                .and(out.contains("closing its cluster link").then_some(out))
        }
    })
    .await;
    assert!(log.contains("WARN"), "{log}");

    // The same certificate is refused at the handshake.
    let refused = match connect_as(&a_files, router.cluster_addr()).await {
        Err(e) => e,
        // A QUIC client may finish its side of the handshake before the server has checked its certificate.
        Ok(conn) => {
            let hello = say_hello(&conn, &hello("node-a", Vec::new())).await;
            assert!(hello.is_err(), "a revoked node was answered: {hello:?}");
            conn.closed().await
        }
    };
    assert!(refused.to_string().to_lowercase().contains("revoked"), "{refused:?}");

    // The other node's link is untouched, and it keeps being served.
    assert!(b.conn.close_reason().is_none(), "node-b's link was cut");
    send_load_report(&mut b).await;
    until_up(&router, "node-b").await;
    eventually("node-a to be out of routing", Duration::from_secs(30), || async {
        cluster_node(&router, "node-a")
            .await
            .filter(|n| n["state"] != "up")
            .map(|_| ())
    })
    .await;
    assert_live(&mut router).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_router_certificate_is_served_without_a_restart() {
    let certs = Certs::new();
    let dir = pki(&certs, &[("router", "router", "1"), ("node-b", "node", "24")]);
    let mut router = start_router(&certs, Some(&TlsFiles::in_dir(&dir, "router")), &[]).await;
    let b_files = TlsFiles::in_dir(&dir, "node-b");
    let mut b = join_as(&b_files, &router, "node-b").await;
    send_load_report(&mut b).await;
    until_up(&router, "node-b").await;
    let old = serial(&dir, "router");

    // The renewal a timer would run: a new short-lived certificate and key in place of the old ones.
    let renewed = ops(&[
        "certs",
        "issue",
        dir.to_str().unwrap(),
        "router",
        "--role",
        "router",
        "--hours",
        "2",
        "--force",
    ]);
    assert!(renewed.contains("valid 2 hours"), "{renewed}");
    let new = serial(&dir, "router");
    assert_ne!(old, new);
    eventually(
        "new connections to get the renewed certificate",
        Duration::from_secs(30),
        || {
            let b_files = b_files.clone();
            let (addr, old, new) = (router.cluster_addr(), old.clone(), new.clone());
            async move {
                let conn = connect_as(&b_files, addr).await.expect("connects");
                let shown = peer_cert(&conn).expect("the router's certificate").serial;
                conn.close(0u32.into(), b"looked");
                assert!(shown == old || shown == new, "an unknown certificate {shown}");
                (shown == new).then_some(())
            }
        },
    )
    .await;
    // The link made with the old certificate stays up.
    assert!(b.conn.close_reason().is_none(), "a renewed certificate cut a live link");
    send_load_report(&mut b).await;
    until_up(&router, "node-b").await;

    // SIGHUP reads the files again (`systemctl reload`), and does not end the router.
    router.proc.signal(libc::SIGHUP);
    eventually("the router to take SIGHUP", Duration::from_secs(30), || {
        let out = router.proc.output();
        async move {
            out.contains("SIGHUP: reading the cluster TLS files again")
                .then_some(())
        }
    })
    .await;
    assert_live(&mut router).await;
    assert!(b.conn.close_reason().is_none());
}
