//! Ragged batching without a model: the tensors a batch becomes, and outputs scattered back.
use super::*;
use mesh::config::parse_pbtxt;

fn nt(name: &str, t: Tensor) -> NamedTensor {
    NamedTensor {
        name: name.into(),
        tensor: t,
    }
}

/// Triton's ragged test requests: RAGGED_INPUT of shape [1, n] filled with n.
fn request(n: usize) -> Vec<NamedTensor> {
    vec![nt(
        "RAGGED_INPUT",
        Tensor::from_values(vec![1, n as i64], &vec![n as f32; n]),
    )]
}

fn ragged(extra: &str) -> Arc<Ragged> {
    let config = parse_pbtxt(&format!(
        r#"name: "m" max_batch_size: 16
        input [ {{ name: "RAGGED_INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }} ]
        output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        {extra}"#
    ))
    .unwrap();
    Ragged::from_config(&config).unwrap().unwrap()
}

fn batch_input(kind: &str, dtype: &str) -> String {
    format!(r#"batch_input [ {{ kind: {kind} target_name: "B" data_type: {dtype} source_input: "RAGGED_INPUT" }} ]"#)
}

fn merged(r: &Ragged, sizes: &[usize]) -> Vec<NamedTensor> {
    let reqs: Vec<Vec<NamedTensor>> = sizes.iter().map(|n| request(*n)).collect();
    let refs: Vec<&[NamedTensor]> = reqs.iter().map(|r| &r[..]).collect();
    r.merge(&refs).unwrap()
}

fn named<'a>(ts: &'a [NamedTensor], name: &str) -> &'a Tensor {
    &ts.iter().find(|t| t.name == name).unwrap().tensor
}

#[test]
fn ragged_inputs_reach_the_model_flat_with_every_requests_elements() {
    let r = ragged("");
    let m = merged(&r, &[2, 4, 1, 3]);
    let flat = named(&m, "RAGGED_INPUT");
    assert_eq!(flat.shape, vec![10]);
    assert_eq!(
        *flat,
        Tensor::from_values(vec![10], &[2f32, 2., 4., 4., 4., 4., 1., 3., 3., 3.])
    );
    // One request alone is flat too, as the model expects whatever the batch.
    assert_eq!(named(&merged(&r, &[3]), "RAGGED_INPUT").shape, vec![3]);
}

#[test]
fn batch_inputs_describe_the_batch_as_triton_documents() {
    let cases: [(&str, Vec<i64>, Vec<f32>); 4] = [
        ("BATCH_ELEMENT_COUNT", vec![4], vec![2., 4., 1., 3.]),
        ("BATCH_ACCUMULATED_ELEMENT_COUNT", vec![4], vec![2., 6., 7., 10.]),
        (
            "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO",
            vec![5],
            vec![0., 2., 6., 7., 10.],
        ),
        ("BATCH_MAX_ELEMENT_COUNT_AS_SHAPE", vec![4], vec![0.; 4]),
    ];
    for (kind, shape, values) in cases {
        let m = merged(&ragged(&batch_input(kind, "TYPE_FP32")), &[2, 4, 1, 3]);
        assert_eq!(*named(&m, "B"), Tensor::from_values(shape, &values), "{kind}");
    }
    let m = merged(&ragged(&batch_input("BATCH_ELEMENT_COUNT", "TYPE_INT32")), &[2, 4]);
    assert_eq!(*named(&m, "B"), Tensor::from_values(vec![2], &[2i32, 4]));
}

#[test]
fn item_shapes_count_each_row_of_a_request() {
    // Triton's example: a batch-2 request of shape [3, 1] and a batch-1 request of [2, 2].
    let config = parse_pbtxt(
        r#"name: "m" max_batch_size: 8
        input [ { name: "X" data_type: TYPE_FP32 dims: [ -1, -1 ] allow_ragged_batch: true } ]
        output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
        batch_input [ { kind: BATCH_ITEM_SHAPE target_name: "S" data_type: TYPE_INT32 source_input: "X" },
                      { kind: BATCH_ITEM_SHAPE_FLATTEN target_name: "F" data_type: TYPE_INT32 source_input: "X" } ]"#,
    )
    .unwrap();
    let r = Ragged::from_config(&config).unwrap().unwrap();
    let a = vec![nt("X", Tensor::from_values(vec![2, 3, 1], &[0f32; 6]))];
    let b = vec![nt("X", Tensor::from_values(vec![1, 2, 2], &[0f32; 4]))];
    let m = r.merge(&[&a, &b]).unwrap();
    assert_eq!(*named(&m, "S"), Tensor::from_values(vec![3, 2], &[3i32, 1, 3, 1, 2, 2]));
    assert_eq!(*named(&m, "F"), Tensor::from_values(vec![6], &[3i32, 1, 3, 1, 2, 2]));
    assert_eq!(named(&m, "X").shape, vec![10]);
}

#[test]
fn scattered_outputs_take_the_shape_of_each_requests_source_input() {
    let r = ragged(
        r#"batch_output [ { target_name: "OUT" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "RAGGED_INPUT" } ]"#,
    );
    let reqs = [request(2), request(1), request(3)];
    let refs: Vec<&[NamedTensor]> = reqs.iter().map(|r| &r[..]).collect();
    let out = vec![nt("OUT", Tensor::from_values(vec![6], &[1f32, 2., 3., 4., 5., 6.]))];
    let parts = r.split(out, &refs, &[1, 1, 1]).unwrap();
    assert_eq!(parts[0][0].tensor, Tensor::from_values(vec![1, 2], &[1f32, 2.]));
    assert_eq!(parts[1][0].tensor, Tensor::from_values(vec![1, 1], &[3f32]));
    assert_eq!(parts[2][0].tensor, Tensor::from_values(vec![1, 3], &[4f32, 5., 6.]));
    let short = vec![nt("OUT", Tensor::from_values(vec![2], &[1f32, 2.]))];
    let e = r.split(short, &refs, &[1, 1, 1]).unwrap_err();
    assert!(e.message.contains("too few to scatter"), "{}", e.message);
}

#[test]
fn outputs_with_a_batch_dimension_split_by_rows_as_usual() {
    let r = ragged(&batch_input("BATCH_ELEMENT_COUNT", "TYPE_FP32"));
    let reqs = [request(2), request(1)];
    let refs: Vec<&[NamedTensor]> = reqs.iter().map(|r| &r[..]).collect();
    let out = vec![nt("OUT", Tensor::from_values(vec![2, 3], &[2f32, 2., 1., 2., 2., 1.]))];
    let parts = r.split(out, &refs, &[1, 1]).unwrap();
    assert_eq!(parts[1][0].tensor, Tensor::from_values(vec![1, 3], &[2f32, 2., 1.]));
}

#[test]
fn configs_that_cannot_work_are_load_errors_naming_the_problem() {
    let bad = |extra: &str| {
        let config = parse_pbtxt(&format!(
            r#"name: "m" max_batch_size: 4
            input [ {{ name: "X" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }} ]
            output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }}, {{ name: "S" data_type: TYPE_STRING dims: [ -1 ] }} ]
            {extra}"#
        ))
        .unwrap();
        Ragged::from_config(&config).unwrap_err()
    };
    let e = bad(
        r#"batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "B" data_type: TYPE_INT64 source_input: "X" } ]"#,
    );
    assert!(e.contains("TYPE_INT32 or TYPE_FP32"), "{e}");
    let e = bad(
        r#"batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "B" data_type: TYPE_INT32 source_input: "Z" } ]"#,
    );
    assert!(e.contains("'Z' is not an input"), "{e}");
    let e = bad(
        r#"batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "X" data_type: TYPE_INT32 source_input: "X" } ]"#,
    );
    assert!(e.contains("'X' is also a config input"), "{e}");
    let e = bad(r#"batch_output [ { target_name: "Q" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "X" } ]"#);
    assert!(e.contains("'Q' is not an output"), "{e}");
    let e = bad(r#"batch_output [ { target_name: "S" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "X" } ]"#);
    assert!(e.contains("not BYTES"), "{e}");
    let plain = parse_pbtxt(r#"name: "m" input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]"#).unwrap();
    assert!(Ragged::from_config(&plain).unwrap().is_none());
}
