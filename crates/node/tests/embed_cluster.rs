//! A node embedded in a Rust program joins a cluster as `mesh-node` does: started from the same
//! `--cluster-*` flags, it dials the router with its certificate, says hello with its models, keeps
//! serving its own calls, and leaves the link when stopped.
mod common;

use std::time::Duration;

use common::*;
use mesh::{InferRequest, NamedTensor, Tensor};
use mesh_node::embed::Server;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_node_joins_a_cluster() {
    let Some(setup) = Setup::new() else { return };
    let router = FakeRouter::new(&setup.router);
    let files = setup.node("node-embedded");
    let (repo, join) = (setup.repo.display().to_string(), router.addr.to_string());
    let (ca, cert, key) = (
        files.ca.display().to_string(),
        files.cert.display().to_string(),
        files.key.display().to_string(),
    );
    let flags = [
        "--model-repository",
        &repo,
        "--cluster-join",
        &join,
        "--node-name",
        "node-embedded",
        "--cluster-bind",
        "127.0.0.1:0",
        "--cluster-ca",
        &ca,
        "--cluster-cert",
        &cert,
        "--cluster-key",
        &key,
        "--exit-timeout-secs",
        "2",
    ];
    let server = Server::start(flags).await.unwrap();
    let mut link = router.accept_hello().await;
    assert_eq!(link.hello.name, "node-embedded");
    assert!(
        link.hello.models.iter().any(|m| m.name == "add_sub" && m.ready),
        "{:?}",
        link.hello.models
    );
    link.welcome().await;

    // Its own calls go on beside the link.
    let x = Tensor::from_values(vec![1, 16], &[1.0f32; 16]);
    let request = InferRequest {
        model_name: "add_sub".into(),
        inputs: vec![
            NamedTensor {
                name: "INPUT0".into(),
                tensor: x.clone(),
            },
            NamedTensor {
                name: "INPUT1".into(),
                tensor: x,
            },
        ],
        ..Default::default()
    };
    assert!(server.infer(request).await.is_ok());

    // Stopping leaves the cluster: the router sees the link end.
    tokio::time::timeout(Duration::from_secs(30), server.stop())
        .await
        .expect("stop within its exit timeout");
    tokio::time::timeout(Duration::from_secs(10), link.conn.closed())
        .await
        .expect("the link ends with the node");
}
