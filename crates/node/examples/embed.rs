//! The book's Rust example (docs/src/embedding/rust.md), whole: a node inside this program serves add_sub, called with shared and with borrowed inputs (`cargo run --release -p mesh-node --example embed -- target/models/simple`).
use mesh::{DataType, InferRequest, NamedTensor, Tensor};
use mesh_node::embed::{Borrowed, Server};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let repository = std::env::args().nth(1).unwrap_or_else(|| "target/models/simple".into());
    run(&repository).await
}

/// Starts a node on `repository`, asks add_sub twice, reads its statistics and metrics, and stops.
pub async fn run(repository: &str) -> Result<(), Box<dyn std::error::Error>> {
    let server = Server::start([
        "--model-repository",
        repository,
        "--model-control-mode",
        "explicit",
        "--load-model",
        "add_sub",
    ])
    .await?;

    // Shared bytes: the request holds the tensor's buffer, not a copy of it.
    let x = Tensor::from_values(vec![1, 16], &[3.0f32; 16]);
    let answer = server
        .infer(InferRequest {
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
        })
        .await?;
    println!("OUTPUT0 = {:?}", floats(&answer.outputs[0].tensor.data)); // 6.0 sixteen times

    // The caller's own slices, read in place: the call returns once the node holds none of them.
    let ones: Vec<u8> = [1.0f32; 16].iter().flat_map(|v| v.to_le_bytes()).collect();
    let input = |name| Borrowed {
        name,
        dtype: DataType::Fp32,
        shape: &[1, 16],
        data: &ones,
    };
    let lent = server.infer_borrowed("add_sub", "", &[input("INPUT0"), input("INPUT1")], &["OUTPUT1"])?;
    println!("OUTPUT1 = {:?}", floats(&lent.outputs[0].tensor.data)); // 0.0 sixteen times

    let stats = server.statistics("add_sub", "").await?; // Triton's statistics extension
    println!("add_sub ran {} inferences", stats.model_stats[0].inference_count);
    println!("{} lines of metrics", server.metrics().lines().count()); // the metrics port's text
    server.stop().await; // unloads the models and stops the actors
    Ok(())
}

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}
