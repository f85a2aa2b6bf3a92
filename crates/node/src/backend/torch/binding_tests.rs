//! Tests of binding a config's inputs to TorchScript forward arguments (by name or by index).
use super::*;

fn input(name: &str, dtype: DataType, dims: &[i64]) -> TensorSpec {
    TensorSpec {
        name: name.into(),
        dtype,
        dims: dims.to_vec(),
    }
}

fn arg(name: &str, ty: ArgType, has_default: bool) -> Arg {
    Arg {
        name: name.into(),
        ty,
        has_default,
    }
}

fn filled(b: &Binding) -> Vec<(String, Option<usize>)> {
    match b {
        Binding::Dict => panic!("expected positional"),
        Binding::Positional(slots) => slots.iter().map(|s| (s.arg.clone(), s.input)).collect(),
    }
}

#[test]
fn inputs_bind_by_argument_name_in_any_config_order() {
    let sig = [arg("x", ArgType::Tensor, false), arg("y", ArgType::Tensor, false)];
    let ins = [input("y", DataType::Fp32, &[4]), input("x", DataType::Fp32, &[4])];
    let b = bind_inputs(&ins, Some(&sig), true).unwrap();
    assert_eq!(filled(&b), vec![("x".into(), Some(1)), ("y".into(), Some(0))]);
}

#[test]
fn inputs_bind_by_triton_index_convention() {
    let sig = [arg("a", ArgType::Tensor, false), arg("b", ArgType::Tensor, false)];
    let ins = [
        input("INPUT__1", DataType::Fp32, &[4]),
        input("INPUT__0", DataType::Fp32, &[4]),
    ];
    let b = bind_inputs(&ins, Some(&sig), true).unwrap();
    assert_eq!(filled(&b), vec![("a".into(), Some(1)), ("b".into(), Some(0))]);
    let err = bind_inputs(&[input("INPUT__2", DataType::Fp32, &[4])], Some(&sig), true).unwrap_err();
    assert!(err.contains("argument 2") && err.contains("2 argument"), "{err}");
    let dup = [input("A__0", DataType::Fp32, &[4]), input("B__0", DataType::Fp32, &[4])];
    assert!(bind_inputs(&dup, Some(&sig), true)
        .unwrap_err()
        .contains("both name argument 0"));
}

#[test]
fn without_a_signature_the_convention_or_config_order_binds() {
    let ins = [
        input("INPUT__1", DataType::Fp32, &[4]),
        input("INPUT__0", DataType::Fp32, &[4]),
    ];
    let b = bind_inputs(&ins, None, true).unwrap();
    assert_eq!(
        filled(&b),
        vec![("argument 0".into(), Some(1)), ("argument 1".into(), Some(0))]
    );
    let gap = [input("INPUT__1", DataType::Fp32, &[4])];
    assert!(bind_inputs(&gap, None, true).unwrap_err().contains("argument 1"));
    // A huge index is an error, not an allocation of that many slots.
    let huge = [input("X__18446744073709551615", DataType::Fp32, &[4])];
    assert!(bind_inputs(&huge, None, true).unwrap_err().contains("takes 1 argument"));
    let plain = [input("p", DataType::Fp32, &[4]), input("q", DataType::Fp32, &[4])];
    assert_eq!(
        filled(&bind_inputs(&plain, None, true).unwrap()),
        vec![("p".into(), Some(0)), ("q".into(), Some(1))]
    );
}

#[test]
fn unknown_names_and_missing_arguments_are_load_errors() {
    let sig = [arg("x", ArgType::Tensor, false), arg("y", ArgType::Tensor, false)];
    let err = bind_inputs(&[input("z", DataType::Fp32, &[4])], Some(&sig), true).unwrap_err();
    assert!(err.contains("'z'") && err.contains("convention"), "{err}");
    let err = bind_inputs(&[input("x", DataType::Fp32, &[4])], Some(&sig), true).unwrap_err();
    assert!(err.contains("needs argument 'y'"), "{err}");
}

#[test]
fn trailing_defaults_are_left_out_of_the_call() {
    let sig = [
        arg("x", ArgType::Tensor, false),
        arg("state", ArgType::Tensor, true),
        arg("maybe", ArgType::OptionalTensor, true),
    ];
    let b = bind_inputs(&[input("x", DataType::Fp32, &[4])], Some(&sig), false).unwrap();
    assert_eq!(filled(&b), vec![("x".into(), Some(0))]);
    let ins = [input("x", DataType::Fp32, &[4]), input("maybe", DataType::Fp32, &[4])];
    let err = bind_inputs(&ins, Some(&sig), false).unwrap_err();
    assert!(
        err.contains("'state' has a default, but a later argument is given"),
        "{err}"
    );
    let sig = [
        arg("x", ArgType::Tensor, false),
        arg("maybe", ArgType::OptionalTensor, false),
        arg("y", ArgType::Tensor, false),
    ];
    let ins = [input("x", DataType::Fp32, &[4]), input("y", DataType::Fp32, &[4])];
    let b = bind_inputs(&ins, Some(&sig), false).unwrap();
    assert_eq!(filled(&b).len(), 3, "an unfilled Optional[Tensor] is passed as None");
}

#[test]
fn scalar_and_string_arguments_check_their_inputs() {
    let sig = [arg("x", ArgType::Tensor, false), arg("sr", ArgType::Int, false)];
    let ok = [
        input("x", DataType::Fp32, &[-1, 512]),
        input("sr", DataType::Int64, &[1]),
    ];
    assert!(bind_inputs(&ok, Some(&sig), false).is_ok());
    let err = bind_inputs(&ok, Some(&sig), true).unwrap_err();
    assert!(err.contains("max_batch_size: 0"), "{err}");
    let wide = [
        input("x", DataType::Fp32, &[-1, 512]),
        input("sr", DataType::Int64, &[2]),
    ];
    assert!(bind_inputs(&wide, Some(&sig), false)
        .unwrap_err()
        .contains("dims must be [1]"));
    let float = [
        input("x", DataType::Fp32, &[-1, 512]),
        input("sr", DataType::Fp32, &[1]),
    ];
    let err = bind_inputs(&float, Some(&sig), false).unwrap_err();
    assert!(err.contains("'sr' is FP32") && err.contains("Int"), "{err}");
    let strs = [arg("names", ArgType::StrList, false)];
    assert!(bind_inputs(&[input("names", DataType::Bytes, &[-1])], Some(&strs), true).is_ok());
    let err = bind_inputs(&[input("names", DataType::Fp32, &[-1])], Some(&strs), true).unwrap_err();
    assert!(err.contains("StrList"), "{err}");
    let tensor = [arg("t", ArgType::Tensor, false)];
    assert!(bind_inputs(&[input("t", DataType::Bytes, &[1])], Some(&tensor), true).is_err());
    let odd = [arg("t", ArgType::Other("Tuple[Tensor, Tensor]".into()), false)];
    let err = bind_inputs(&[input("t", DataType::Fp32, &[1])], Some(&odd), true).unwrap_err();
    assert!(err.contains("Tuple[Tensor, Tensor]"), "{err}");
}

#[test]
fn a_single_dict_argument_takes_every_input_by_key() {
    let sig = [arg("inputs", ArgType::TensorDict, false)];
    let ins = [input("a", DataType::Fp32, &[4]), input("b", DataType::Int64, &[2])];
    assert_eq!(bind_inputs(&ins, Some(&sig), true).unwrap(), Binding::Dict);
    let err = bind_inputs(&[input("s", DataType::Bytes, &[1])], Some(&sig), true).unwrap_err();
    assert!(err.contains("BYTES"), "{err}");
}

fn map(entries: &[(&str, Produced)]) -> Produced {
    Produced::Map(entries.iter().map(|(k, v)| (k.to_string(), v.clone())).collect())
}

#[test]
fn dict_outputs_map_by_key_whatever_the_order() {
    let p = map(&[("sum", Produced::Leaf(0)), ("diff", Produced::Leaf(1))]);
    let all = ["diff", "sum"];
    assert_eq!(assign_outputs(&p, &all, &all).unwrap(), vec![1, 0]);
    assert_eq!(assign_outputs(&p, &["sum"], &all).unwrap(), vec![0]);
    let err = assign_outputs(&p, &["prod"], &["prod"]).unwrap_err();
    assert!(
        err.contains("'prod' is not produced") && err.contains("\"sum\""),
        "{err}"
    );
}

#[test]
fn tuples_map_in_config_order_or_by_index_convention() {
    let p = Produced::Seq(vec![Produced::Leaf(0), Produced::Leaf(1)]);
    assert_eq!(assign_outputs(&p, &["a", "b"], &["a", "b"]).unwrap(), vec![0, 1]);
    let all = ["OUTPUT__1", "OUTPUT__0"];
    assert_eq!(assign_outputs(&p, &all, &all).unwrap(), vec![1, 0]);
    assert_eq!(
        assign_outputs(&Produced::Leaf(0), &["only"], &["only"]).unwrap(),
        vec![0]
    );
    let err = assign_outputs(&Produced::Leaf(0), &["b"], &["a", "b"]).unwrap_err();
    assert!(
        err.contains("'b' is not produced") && err.contains("1 unnamed"),
        "{err}"
    );
}

#[test]
fn nested_results_map_when_unambiguous() {
    // (logits, {"det": {"boxes": .., "scores": ..}})
    let p = Produced::Seq(vec![
        Produced::Leaf(0),
        map(&[(
            "det",
            map(&[("boxes", Produced::Leaf(1)), ("scores", Produced::Leaf(2))]),
        )]),
    ]);
    let all = ["scores", "logits", "det.boxes"];
    assert_eq!(assign_outputs(&p, &all, &all).unwrap(), vec![2, 0, 1]);
    // Two dicts with the same key: the last key alone is ambiguous, the full path is not.
    let twice = Produced::Seq(vec![
        map(&[("a", map(&[("x", Produced::Leaf(0))]))]),
        map(&[("b", map(&[("x", Produced::Leaf(1))]))]),
    ]);
    let err = assign_outputs(&twice, &["x"], &["x"]).unwrap_err();
    assert!(
        err.contains("ambiguous") && err.contains("a.x") && err.contains("b.x"),
        "{err}"
    );
    assert_eq!(assign_outputs(&twice, &["b.x"], &["b.x"]).unwrap(), vec![1]);
}

#[test]
fn the_index_convention_is_read_strictly() {
    assert_eq!(convention_index("OUTPUT__0"), Some(0));
    assert_eq!(convention_index("a__b__12"), Some(12));
    assert_eq!(convention_index("__3"), None);
    assert_eq!(convention_index("x__"), None);
    assert_eq!(convention_index("x__1a"), None);
    assert_eq!(convention_index("plain"), None);
}
