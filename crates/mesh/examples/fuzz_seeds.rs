//! Writes the seeds of the binary fuzz targets with the real encoders (link frames for
//! fuzz/seeds/cluster_frame/, protobuf `ModelInferRequest`s for fuzz/seeds/grpc_infer/):
//! `scripts/fuzz.sh seeds`, or `cargo run -p mesh --example fuzz_seeds -- SEEDS_DIR`.
use std::path::PathBuf;

use bytes::Bytes;
use mesh::cluster::convert::{answer_frame, request_frame, ErrorKind};
use mesh::cluster::frame::{encode, Limits, Payload};
use mesh::cluster::msg::{Hello, Message, ModelLoad, ModelStatus, StatsReply, WireError};
use mesh::config::parse_pbtxt;
use mesh::{Error, InferRequest, InferResponse, NamedTensor, Param, RequestedOutput, Tensor};
use prost::Message as _;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let seeds = PathBuf::from(std::env::args().nth(1).ok_or("usage: fuzz_seeds SEEDS_DIR")?);
    let dir = seeds.join("cluster_frame");
    std::fs::create_dir_all(&dir)?;
    let limits = Limits::default();
    let request = InferRequest {
        model_name: "multi".into(),
        model_version: "1".into(),
        id: "req-1".into(),
        inputs: vec![
            NamedTensor {
                name: "INPUT0".into(),
                tensor: Tensor::from_values(vec![1, 2, 4], &[0.5f32, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0]),
            },
            NamedTensor {
                name: "INPUT1".into(),
                tensor: Tensor::from_values(vec![1, 2], &[7i64, -7]),
            },
            NamedTensor {
                name: "TEXT".into(),
                tensor: Tensor::from_bytes_elements(vec![1, 2], [&b"hello"[..], b""]),
            },
        ],
        outputs: vec![
            RequestedOutput::named("OUTPUT0"),
            RequestedOutput {
                name: "LABEL".into(),
                class_count: Some(3),
            },
        ],
        parameters: vec![
            ("priority".into(), Param::Uint(1)),
            ("sequence_id".into(), Param::Int(-3)),
            ("temperature".into(), Param::Double(0.25)),
            ("flag".into(), Param::Bool(true)),
            ("user".into(), Param::String("u".into())),
        ],
        ..Default::default()
    };
    let response = InferResponse {
        model_name: "multi".into(),
        model_version: "1".into(),
        id: "req-1".into(),
        outputs: vec![
            NamedTensor {
                name: "OUTPUT0".into(),
                tensor: Tensor::from_values(vec![1, 1, 4], &[1.0f32, 2.0, 3.0, 4.0]),
            },
            NamedTensor {
                name: "LABEL".into(),
                tensor: Tensor::from_bytes_elements(vec![1, 1], [b"0.9:1:cat"]),
            },
        ],
        parameters: vec![("triton_final_response".into(), Param::Bool(true))],
    };
    let config = parse_pbtxt(
        r#"name: "multi" max_batch_size: 8
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]
        dynamic_batching { max_queue_delay_microseconds: 100 }"#,
    )?;
    let hello = Message::Hello(Hello {
        name: "node-a".into(),
        incarnation: 42,
        devices: vec!["cpu".into(), "cuda:0".into()],
        http: "127.0.0.1:8000".into(),
        grpc: "127.0.0.1:8001".into(),
        models: vec![ModelStatus {
            name: "multi".into(),
            version: 1,
            ready: true,
            reason: String::new(),
            config: config.encode_to_vec(),
            placed: false,
        }],
        memory: 1 << 30,
        arena: None,
    });
    let stats = mesh::proto::ModelStatisticsResponse {
        model_stats: vec![mesh::proto::ModelStatistics {
            name: "multi".into(),
            version: "1".into(),
            inference_count: 3,
            ..Default::default()
        }],
    };
    let error = WireError {
        code: 2,
        kind: 1,
        message: "model 'x' is not served here".into(),
    };
    let frames: Vec<(&str, Vec<Bytes>)> = vec![
        ("request", request_frame(&request, false, None, &limits)?),
        ("request-stream", request_frame(&request, true, None, &limits)?),
        ("answer-response", answer_frame(Some(&Ok(response)), true, &limits)?),
        (
            "answer-error",
            answer_frame(
                Some(&Err((Error::invalid("bad input"), ErrorKind::Answered))),
                false,
                &limits,
            )?,
        ),
        ("answer-empty", answer_frame(None, true, &limits)?),
        ("hello", encode(&hello, Payload::default(), &limits)?),
        (
            "load-report",
            encode(
                &Message::LoadReport(mesh::cluster::msg::LoadReport {
                    models: vec![ModelLoad {
                        name: "multi".into(),
                        version: 1,
                        inflight: 2,
                        queued: 0,
                        exec_us: 1500,
                    }],
                }),
                Payload::default(),
                &limits,
            )?,
        ),
        (
            "stats-reply",
            encode(
                &Message::StatsReply(StatsReply::Stats(stats.encode_to_vec())),
                Payload::default(),
                &limits,
            )?,
        ),
        (
            "stats-error",
            encode(
                &Message::StatsReply(StatsReply::Error(error)),
                Payload::default(),
                &limits,
            )?,
        ),
        ("drain", encode(&Message::Drain, Payload::default(), &limits)?),
        ("credit", encode(&Message::Credit(2), Payload::default(), &limits)?),
    ];
    for (name, chunks) in frames {
        let bytes: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
        std::fs::write(dir.join(name), bytes)?;
    }
    grpc_seeds(&seeds.join("grpc_infer"))?;
    println!("wrote the cluster_frame and grpc_infer seeds under {}", seeds.display());
    Ok(())
}

/// gRPC infer requests: raw contents, typed contents of each kind, shared-memory regions, parameters.
fn grpc_seeds(dir: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    use mesh::proto::infer_parameter::ParameterChoice;
    use mesh::proto::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
    use mesh::proto::{InferParameter, InferTensorContents, ModelInferRequest};
    std::fs::create_dir_all(dir)?;
    let param = |p: ParameterChoice| InferParameter {
        parameter_choice: Some(p),
    };
    let input = |name: &str, datatype: &str, shape: Vec<i64>| InferInputTensor {
        name: name.into(),
        datatype: datatype.into(),
        shape,
        ..Default::default()
    };
    let raw = ModelInferRequest {
        model_name: "multi".into(),
        model_version: "1".into(),
        id: "g-1".into(),
        parameters: [
            ("priority".to_string(), param(ParameterChoice::Uint64Param(1))),
            ("timeout".to_string(), param(ParameterChoice::Int64Param(1000))),
        ]
        .into(),
        inputs: vec![
            input("INPUT0", "FP32", vec![1, 1, 4]),
            input("INPUT1", "INT64", vec![1, 2]),
            input("TEXT", "BYTES", vec![1, 1]),
        ],
        outputs: vec![InferRequestedOutputTensor {
            name: "LABEL".into(),
            parameters: [("classification".to_string(), param(ParameterChoice::Int64Param(2)))].into(),
        }],
        raw_input_contents: vec![
            [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|v| v.to_le_bytes()).collect(),
            [5i64, -5].iter().flat_map(|v| v.to_le_bytes()).collect(),
            Bytes::from_static(b"\x02\0\0\0hi"),
        ],
    };
    let contents = |c: InferTensorContents| Some(c);
    let mut typed = ModelInferRequest {
        model_name: "multi".into(),
        inputs: vec![
            InferInputTensor {
                contents: contents(InferTensorContents {
                    fp32_contents: vec![0.5, 1.5, 2.5, 3.5],
                    ..Default::default()
                }),
                ..input("INPUT0", "FP32", vec![1, 1, 4])
            },
            InferInputTensor {
                contents: contents(InferTensorContents {
                    int64_contents: vec![i64::MIN, i64::MAX],
                    ..Default::default()
                }),
                ..input("INPUT1", "INT64", vec![1, 2])
            },
            InferInputTensor {
                contents: contents(InferTensorContents {
                    bytes_contents: vec![b"a".to_vec(), b"".to_vec()],
                    ..Default::default()
                }),
                ..input("TEXT", "BYTES", vec![1, 2])
            },
            InferInputTensor {
                contents: contents(InferTensorContents {
                    bool_contents: vec![true, false, true],
                    ..Default::default()
                }),
                ..input("MASK", "BOOL", vec![1, 3])
            },
        ],
        ..Default::default()
    };
    let narrow = [
        (
            "INT8",
            InferTensorContents {
                int_contents: vec![-128, 127],
                ..Default::default()
            },
        ),
        (
            "UINT16",
            InferTensorContents {
                uint_contents: vec![0, 65535],
                ..Default::default()
            },
        ),
        (
            "UINT64",
            InferTensorContents {
                uint64_contents: vec![u64::MAX, 0],
                ..Default::default()
            },
        ),
        (
            "FP64",
            InferTensorContents {
                fp64_contents: vec![f64::MAX, -0.0],
                ..Default::default()
            },
        ),
    ];
    for (datatype, c) in narrow {
        typed.inputs.push(InferInputTensor {
            contents: contents(c),
            ..input(&format!("N_{datatype}"), datatype, vec![2])
        });
    }
    let region = |name: &str, size: u64, offset: u64| -> std::collections::HashMap<String, InferParameter> {
        [
            (
                "shared_memory_region".to_string(),
                param(ParameterChoice::StringParam(name.into())),
            ),
            (
                "shared_memory_byte_size".to_string(),
                param(ParameterChoice::Uint64Param(size)),
            ),
            (
                "shared_memory_offset".to_string(),
                param(ParameterChoice::Int64Param(offset as i64)),
            ),
        ]
        .into()
    };
    let shm = ModelInferRequest {
        model_name: "multi".into(),
        inputs: vec![
            InferInputTensor {
                parameters: region("r1", 16, 8),
                ..input("INPUT1", "INT64", vec![1, 2])
            },
            input("INPUT0", "FP32", vec![1, 1, 4]),
        ],
        outputs: vec![InferRequestedOutputTensor {
            name: "INPUT0".into(),
            parameters: region("r0", 64, 1024),
        }],
        raw_input_contents: vec![Bytes::from(vec![0; 16])],
        ..Default::default()
    };
    for (name, request) in [("raw", raw), ("typed", typed), ("shm", shm)] {
        std::fs::write(dir.join(name), request.encode_to_vec())?;
    }
    Ok(())
}
