//! A lean gRPC load generator: requests/s and p50/p99 for ModelInfer on an FP32 model, next to the
//! ServerLive round trip (the same transport with no model work), so the inference path's own cost shows.
//!
//! Run: `cargo bench -p mesh-node --bench grpc_load -- ADDR MODEL CONCURRENCY SECONDS`
//! (defaults: http://127.0.0.1:8001 mlp 1 5). The model's first input must be FP32; MODEL `-` measures ServerLive only;
//! `--no-live` leaves the ServerLive row out (so that every request the server sees is a ModelInfer).
use std::time::{Duration, Instant};

use bytes::Bytes;
use mesh::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use mesh::proto::model_infer_request::InferInputTensor;
use mesh::proto::{ModelInferRequest, ModelMetadataRequest, ServerLiveRequest};
use tonic::transport::Channel;

fn summarize(label: &str, mut lat: Vec<Duration>, wall: Duration) {
    lat.sort_unstable();
    let p = |q: f64| lat[((lat.len() as f64 - 1.0) * q).round() as usize].as_secs_f64() * 1e6;
    println!(
        "| {label} | {:.0} | {:.0} | {:.0} |",
        lat.len() as f64 / wall.as_secs_f64(),
        p(0.5),
        p(0.99)
    );
}

async fn run<F, Fut>(concurrency: usize, seconds: f64, make: F) -> (Vec<Duration>, Duration)
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let warm_until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < warm_until {
        make().await;
    }
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(seconds);
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let make = make.clone();
            tokio::spawn(async move {
                let mut lat = Vec::new();
                while Instant::now() < end {
                    let t = Instant::now();
                    make().await;
                    lat.push(t.elapsed());
                }
                lat
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("load task"));
    }
    (all, start.elapsed())
}

/// Times ServerLive: the same transport with no model work, the floor under every ModelInfer number.
async fn measure_live(client: &GrpcInferenceServiceClient<Channel>, concurrency: usize, seconds: f64) {
    let client = client.clone();
    let (lat, wall) = run(concurrency, seconds, move || {
        let mut c = client.clone();
        async move {
            c.server_live(ServerLiveRequest {}).await.expect("live");
        }
    })
    .await;
    summarize("ServerLive (transport floor)", lat, wall);
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let addr = args.first().cloned().unwrap_or_else(|| "http://127.0.0.1:8001".into());
    let model = args.get(1).cloned().unwrap_or_else(|| "mlp".into());
    let concurrency: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1);
    let seconds: f64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(5.0);
    let live = !std::env::args().any(|a| a == "--no-live");
    let channel = Channel::from_shared(addr.clone())
        .expect("address")
        .connect()
        .await
        .expect("connect");
    // Large tensors (the cluster bench's 16 MiB identity) pass tonic's 4 MiB default.
    let mut client = GrpcInferenceServiceClient::new(channel)
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX);
    if model == "-" {
        println!("| {addr} c={concurrency} | req/s | p50 µs | p99 µs |\n|---|---|---|---|");
        measure_live(&client, concurrency, seconds).await;
        return;
    }
    let meta = client
        .model_metadata(ModelMetadataRequest {
            name: model.clone(),
            version: String::new(),
        })
        .await
        .expect("model metadata")
        .into_inner();
    let input = &meta.inputs[0];
    let shape: Vec<i64> = input.shape.iter().map(|&d| if d < 0 { 1 } else { d }).collect();
    let n: i64 = shape.iter().product();
    let data: Vec<u8> = (0..n).flat_map(|i| ((i % 7) as f32 * 0.25).to_le_bytes()).collect();
    let request = ModelInferRequest {
        model_name: model.clone(),
        inputs: vec![InferInputTensor {
            name: input.name.clone(),
            datatype: "FP32".into(),
            shape,
            ..Default::default()
        }],
        raw_input_contents: vec![Bytes::from(data)],
        ..Default::default()
    };
    println!("| {addr} {model} c={concurrency} | req/s | p50 µs | p99 µs |\n|---|---|---|---|");
    if live {
        measure_live(&client, concurrency, seconds).await;
    }
    let (lat, wall) = run(concurrency, seconds, move || {
        let mut c = client.clone();
        let r = request.clone();
        async move {
            c.model_infer(r).await.expect("infer");
        }
    })
    .await;
    summarize("ModelInfer", lat, wall);
}
