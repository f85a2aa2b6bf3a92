//! The README's Rust example (`examples/embed.rs`, shown in the README whole) runs as written against the generated add_sub, in a test process of its own (its requests would count in another test's metrics).
use std::path::Path;

#[allow(dead_code)]
#[path = "../examples/embed.rs"]
mod example;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_rust_example_runs_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let example = std::fs::read_to_string(root.join("crates/node/examples/embed.rs")).unwrap();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    assert!(
        readme.contains(&format!("```rust\n{example}```\n")),
        "the README's Rust example is not crates/node/examples/embed.rs as it is"
    );
    let models = root.join("target/models/simple");
    if !models.join("add_sub/1/model.onnx").is_file() {
        eprintln!("skipped: needs scripts/setup.sh (target/models)");
        return;
    }
    example::run(models.to_str().unwrap()).await.expect("the example runs");
}
