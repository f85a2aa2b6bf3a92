//! Tests of input planning, data generation and perf_analyzer input JSON.
use super::*;
use crate::bench::SetupKind;

fn spec(name: &str, datatype: &str, shape: &[i64]) -> InputSpec {
    InputSpec {
        name: name.into(),
        datatype: datatype.into(),
        shape: shape.to_vec(),
    }
}

fn info(max_batch_size: u32, inputs: Vec<InputSpec>) -> ModelInfo {
    ModelInfo { inputs, max_batch_size }
}

fn shape(s: &str) -> ShapeOverride {
    s.parse().unwrap()
}

/// BYTES elements of a binary tensor.
fn strings(data: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut rest = data;
    while !rest.is_empty() {
        let n = u32::from_le_bytes(rest[..4].try_into().unwrap()) as usize;
        out.push(rest[4..4 + n].to_vec());
        rest = &rest[4 + n..];
    }
    out
}

#[test]
fn every_datatype_generates_the_right_number_of_bytes() {
    let mut rng = Rng::new(7);
    for dt in DataType::ALL {
        let m = info(4, vec![spec("x", dt.wire_name(), &[-1, 2, 3])]);
        let plan = plan(&m, 4, &[]).unwrap();
        for zeros in [false, true] {
            let t = &generate(&plan, 4, zeros, &mut rng).unwrap()[0];
            assert_eq!((t.datatype, t.shape.clone()), (dt, vec![4, 2, 3]), "{dt}");
            match dt.element_size() {
                Some(size) => assert_eq!(t.data.len(), 24 * size, "{dt} zeros={zeros}"),
                None => {
                    let s = strings(&t.data);
                    assert_eq!(s.len(), 24);
                    if zeros {
                        assert!(s.iter().all(Vec::is_empty));
                    } else {
                        assert!(s
                            .iter()
                            .all(|e| (1..=16).contains(&e.len()) && e.iter().all(u8::is_ascii_alphanumeric)));
                    }
                }
            }
            if zeros && dt != DataType::Bytes {
                assert!(t.data.iter().all(|b| *b == 0));
            }
        }
    }
}

#[test]
fn random_values_stay_in_their_ranges() {
    let mut rng = Rng::new(1);
    let m = info(
        0,
        vec![
            spec("b", "BOOL", &[1000]),
            spec("i", "INT64", &[1000]),
            spec("f", "FP32", &[1000]),
        ],
    );
    let t = generate(&plan(&m, 1, &[]).unwrap(), 1, false, &mut rng).unwrap();
    assert!(t[0].data.iter().all(|b| *b <= 1) && t[0].data.contains(&1) && t[0].data.contains(&0));
    let ints: Vec<i64> = t[1]
        .data
        .chunks(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert!(ints.iter().all(|v| (0..100).contains(v)));
    let floats: Vec<f32> = t[2]
        .data
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert!(floats.iter().all(|v| (0.0..1.0).contains(v)));
    assert!(floats.iter().any(|v| *v != floats[0]), "not all equal");
}

#[test]
fn dynamic_dims_take_shape_flags_or_one() {
    let m = info(0, vec![spec("a", "FP32", &[-1, -1]), spec("b", "FP32", &[-1, 3])]);
    let p = plan(&m, 1, &[shape("a:5,7")]).unwrap();
    assert_eq!((p[0].dims.clone(), p[1].dims.clone()), (vec![5, 7], vec![1, 3]));
    assert_eq!(
        p[0].full_shape(1, &p[0].dims),
        vec![5, 7],
        "no batch dim for an unbatched model"
    );
    // The last --shape for an input wins.
    let p = plan(&m, 1, &[shape("b:2,3"), shape("b:4,3")]).unwrap();
    assert_eq!(p[1].dims, vec![4, 3]);
}

#[test]
fn batching_models_get_the_batch_dim() {
    let m = info(8, vec![spec("x", "INT32", &[-1, 16])]);
    let p = plan(&m, 8, &[]).unwrap();
    assert_eq!((p[0].declared.clone(), p[0].batched), (vec![16], true));
    let t = generate(&p, 8, true, &mut Rng::new(0)).unwrap();
    assert_eq!((t[0].shape.clone(), t[0].data.len()), (vec![8, 16], 8 * 16 * 4));
}

#[test]
fn bad_plans_are_usage_errors_that_say_why() {
    let unbatched = info(0, vec![spec("x", "FP32", &[4])]);
    let e = plan(&unbatched, 2, &[]).unwrap_err();
    assert_eq!(e.kind, SetupKind::Usage);
    assert!(e.message.contains("does not batch"), "{}", e.message);
    let batched = info(4, vec![spec("x", "FP32", &[-1, 4])]);
    assert!(plan(&batched, 5, &[]).unwrap_err().message.contains("max_batch_size 4"));
    let e = plan(&batched, 1, &[shape("y:1")]).unwrap_err();
    assert!(
        e.message.contains("no input 'y'") && e.message.contains("its inputs: x"),
        "{}",
        e.message
    );
    let e = plan(&batched, 1, &[shape("x:5")]).unwrap_err();
    assert!(
        e.message.contains("input 'x'") && e.message.contains("[5]"),
        "{}",
        e.message
    );
    assert!(plan(&batched, 1, &[shape("x:4,1")]).is_err(), "rank must match");
    let e = plan(&info(0, vec![spec("x", "FLOAT", &[1])]), 1, &[]).unwrap_err();
    assert_eq!(e.kind, SetupKind::BadAnswer);
    assert!(e.message.contains("'FLOAT'"));
    let huge = info(0, vec![spec("x", "FP64", &[-1])]);
    let p = plan(&huge, 1, &[shape("x:1000000000")]).unwrap();
    assert!(generate(&p, 1, true, &mut Rng::new(0))
        .unwrap_err()
        .message
        .contains("MiB"));
}

#[test]
fn shape_and_input_flags_parse() {
    assert_eq!(
        shape("a:b:1, 2"),
        ShapeOverride {
            name: "a:b".into(),
            dims: vec![1, 2]
        }
    );
    assert_eq!(shape("s:").dims, Vec::<i64>::new());
    for bad in ["nocolon", ":1", "x:1,,2", "x:-1", "x:a"] {
        assert!(bad.parse::<ShapeOverride>().is_err(), "{bad}");
    }
    assert_eq!("random".parse::<InputSource>(), Ok(InputSource::Random));
    assert_eq!("zeros".parse::<InputSource>(), Ok(InputSource::Zeros));
    assert_eq!("d.json".parse::<InputSource>(), Ok(InputSource::File("d.json".into())));
}

fn two_inputs() -> Vec<Planned> {
    let m = info(4, vec![spec("A", "FP32", &[-1, 2]), spec("S", "BYTES", &[-1, -1])]);
    plan(&m, 1, &[]).unwrap()
}

#[test]
fn input_json_takes_flat_arrays_and_content_with_shape() {
    let text = r#"{"data": [
        {"A": [1.0, 2.5], "S": {"content": ["hi", "", "x"], "shape": [3]}},
        {"A": {"content": [[3, 4]]}, "S": ["only"]}
    ]}"#;
    let reqs = from_json(text, &two_inputs(), 1).unwrap();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0][0].shape, vec![1, 2]);
    assert_eq!(
        &reqs[0][0].data[..],
        [1.0f32.to_le_bytes(), 2.5f32.to_le_bytes()].concat()
    );
    assert_eq!(reqs[0][1].shape, vec![1, 3]);
    assert_eq!(strings(&reqs[0][1].data), vec![b"hi".to_vec(), vec![], b"x".to_vec()]);
    assert_eq!(
        &reqs[1][0].data[..],
        [3.0f32.to_le_bytes(), 4.0f32.to_le_bytes()].concat()
    );
    assert_eq!(
        (reqs[1][1].shape.clone(), strings(&reqs[1][1].data)),
        (vec![1, 1], vec![b"only".to_vec()])
    );
}

#[test]
fn input_json_fills_a_batch_by_repeating_the_entry() {
    let text = r#"{"data": [{"A": [1, 2], "S": ["a"]}]}"#;
    let m = info(4, vec![spec("A", "FP32", &[-1, 2]), spec("S", "BYTES", &[-1, -1])]);
    let reqs = from_json(text, &plan(&m, 3, &[]).unwrap(), 3).unwrap();
    assert_eq!(reqs[0][0].shape, vec![3, 2]);
    assert_eq!(reqs[0][0].data.len(), 3 * 2 * 4);
    assert_eq!(strings(&reqs[0][1].data).len(), 3);
}

#[test]
fn input_json_encodes_each_datatype() {
    let cases: [(&str, &str, Vec<u8>); 8] = [
        ("BOOL", "[true, false]", vec![1, 0]),
        ("INT8", "[-1, 127]", vec![0xff, 0x7f]),
        ("UINT16", "[1, 65535]", vec![1, 0, 0xff, 0xff]),
        ("INT32", "[-2, 3]", [(-2i32).to_le_bytes(), 3i32.to_le_bytes()].concat()),
        (
            "UINT64",
            "[18446744073709551615, 0]",
            [u64::MAX.to_le_bytes(), 0u64.to_le_bytes()].concat(),
        ),
        (
            "FP16",
            "[1.0, -2]",
            [
                half::f16::from_f32(1.0).to_le_bytes(),
                half::f16::from_f32(-2.0).to_le_bytes(),
            ]
            .concat(),
        ),
        (
            "BF16",
            "[1.0, 0.5]",
            [
                half::bf16::from_f32(1.0).to_le_bytes(),
                half::bf16::from_f32(0.5).to_le_bytes(),
            ]
            .concat(),
        ),
        (
            "FP64",
            "[0.25, 8]",
            [0.25f64.to_le_bytes(), 8f64.to_le_bytes()].concat(),
        ),
    ];
    for (dt, values, want) in cases {
        let p = plan(&info(0, vec![spec("X", dt, &[2])]), 1, &[]).unwrap();
        let reqs = from_json(&format!(r#"{{"data": [{{"X": {values}}}]}}"#), &p, 1).unwrap();
        assert_eq!(reqs[0][0].data.to_vec(), want, "{dt}");
    }
}

#[test]
fn bad_input_json_names_the_entry_and_the_input() {
    let p = two_inputs();
    let err = |text: &str| {
        let e = from_json(text, &p, 1).unwrap_err();
        assert_eq!(e.kind, SetupKind::Usage);
        e.message
    };
    assert!(err("{").starts_with("not JSON"));
    assert!(err(r#"{"inputs": []}"#).contains("\"data\" array"));
    assert!(err(r#"{"data": []}"#).contains("empty"));
    assert!(err(r#"{"data": [[{"A": [1, 2]}]]}"#).contains("sequences"));
    assert_eq!(
        err(r#"{"data": [{"A": [1, 2]}]}"#),
        "data entry 0: input 'S' is missing"
    );
    assert!(err(r#"{"data": [{"A": [1, 2], "S": ["a"], "Z": [1]}]}"#).contains("no input 'Z'"));
    let m = err(r#"{"data": [{"A": [1, 2], "S": ["a"]}, {"A": [1, 2, 3], "S": ["a"]}]}"#);
    assert_eq!(m, "data entry 1: input 'A': 3 values, but shape [2] holds 2");
    let m = err(r#"{"data": [{"A": [1, "x"], "S": ["a"]}]}"#);
    assert_eq!(m, "data entry 0: input 'A': value 1: expected a number, got \"x\"");
    assert!(err(r#"{"data": [{"A": [1, 2], "S": [7]}]}"#).contains("input 'S': value 0: expected a string"));
    assert!(err(r#"{"data": [{"A": {"content": [1, 2], "shape": [1, 2]}, "S": ["a"]}]}"#).contains("does not fit"));
    assert!(err(r#"{"data": [{"A": {"content": [1, 2], "shape": [3]}, "S": ["a"]}]}"#).contains("does not fit"));
    assert!(err(r#"{"data": [{"A": {"b64": "AAAA"}, "S": ["a"]}]}"#).contains("b64"));
    assert!(err(r#"{"data": [{"A": 5, "S": ["a"]}]}"#).contains("input 'A': expected an array"));
    let ints = plan(&info(0, vec![spec("I", "INT8", &[1])]), 1, &[]).unwrap();
    let e = from_json(r#"{"data": [{"I": [200]}]}"#, &ints, 1).unwrap_err();
    assert!(e.message.contains("200 is out of range for INT8"), "{}", e.message);
    let e = from_json(r#"{"data": [{"I": [1.5]}]}"#, &ints, 1).unwrap_err();
    assert!(e.message.contains("expected an integer"), "{}", e.message);
}
