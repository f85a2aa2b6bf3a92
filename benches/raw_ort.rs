//! The ceiling for end-to-end numbers: in-process ONNX Runtime on the same model, no server in between.
//!
//! Run: `cargo bench -p mesh-node --bench raw_ort -- [MODEL_DIR] [ITERATIONS] [BATCH]`
//! (default model dir: target/models/simple/mlp). It prints latency percentiles for
//! (a) plain `Session::run` with a borrowed input, (b) the mesh's own ONNX backend path, and (c) a
//! whole node in this process (`mesh_node::embed::Server::infer`, the model without dynamic
//! batching, so no queue delay is waited), as an embedding program calls it.
use std::path::PathBuf;
use std::time::{Duration, Instant};

use mesh::config::parse_pbtxt;
use mesh::{DataType, NamedTensor, Tensor};
use mesh_node::backend::onnx::{self, Device, OnnxBackend};
use mesh_node::backend::Backend;
use ort::value::TensorRef;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn report(label: &str, batch: i64, mut samples: Vec<Duration>) {
    samples.sort_unstable();
    let total: Duration = samples.iter().sum();
    let mean = total / samples.len() as u32;
    let runs = samples.len() as f64 / total.as_secs_f64();
    println!(
        "| {label} | {:.1} | {:.1} | {:.1} | {:.0} | {:.0} |",
        percentile(&samples, 0.5).as_secs_f64() * 1e6,
        percentile(&samples, 0.99).as_secs_f64() * 1e6,
        mean.as_secs_f64() * 1e6,
        runs,
        runs * batch as f64
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let dir = PathBuf::from(
        args.first()
            .cloned()
            .unwrap_or_else(|| "target/models/simple/mlp".into()),
    );
    let iters: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let batch: i64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1);
    // The process's one ONNX Runtime environment, shared with the embedded node below.
    let ort = mesh_node::backend::ort_env::Ort::load(None).expect("ONNX Runtime library");
    let env: &ort::environment::Environment = ort.env().expect("ONNX Runtime library");
    let text = std::fs::read_to_string(dir.join("config.pbtxt")).expect("config.pbtxt");
    let config = parse_pbtxt(&text).expect("valid config");
    let file = dir.join("1/model.onnx");
    let input = &config.input[0];
    assert_eq!(
        DataType::from_config(input.data_type),
        Some(DataType::Fp32),
        "bench expects an FP32 input"
    );
    let mut shape = vec![batch];
    shape.extend(&input.dims);
    let n: i64 = shape.iter().product();
    let values: Vec<f32> = (0..n).map(|i| (i % 7) as f32 * 0.25).collect();
    println!(
        "model {} ({} iterations, batch {batch}, input {:?})\n",
        dir.display(),
        iters,
        shape
    );
    println!("| path | p50 µs | p99 µs | mean µs | runs/s | rows/s |\n|---|---|---|---|---|---|");

    let mut session = onnx::open_session(env, &config, &file, Device::Cpu).expect("session");
    let out_name = config.output[0].name.clone();
    let run_raw = |s: &mut ort::session::Session| {
        let t = TensorRef::from_array_view((shape.clone(), &values[..])).expect("tensor");
        let outputs = s.run(ort::inputs![input.name.as_str() => t]).expect("run");
        let (_, data) = outputs[out_name.as_str()].try_extract_tensor::<f32>().expect("output");
        std::hint::black_box(data.to_vec());
    };
    for _ in 0..1000 {
        run_raw(&mut session);
    }
    let samples = (0..iters)
        .map(|_| {
            let t = Instant::now();
            run_raw(&mut session);
            t.elapsed()
        })
        .collect();
    report("raw ort Session::run", batch, samples);

    let session = onnx::open_session(env, &config, &file, Device::Cpu).expect("session");
    let mut backend = OnnxBackend::new(session, &config);
    let tensor = Tensor::from_values(shape.clone(), &values);
    let inputs = vec![NamedTensor {
        name: input.name.clone(),
        tensor,
    }];
    for _ in 0..1000 {
        backend.execute(&inputs, &[]).expect("execute");
    }
    let samples = (0..iters)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(backend.execute(&inputs, &[]).expect("execute"));
            t.elapsed()
        })
        .collect();
    report("mesh OnnxBackend::execute", batch, samples);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let samples = runtime.block_on(embedded(&dir, &config, inputs, iters));
    report("mesh embed::Server::infer (a node in this process)", batch, samples);
}

/// The same requests through a node started in this process on a copy of the model without
/// dynamic batching.
async fn embedded(
    dir: &std::path::Path,
    config: &mesh::config::ModelConfig,
    inputs: Vec<NamedTensor>,
    iters: usize,
) -> Vec<Duration> {
    let repo = std::env::temp_dir().join(format!("mesh-raw-ort-{}", std::process::id()));
    let model = repo.join(&config.name);
    std::fs::create_dir_all(model.join("1")).expect("temp repository");
    std::fs::copy(dir.join("1/model.onnx"), model.join("1/model.onnx")).expect("model file");
    let mut plain = config.clone();
    plain.scheduling_choice = None;
    let text = mesh::config::config_to_json(&plain).to_string();
    let repo_arg = repo.to_string_lossy().into_owned();
    let flags = [
        "--model-repository",
        &repo_arg,
        "--model-control-mode",
        "explicit",
        "--http-port",
        "0",
        "--grpc-port",
        "0",
        "--metrics-port",
        "0",
    ];
    let server = mesh_node::embed::Server::start(flags).await.expect("embedded node");
    let options = mesh::LoadOptions {
        config: Some(text),
        ..Default::default()
    };
    server.load(&config.name, options).await.expect("load");
    let request = mesh::InferRequest {
        model_name: config.name.clone(),
        inputs,
        ..Default::default()
    };
    for _ in 0..1000 {
        server.infer(request.clone()).await.expect("infer");
    }
    let mut samples = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        std::hint::black_box(server.infer(request.clone()).await.expect("infer"));
        samples.push(t.elapsed());
    }
    server.stop().await;
    let _ = std::fs::remove_dir_all(&repo);
    samples
}
