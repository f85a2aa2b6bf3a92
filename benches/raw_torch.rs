//! The ceiling for TorchScript end-to-end numbers: tch in-process on the same model.pt, no server.
//!
//! Run (after scripts/setup-torch.sh and `scripts/torch_models.py --out target/torch-models`):
//! `source scripts/torch-env.sh && cargo bench -p mesh-node --features torch --bench raw_torch -- [MODEL_DIR] [ITERATIONS]`
//! (default model dir: target/torch-models/dict_mlp). It prints latency percentiles for (a) plain
//! `CModule::forward_is` under no_grad, and (b) the mesh's TorchBackend path (input copy, forward,
//! dict-to-outputs mapping, output copy).
use std::path::PathBuf;
use std::time::{Duration, Instant};

use mesh::config::parse_pbtxt;
use mesh::{NamedTensor, Tensor};
use mesh_node::backend::onnx::Device;
use mesh_node::backend::torch::TorchBackend;
use mesh_node::backend::Backend;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn report(label: &str, mut samples: Vec<Duration>) {
    samples.sort_unstable();
    let total: Duration = samples.iter().sum();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "| {label} | {:.1} | {:.1} | {:.1} | {:.0} |",
        us(percentile(&samples, 0.5)),
        us(percentile(&samples, 0.99)),
        us(total / samples.len() as u32),
        samples.len() as f64 / total.as_secs_f64()
    );
}

fn timed(iters: usize, mut f: impl FnMut()) -> Vec<Duration> {
    for _ in 0..1000 {
        f();
    }
    (0..iters)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let dir = PathBuf::from(
        args.first()
            .cloned()
            .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/torch-models/dict_mlp").into()),
    );
    let iters: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let config =
        parse_pbtxt(&std::fs::read_to_string(dir.join("config.pbtxt")).expect("config.pbtxt")).expect("config");
    let file = dir.join("1/model.pt");
    let mut shape = vec![1i64];
    shape.extend(&config.input[0].dims);
    let n: i64 = shape.iter().product();
    let values: Vec<f32> = (0..n).map(|i| (i % 7) as f32 * 0.25).collect();
    println!("model {} ({iters} iterations, input {shape:?})\n", dir.display());
    println!("| path | p50 µs | p99 µs | mean µs | runs/s |\n|---|---|---|---|---|");

    tch::set_num_threads(1);
    let module = tch::CModule::load(&file).expect("TorchScript file");
    let x = tch::Tensor::from_slice(&values).reshape(&shape);
    let samples = timed(iters, || {
        let _g = tch::no_grad_guard();
        let out = module
            .forward_is(&[tch::IValue::Tensor(x.shallow_clone())])
            .expect("forward");
        std::hint::black_box(out);
    });
    report("raw tch CModule::forward_is", samples);

    let mut backend = TorchBackend::open(&config, &file, Device::Cpu).expect("backend");
    let inputs = vec![NamedTensor {
        name: config.input[0].name.clone(),
        tensor: Tensor::from_values(shape.clone(), &values),
    }];
    let samples = timed(iters, || {
        std::hint::black_box(backend.execute(&inputs, &[]).expect("execute"));
    });
    report("mesh TorchBackend::execute", samples);
}
