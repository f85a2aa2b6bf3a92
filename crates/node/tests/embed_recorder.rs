//! Embedded nodes started at the same moment on several threads: the process's one metrics recorder is installed by one of them, and every start succeeds (its own test binary, so that no earlier test has installed the recorder already).
use std::sync::{Arc, Barrier};

use mesh_node::embed::Server;

#[test]
fn nodes_started_at_once_on_several_threads_all_start() {
    let dir = std::env::temp_dir().join(format!("mesh-embed-recorder-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let repo = dir.to_string_lossy().into_owned();
    let n = 6;
    let barrier = Arc::new(Barrier::new(n));
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let (barrier, repo) = (barrier.clone(), repo.clone());
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .enable_all()
                    .build()
                    .unwrap();
                runtime.block_on(async {
                    barrier.wait();
                    let server =
                        Server::start(["--model-repository", &repo, "--model-control-mode", "explicit"]).await?;
                    server.stop().await;
                    Ok::<_, String>(())
                })
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().expect("no panic")).collect();
    std::fs::remove_dir_all(&dir).ok();
    for r in results {
        r.expect("every node starts");
    }
}
