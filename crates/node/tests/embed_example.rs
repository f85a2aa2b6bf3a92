//! The book's Rust example (`examples/embed.rs`, shown whole in docs/src/embedding/rust.md) runs as written against the generated add_sub, in a test process of its own (its requests would count in another test's metrics).
use std::path::Path;

#[allow(dead_code)]
#[path = "../examples/embed.rs"]
mod example;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_books_rust_example_runs_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let example = std::fs::read_to_string(root.join("crates/node/examples/embed.rs")).unwrap();
    let chapter = std::fs::read_to_string(root.join("docs/src/embedding/rust.md")).unwrap();
    assert!(
        chapter.contains(&format!("<!-- example: embed-rust -->\n```rust\n{example}```\n")),
        "the book's Rust example (example: embed-rust) is not crates/node/examples/embed.rs as it is"
    );
    let models = root.join("target/models/simple");
    if !models.join("add_sub/1/model.onnx").is_file() {
        eprintln!("skipped: needs scripts/setup.sh (target/models)");
        return;
    }
    example::run(models.to_str().unwrap()).await.expect("the example runs");
}
