//! Tests of ensemble planning, validation and the executor over a fake Dispatch.
use std::sync::Arc;

use super::*;
use crate::config::parse_pbtxt;
use crate::dispatch::{Dispatch, IndexEntry, ModelView};
use crate::request::{InferRequest, InferResponse};
use crate::tensor::{NamedTensor, Tensor};

/// Composing models: `double` and `negate` (x FP32 [4] -> y), `sum` (a, b -> y), `ints` (x INT32 [4] -> y).
fn model(name: &str) -> Result<StepModel, String> {
    let text = match name {
        "double" | "negate" | "fails" | "slow_a" | "slow_b" | "count" | "skip" => {
            "input [ { name: \"x\" data_type: TYPE_FP32 dims: [ 4 ] } ] output [ { name: \"y\" data_type: TYPE_FP32 dims: [ 4 ] } ]"
        }
        "sum" => {
            "input [ { name: \"a\" data_type: TYPE_FP32 dims: [ 4 ] }, { name: \"b\" data_type: TYPE_FP32 dims: [ 4 ] } ] output [ { name: \"y\" data_type: TYPE_FP32 dims: [ 4 ] } ]"
        }
        "ints" => {
            "input [ { name: \"x\" data_type: TYPE_INT32 dims: [ 4 ] } ] output [ { name: \"y\" data_type: TYPE_INT32 dims: [ 4 ] } ]"
        }
        "batched" => {
            "max_batch_size: 8 input [ { name: \"x\" data_type: TYPE_FP32 dims: [ -1 ] } ] output [ { name: \"y\" data_type: TYPE_FP32 dims: [ -1 ] } ]"
        }
        "wide" => {
            "input [ { name: \"x\" data_type: TYPE_FP32 dims: [ 8 ] } ] output [ { name: \"y\" data_type: TYPE_FP32 dims: [ 8 ] } ]"
        }
        _ => return Err("it is not loaded".into()),
    };
    Ok(StepModel {
        config: parse_pbtxt(&format!("name: \"{name}\" {text}")).unwrap(),
        decoupled: name == "count",
    })
}

fn lookup(name: &str, _version: &str) -> Result<StepModel, String> {
    model(name)
}

fn ensemble(steps: &str, outputs: &str) -> ModelConfig {
    parse_pbtxt(&format!(
        "name: \"e\" platform: \"ensemble\" \
         input [ {{ name: \"IN\" data_type: TYPE_FP32 dims: [ 4 ] }} ] \
         output [ {outputs} ] \
         ensemble_scheduling {{ step [ {steps} ] }}"
    ))
    .unwrap()
}

fn step(model: &str, inputs: &[(&str, &str)], outputs: &[(&str, &str)]) -> String {
    let map = |kind: &str, pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| format!("{kind} {{ key: \"{k}\" value: \"{v}\" }}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    format!(
        "{{ model_name: \"{model}\" model_version: -1 {} {} }}",
        map("input_map", inputs),
        map("output_map", outputs)
    )
}

const OUT: &str = "{ name: \"OUT\" data_type: TYPE_FP32 dims: [ 4 ] }";

/// Two branches from IN (double, negate) joined by sum.
fn diamond() -> ModelConfig {
    let steps = [
        step("double", &[("x", "IN")], &[("y", "d")]),
        step("negate", &[("x", "IN")], &[("y", "n")]),
        step("sum", &[("a", "d"), ("b", "n")], &[("y", "OUT")]),
    ]
    .join(", ");
    ensemble(&steps, OUT)
}

fn build_err(config: &ModelConfig) -> String {
    Plan::build(config, &lookup).unwrap_err()
}

#[test]
fn branches_start_together_and_the_join_waits_for_both() {
    let plan = Plan::build(&diamond(), &lookup).unwrap();
    assert_eq!(plan.models(), vec!["double", "negate", "sum"]);
    let mut p = Progress::new(&plan, ["IN"]);
    assert_eq!(p.take_ready(), vec![0, 1], "both branches are ready at once");
    assert!(
        p.step_done(&plan, 1).is_empty(),
        "the join still waits for the other branch"
    );
    assert_eq!(p.step_done(&plan, 0), vec![2]);
    assert!(p.all_started());
}

#[test]
fn every_validation_error_names_what_is_wrong() {
    let one = |s: String| ensemble(&s, OUT);
    let e = build_err(&one(step("nope", &[("x", "IN")], &[("y", "OUT")])));
    assert!(e.contains("step 0 (model 'nope')") && e.contains("not loaded"), "{e}");
    let e = build_err(&one(step("double", &[("x", "MISSING")], &[("y", "OUT")])));
    assert!(e.contains("'MISSING'") && e.contains("never produced"), "{e}");
    let twice = [
        step("double", &[("x", "IN")], &[("y", "OUT")]),
        step("negate", &[("x", "IN")], &[("y", "OUT")]),
    ];
    let e = build_err(&one(twice.join(", ")));
    assert!(e.contains("'OUT' is produced twice"), "{e}");
    let e = build_err(&one(step("ints", &[("x", "IN")], &[("y", "OUT")])));
    assert!(e.contains("'IN' is FP32") && e.contains("takes INT32"), "{e}");
    let e = build_err(&one(step("wide", &[("x", "IN")], &[("y", "OUT")])));
    assert!(e.contains("'IN' has shape [4]") && e.contains("[8]"), "{e}");
    let cycle = [
        step("double", &[("x", "b")], &[("y", "a")]),
        step("negate", &[("x", "a")], &[("y", "b")]),
        step("sum", &[("a", "IN"), ("b", "IN")], &[("y", "OUT")]),
    ];
    let e = build_err(&one(cycle.join(", ")));
    assert!(
        e.contains("cycle") && e.contains("step 0 (model 'double')") && e.contains("step 1"),
        "{e}"
    );
    assert!(!e.contains("step 2"), "the step outside the cycle is not blamed: {e}");
    let e = build_err(&ensemble(&step("double", &[("x", "IN")], &[("y", "d")]), OUT));
    assert!(e.contains("ensemble output 'OUT' is produced by no step"), "{e}");
    let e = build_err(&one(step("double", &[("z", "IN")], &[("y", "OUT")])));
    assert!(e.contains("input_map names 'z'"), "{e}");
    let e = build_err(&one(step("double", &[("x", "IN")], &[("q", "OUT")])));
    assert!(e.contains("output_map names 'q'"), "{e}");
    let e = build_err(&one(step("sum", &[("a", "IN")], &[("y", "OUT")])));
    assert!(e.contains("its input 'b' is not in input_map"), "{e}");
    let mut batched = diamond();
    batched.max_batch_size = 8;
    let e = build_err(&batched);
    assert!(e.contains("max_batch_size 8 exceeds the model's 0"), "{e}");
    let mut grouped = diamond();
    grouped.instance_group.push(Default::default());
    assert!(build_err(&grouped).contains("no instance_group"));
}

/// A real in-process dispatcher for the executor: arithmetic models, a failing one, and two that
/// only finish once both have started (so they must overlap).
struct Arith {
    both_started: Arc<tokio::sync::Barrier>,
}

#[async_trait::async_trait]
impl Dispatch for Arith {
    async fn infer(&self, r: InferRequest) -> crate::Result<InferResponse> {
        let get = |n: &str| r.input(n).map(|t| floats(&t.tensor));
        let y: Vec<f32> = match r.model_name.as_str() {
            "double" => {
                let shape = &r.input("x").unwrap().tensor.shape;
                assert_eq!(shape, &[4], "a non-batching model of dims [4] got {shape:?}");
                get("x").unwrap().iter().map(|v| v * 2.0).collect()
            }
            "negate" => get("x").unwrap().iter().map(|v| -v).collect(),
            "sum" => get("a")
                .unwrap()
                .iter()
                .zip(get("b").unwrap())
                .map(|(a, b)| a + b)
                .collect(),
            "slow_a" | "slow_b" => {
                self.both_started.wait().await;
                get("x").unwrap()
            }
            "skip" => return Ok(InferResponse::default()), // leaves its (optional) output out
            "batched" => {
                // Echoes x with its shape, which must carry a batch dimension.
                let x = &r.input("x").unwrap().tensor;
                assert_eq!(x.shape.len(), 2, "a batching model got {:?}", x.shape);
                return Ok(InferResponse {
                    outputs: vec![NamedTensor {
                        name: "y".into(),
                        tensor: x.clone(),
                    }],
                    ..Default::default()
                });
            }
            _ => return Err(crate::Error::unavailable("the backend broke")),
        };
        Ok(InferResponse {
            outputs: vec![NamedTensor {
                name: "y".into(),
                tensor: Tensor::from_values(vec![4], &y),
            }],
            ..Default::default()
        })
    }
    /// `count` is decoupled: x + 1, x + 2 and x + 3, then the final flag; each answer waits for a credit of
    /// its client's window, as a real producer does.
    async fn infer_stream(&self, r: InferRequest, sink: crate::stream::StreamSender) {
        if r.model_name != "count" {
            let answer = self.infer(r).await;
            let _ = sink.send(crate::stream::StreamItem::new(Some(answer), true));
            return;
        }
        let x = floats(&r.input("x").unwrap().tensor);
        for k in 1..=3 {
            let Some(credit) = sink.credit().await else {
                return;
            };
            let y: Vec<f32> = x.iter().map(|v| v + k as f32).collect();
            let response = InferResponse {
                outputs: vec![NamedTensor {
                    name: "y".into(),
                    tensor: Tensor::from_values(vec![4], &y),
                }],
                ..Default::default()
            };
            let _ = sink.send(crate::stream::StreamItem {
                response: Some(Ok(response)),
                last: false,
                credit: Some(credit),
            });
        }
        let _ = sink.send(crate::stream::StreamItem::new(None, true));
    }
    fn ready(&self) -> bool {
        true
    }
    fn model(&self, _: &str, _: &str) -> crate::Result<ModelView> {
        Err(crate::Error::not_found("no views here"))
    }
    fn repository_index(&self) -> Vec<IndexEntry> {
        Vec::new()
    }
}

fn floats(t: &Tensor) -> Vec<f32> {
    t.data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn request(values: [f32; 4]) -> InferRequest {
    InferRequest {
        model_name: "e".into(),
        inputs: vec![NamedTensor {
            name: "IN".into(),
            tensor: Tensor::from_values(vec![4], &values),
        }],
        ..Default::default()
    }
}

fn arith() -> Arith {
    Arith {
        both_started: Arc::new(tokio::sync::Barrier::new(2)),
    }
}

#[tokio::test]
async fn the_diamond_computes_2x_plus_minus_x() {
    let plan = Plan::build(&diamond(), &lookup).unwrap();
    let out = run(&plan, &arith(), request([1.0, 2.0, 3.0, 4.0])).await.unwrap();
    assert_eq!(out.outputs[0].name, "OUT");
    assert_eq!(floats(&out.outputs[0].tensor), vec![1.0, 2.0, 3.0, 4.0]);
}

/// Triton's rule for a non-batching ensemble over a batching model (L0_infer's `fan_*_nobatch`):
/// dims [4] fit dims [-1]; the batching step gets [1, 4], the non-batching step after it and the
/// ensemble's output get [4] back.
#[tokio::test]
async fn a_non_batching_ensemble_passes_through_a_batching_step() {
    let steps = [
        step("batched", &[("x", "IN")], &[("y", "b")]),
        step("double", &[("x", "b")], &[("y", "d")]),
        step("batched", &[("x", "d")], &[("y", "OUT")]),
    ];
    let plan = Plan::build(&ensemble(&steps.join(", "), OUT), &lookup).unwrap();
    let out = run(&plan, &arith(), request([1.0, 2.0, 3.0, 4.0])).await.unwrap();
    assert_eq!(out.outputs[0].tensor.shape, vec![4]);
    assert_eq!(floats(&out.outputs[0].tensor), vec![2.0, 4.0, 6.0, 8.0]);
}

#[tokio::test]
async fn independent_branches_run_at_the_same_time() {
    let steps = [
        step("slow_a", &[("x", "IN")], &[("y", "a")]),
        step("slow_b", &[("x", "IN")], &[("y", "b")]),
        step("sum", &[("a", "a"), ("b", "b")], &[("y", "OUT")]),
    ];
    let plan = Plan::build(&ensemble(&steps.join(", "), OUT), &lookup).unwrap();
    let dispatch = arith();
    let run = run(&plan, &dispatch, request([1.0; 4]));
    let out = tokio::time::timeout(std::time::Duration::from_secs(10), run)
        .await
        .expect("a branch waited for the other to finish first: they did not overlap")
        .unwrap();
    assert_eq!(floats(&out.outputs[0].tensor), vec![2.0; 4]);
}

#[tokio::test]
async fn a_failing_step_names_itself_and_its_model() {
    let steps = [
        step("double", &[("x", "IN")], &[("y", "d")]),
        step("fails", &[("x", "d")], &[("y", "OUT")]),
    ];
    let plan = Plan::build(&ensemble(&steps.join(", "), OUT), &lookup).unwrap();
    let e = run(&plan, &arith(), request([1.0; 4])).await.unwrap_err();
    assert_eq!(e.code, crate::Code::Unavailable);
    assert!(
        e.message
            .contains("ensemble 'e' step 1 (model 'fails'): the backend broke"),
        "{}",
        e.message
    );
}

/// count (decoupled) and negate side by side, joined by sum: each answer of count is one answer of
/// the ensemble, (x + k) + (-x) = k, and each waits for the side branch.
fn counting() -> Plan {
    let steps = [
        step("count", &[("x", "IN")], &[("y", "c")]),
        step("negate", &[("x", "IN")], &[("y", "n")]),
        step("sum", &[("a", "c"), ("b", "n")], &[("y", "OUT")]),
    ];
    Plan::build(&ensemble(&steps.join(", "), OUT), &lookup).unwrap()
}

#[tokio::test]
async fn each_answer_of_a_decoupled_step_is_an_answer_of_the_ensemble() {
    let plan = counting();
    assert!(plan.decoupled && plan.steps[0].decoupled);
    let (tx, mut rx) = crate::stream::stream_channel(crate::stream::Window::new(64, u64::MAX));
    run_stream(&plan, &arith(), request([5.0, 6.0, 7.0, 8.0]), tx).await;
    let mut answers = Vec::new();
    let mut last = false;
    while let Ok(item) = rx.try_recv() {
        assert!(!last, "nothing after the final flag");
        last = item.last;
        if let Some(answer) = item.response {
            let response = answer.unwrap();
            assert_eq!(response.model_name, "e");
            answers.push(floats(&response.outputs[0].tensor)[0]);
        }
    }
    assert!(last, "the final flag ends the answers");
    answers.sort_by(f32::total_cmp);
    assert_eq!(answers, vec![1.0, 2.0, 3.0]);
}

#[tokio::test]
async fn a_client_that_stops_reading_stops_the_decoupled_step_at_its_window() {
    let plan = counting();
    let window = crate::stream::Window::new(1, u64::MAX);
    let (tx, mut rx) = crate::stream::stream_channel(window.clone());
    let dispatch = arith();
    let run = run_stream(&plan, &dispatch, request([5.0, 6.0, 7.0, 8.0]), tx);
    tokio::pin!(run);
    // Unread, the first answer holds the window's one credit: the step cannot make its second.
    let stalled = tokio::time::timeout(std::time::Duration::from_millis(100), &mut run).await;
    assert!(stalled.is_err(), "the ensemble ran past a full window");
    assert_eq!(window.out(), 1);
    let first = rx.try_recv().expect("one answer waits");
    assert!(rx.try_recv().is_err(), "only one answer was made");
    drop(first);
    // Reading on lets it finish.
    let mut answers = 1;
    let reader = async {
        while let Some(item) = rx.recv().await {
            answers += usize::from(item.response.is_some());
            if item.last {
                break;
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(5), async { tokio::join!(run, reader) })
        .await
        .expect("the ensemble finishes once its client reads");
    assert_eq!((answers, window.out()), (3, 0));
}

#[tokio::test]
async fn a_decoupled_ensemble_on_a_single_answer_path_says_how_many_it_gave() {
    let e = run(&counting(), &arith(), request([1.0; 4])).await.unwrap_err();
    assert!(
        e.message.contains("gave 3 responses") && e.message.contains("exactly 1"),
        "{}",
        e.message
    );
}

#[tokio::test]
async fn a_step_may_leave_an_optional_output_out() {
    let steps = [
        step("skip", &[("x", "IN")], &[("y", "s")]),
        step("double", &[("x", "IN")], &[("y", "OUT")]),
    ];
    let out = "{ name: \"OUT\" data_type: TYPE_FP32 dims: [ 4 ] }, { name: \"s\" data_type: TYPE_FP32 dims: [ 4 ] }";
    let plan = Plan::build(&ensemble(&steps.join(", "), out), &lookup).unwrap();
    let mut only_out = request([1.0; 4]);
    only_out.outputs = vec![crate::request::RequestedOutput::named("OUT".to_string())];
    let answer = run(&plan, &arith(), only_out).await.unwrap();
    assert_eq!(floats(&answer.outputs[0].tensor), vec![2.0; 4]);
    let e = run(&plan, &arith(), request([1.0; 4])).await.unwrap_err();
    assert!(
        e.message.contains("produced no 's'") && e.message.contains("left it out"),
        "{}",
        e.message
    );
}

#[tokio::test]
async fn serving_answers_once_with_the_ensembles_version_and_names_a_failure() {
    let plan = Plan::build(&diamond(), &lookup).unwrap();
    let served = serve(&plan, &arith(), request([1.0; 4]), "3", None).await;
    assert_eq!(served.failed(), None);
    let Served::Answered(Ok(answer)) = served else {
        panic!("one answer: {served:?}")
    };
    assert_eq!(answer.model_version, "3");
    // A stream does not change how an ensemble without a decoupled step answers.
    let (tx, mut rx) = crate::stream::stream_channel(crate::stream::Window::new(8, u64::MAX));
    let served = serve(&plan, &arith(), request([1.0; 4]), "3", Some(tx)).await;
    assert!(matches!(served, Served::Answered(Ok(_))), "{served:?}");
    assert!(rx.try_recv().is_err(), "the caller sends the one answer itself");
    let steps = [
        step("double", &[("x", "IN")], &[("y", "d")]),
        step("fails", &[("x", "d")], &[("y", "OUT")]),
    ];
    let failing = Plan::build(&ensemble(&steps.join(", "), OUT), &lookup).unwrap();
    let served = serve(&failing, &arith(), request([1.0; 4]), "1", None).await;
    assert_eq!(served.failed(), Some(crate::Error::unavailable("").metric_reason()));
}

#[tokio::test]
async fn serving_a_decoupled_ensemble_on_a_stream_sends_each_answer_then_the_final_flag() {
    let (tx, mut rx) = crate::stream::stream_channel(crate::stream::Window::new(64, u64::MAX));
    let served = serve(&counting(), &arith(), request([5.0, 6.0, 7.0, 8.0]), "2", Some(tx)).await;
    assert!(matches!(served, Served::Streamed { failed: None }), "{served:?}");
    let mut answers = 0;
    let mut last = false;
    while let Ok(item) = rx.try_recv() {
        answers += usize::from(item.response.is_some());
        last = item.last;
    }
    assert_eq!((answers, last), (3, true));
}
