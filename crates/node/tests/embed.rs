//! The node embedded in a Rust program (`mesh_node::embed::Server`): started from mesh-node's
//! flags in this process, an ONNX model and a decoupled Python model called directly, bad input
//! answered with Triton's codes, load/unload, statistics, metrics, its ports opened beside the
//! calls, and a clean stop. Needs the set-up's venv and generated models (the test command runs
//! set-up first); without them it skips with one line.
use std::path::{Path, PathBuf};

use mesh::{Code, InferRequest, LoadOptions, NamedTensor, Tensor};
use mesh_node::embed::Server;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

/// A repository with add_sub (ONNX) and repeat_py (decoupled Python), or None without set-up.
fn repository() -> Option<(tempdir::Dir, PathBuf)> {
    let add_sub = root().join("target/models/simple/add_sub");
    let python = root().join(".venv/bin/python");
    if !add_sub.join("1/model.onnx").is_file() || !python.is_file() {
        eprintln!("skipped: needs scripts/setup.sh (the venv and target/models)");
        return None;
    }
    let dir = tempdir::Dir::new();
    copy_dir(&add_sub, &dir.0.join("add_sub"));
    copy_dir(&root().join("tests/python_models/repeat_py"), &dir.0.join("repeat_py"));
    Some((dir, python))
}

mod tempdir {
    /// A fresh directory, removed when dropped.
    pub struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub fn new() -> Dir {
            let n = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos();
            let p = std::env::temp_dir().join(format!("mesh-embed-{}-{n}", std::process::id()));
            std::fs::create_dir(&p).unwrap();
            Dir(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn add_sub(a: f32, b: f32) -> InferRequest {
    let input = |name: &str, v: f32| NamedTensor {
        name: name.into(),
        tensor: Tensor::from_values(vec![1, 16], &[v; 16]),
    };
    InferRequest {
        model_name: "add_sub".into(),
        inputs: vec![input("INPUT0", a), input("INPUT1", b)],
        ..Default::default()
    }
}

fn floats(t: &Tensor) -> Vec<f32> {
    t.data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_serves_models_in_its_own_process() {
    let Some((dir, python)) = repository() else { return };
    let repo = dir.0.to_string_lossy().into_owned();
    let interpreter = format!("python,interpreter={}", python.display());
    let flags = [
        "--model-repository",
        &repo,
        "--model-control-mode",
        "explicit",
        "--load-model",
        "add_sub",
        "--backend-config",
        &interpreter,
        "--http-port",
        "0",
        "--grpc-port",
        "0",
        "--metrics-port",
        "0",
    ];
    let mut server = Server::start(flags).await.unwrap();
    assert!(server.is_ready());

    // A request and its answer, with no port in between.
    let answer = server.infer(add_sub(3.0, 1.0)).await.unwrap();
    let out = |name: &str| answer.outputs.iter().find(|o| o.name == name).unwrap();
    assert_eq!(floats(&out("OUTPUT0").tensor), vec![4.0; 16]);
    assert_eq!(floats(&out("OUTPUT1").tensor), vec![2.0; 16]);
    assert_eq!(out("OUTPUT0").tensor.shape, vec![1, 16]);

    // Bad input gets Triton's codes and the node keeps serving.
    let mut wrong = add_sub(1.0, 1.0);
    wrong.inputs[0].tensor = Tensor::from_values(vec![1, 16], &[1i32; 16]);
    assert_eq!(server.infer(wrong).await.unwrap_err().code, Code::InvalidArgument);
    let mut short = add_sub(1.0, 1.0);
    short.inputs[1].tensor = Tensor::from_values(vec![1, 8], &[1.0f32; 8]);
    assert_eq!(server.infer(short).await.unwrap_err().code, Code::InvalidArgument);
    let missing = InferRequest {
        model_name: "nope".into(),
        ..Default::default()
    };
    assert_eq!(server.infer(missing).await.unwrap_err().code, Code::NotFound);

    // Load a decoupled model and stream its answers: one per element, then the final flag.
    server.load("repeat_py", LoadOptions::default()).await.unwrap();
    let request = InferRequest {
        model_name: "repeat_py".into(),
        inputs: vec![NamedTensor {
            name: "IN".into(),
            tensor: Tensor::from_values(vec![3], &[7i32, 8, 9]),
        }],
        ..Default::default()
    };
    let mut answers = server.infer_stream(request);
    let mut got = Vec::new();
    while let Some(item) = answers.recv().await {
        if let Some(answer) = item.response {
            let answer = answer.unwrap();
            let t = &answer.outputs.iter().find(|o| o.name == "OUT").unwrap().tensor;
            got.push(i32::from_le_bytes(t.data[..4].try_into().unwrap()));
        }
        if item.last {
            break;
        }
    }
    assert_eq!(got, vec![7, 8, 9]);
    server.unload("repeat_py", false).await.unwrap();
    let gone = server
        .infer(add_sub(0.0, 0.0).clone_for("repeat_py"))
        .await
        .unwrap_err();
    assert_eq!(gone.code, Code::Unavailable, "{gone}");

    // Statistics and metrics, as the ports would give them; then the ports themselves.
    let stats = server.statistics("add_sub", "").await.unwrap();
    let success = stats.model_stats[0]
        .inference_stats
        .as_ref()
        .unwrap()
        .success
        .as_ref()
        .unwrap()
        .count;
    assert_eq!(success, 1);
    assert!(server
        .metrics()
        .contains("nv_inference_request_success{model=\"add_sub\",version=\"1\"} 1"));
    server.serve_ports().await.unwrap();
    assert!(server.serve_ports().await.is_err(), "the ports open once");
    assert_eq!(
        floats(&server.infer(add_sub(2.0, 2.0)).await.unwrap().outputs[0].tensor),
        vec![4.0; 16]
    );
    server.stop().await;

    // A second server in the same process: the same flags, a fresh node.
    let again = Server::start(flags).await.unwrap();
    let second = again.infer(add_sub(1.0, 2.0)).await;
    assert!(second.is_ok(), "{second:?}");
    again.stop().await;

    // Flags mesh-node refuses are refused here with its words.
    let e = Server::start(["--no-such-flag"]).await.err().unwrap();
    assert!(e.contains("--no-such-flag"), "{e}");
}

trait Rename {
    fn clone_for(self, model: &str) -> InferRequest;
}

impl Rename for InferRequest {
    fn clone_for(mut self, model: &str) -> InferRequest {
        self.model_name = model.into();
        self
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_single_threaded_runtime_is_refused_with_a_reason() {
    let e = Server::start(["--model-repository", "/nonexistent"])
        .await
        .err()
        .unwrap();
    assert!(e.contains("needs a multi-threaded tokio runtime"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn borrowed_inputs_are_read_in_place_and_given_back_before_the_call_returns() {
    use mesh::DataType;
    use mesh_node::embed::Borrowed;
    let Some((dir, _)) = repository() else { return };
    // Its own name: the other test counts add_sub's requests in the process's metrics.
    let lent = dir.0.join("add_sub_lent");
    copy_dir(&dir.0.join("add_sub"), &lent);
    let config = std::fs::read_to_string(lent.join("config.pbtxt")).unwrap();
    std::fs::write(
        lent.join("config.pbtxt"),
        config.replace("name: \"add_sub\"", "name: \"add_sub_lent\""),
    )
    .unwrap();
    let repo = dir.0.to_string_lossy().into_owned();
    let server = Server::start([
        "--model-repository",
        &repo,
        "--model-control-mode",
        "explicit",
        "--load-model",
        "add_sub_lent",
    ])
    .await
    .unwrap();
    let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (a, mut b) = (bytes(&[5.0; 16]), bytes(&[2.0; 16]));
    let shape = [1i64, 16];
    let lend = |a: &[u8], b: &[u8]| {
        let inputs = [
            Borrowed {
                name: "INPUT0",
                dtype: DataType::Fp32,
                shape: &shape,
                data: a,
            },
            Borrowed {
                name: "INPUT1",
                dtype: DataType::Fp32,
                shape: &shape,
                data: b,
            },
        ];
        // Called from a runtime worker: the wait steps aside with block_in_place.
        server.infer_borrowed("add_sub_lent", "", &inputs, &["OUTPUT0"])
    };
    let answer = lend(&a, &b).unwrap();
    assert_eq!(answer.outputs.len(), 1, "only the requested output");
    assert_eq!(floats(&answer.outputs[0].tensor), vec![7.0; 16]);
    // The borrows ended with the call: the caller may change its buffer, the answer is its own.
    b.copy_from_slice(&bytes(&[1.0; 16]));
    assert_eq!(floats(&answer.outputs[0].tensor), vec![7.0; 16]);
    assert_eq!(floats(&lend(&a, &b).unwrap().outputs[0].tensor), vec![6.0; 16]);
    // Bad input is refused with Triton's code, and the loans still come back.
    let e = lend(&a, &b[..60]).unwrap_err();
    assert_eq!(e.code, Code::InvalidArgument, "{e:?}");
    // From a thread outside the runtime it blocks on the runtime directly.
    let from_thread = std::thread::scope(|s| s.spawn(|| lend(&a, &b).map(|r| floats(&r.outputs[0].tensor))).join());
    assert_eq!(from_thread.unwrap().unwrap(), vec![6.0; 16]);
    server.stop().await;
}
