//! mesh-node: serves Triton model repositories over KServe v2 HTTP/gRPC on ONNX Runtime.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use mesh_node::cli::Args;
use mesh_node::embed::Server;

fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(e) = args.start_logging() {
        eprintln!("mesh-node: {e}");
        return ExitCode::FAILURE;
    }
    mesh::process::run(run(args))
}

async fn run(args: Args) -> Result<(), String> {
    mesh::busy::start(
        Duration::from_micros(args.listen.busy_poll_us),
        mesh::process::worker_count(),
    );
    let exit_timeout_secs = args.exit_timeout_secs;
    let mut server = Server::from_args(args).await?;
    server.serve_ports().await?;
    mesh::process::wait_for_signal().await?;
    tracing::info!(
        timeout_secs = exit_timeout_secs,
        "shutting down: no new requests, finishing in-flight ones"
    );
    server.stop().await;
    Ok(())
}
