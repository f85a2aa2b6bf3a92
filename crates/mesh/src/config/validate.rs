//! Structural checks on a model config, independent of any backend, with messages that name the problem.
use std::collections::HashSet;

use super::ModelConfig;
use crate::dtype::DataType;
use crate::proto::model_config::SchedulingChoice;
use crate::proto::model_version_policy::PolicyChoice;

/// Each priority level gets its own queue, so the count is bounded.
pub const MAX_PRIORITY_LEVELS: u64 = 1024;

/// Checks names, data types, dims, reshapes, batch size and version policy.
pub fn validate_config(c: &ModelConfig) -> Result<(), String> {
    if c.name.is_empty() {
        return Err("model config has no name".into());
    }
    if c.max_batch_size < 0 {
        return Err(format!("max_batch_size must be >= 0, got {}", c.max_batch_size));
    }
    // Names that become paths under the model's directory.
    if !c.default_model_filename.is_empty() {
        crate::repository::check_file_in_model("default_model_filename", &c.default_model_filename)
            .map_err(|e| e.message)?;
    }
    for o in c.output.iter().filter(|o| !o.label_filename.is_empty()) {
        crate::repository::check_file_in_model(&format!("output '{}': label_filename", o.name), &o.label_filename)
            .map_err(|e| e.message)?;
    }
    let mut seen = HashSet::new();
    for i in &c.input {
        check_tensor(
            "input",
            &i.name,
            i.data_type,
            &i.dims,
            i.reshape.as_ref().map(|r| &r.shape[..]),
        )?;
        if !seen.insert(i.name.as_str()) {
            return Err(format!("input '{}' is declared more than once", i.name));
        }
    }
    let mut seen = HashSet::new();
    for o in &c.output {
        check_tensor(
            "output",
            &o.name,
            o.data_type,
            &o.dims,
            o.reshape.as_ref().map(|r| &r.shape[..]),
        )?;
        if !seen.insert(o.name.as_str()) {
            return Err(format!("output '{}' is declared more than once", o.name));
        }
    }
    if let Some(SchedulingChoice::DynamicBatching(db)) = &c.scheduling_choice {
        if db.priority_levels > MAX_PRIORITY_LEVELS {
            return Err(format!(
                "dynamic_batching priority_levels is {}; at most {MAX_PRIORITY_LEVELS} are supported",
                db.priority_levels
            ));
        }
    }
    // As Triton: a cached answer is keyed by the inputs alone, which decide neither a sequence's
    // answers (its state) nor a decoupled model's (any number of them).
    if c.response_cache.as_ref().is_some_and(|r| r.enable) {
        let refused = |what: &str| {
            format!(
                "Response Cache does not currently support model {} with {what}. Please disable the response cache.",
                c.name
            )
        };
        if matches!(c.scheduling_choice, Some(SchedulingChoice::SequenceBatching(_))) {
            return Err(refused("sequence batching scheduler"));
        }
        if c.model_transaction_policy.as_ref().is_some_and(|p| p.decoupled) {
            return Err(refused("'decoupled' transaction policy"));
        }
    }
    if let Some(PolicyChoice::Latest(l)) = c.version_policy.as_ref().and_then(|p| p.policy_choice.as_ref()) {
        if l.num_versions == 0 {
            return Err("version_policy latest { num_versions } must be at least 1".into());
        }
    }
    if let Some(PolicyChoice::Specific(s)) = c.version_policy.as_ref().and_then(|p| p.policy_choice.as_ref()) {
        if let Some(v) = s.versions.iter().find(|&&v| v < 1) {
            return Err(format!(
                "version_policy specific lists version {v}; versions start at 1"
            ));
        }
    }
    Ok(())
}

fn check_tensor(kind: &str, name: &str, data_type: i32, dims: &[i64], reshape: Option<&[i64]>) -> Result<(), String> {
    if name.is_empty() {
        return Err(format!("an {kind} has no name"));
    }
    if DataType::from_config(data_type).is_none() {
        return Err(format!("{kind} '{name}' has no valid data_type"));
    }
    if dims.is_empty() {
        return Err(format!("{kind} '{name}' must specify dims"));
    }
    check_dims(kind, name, "dims", dims)?;
    if let Some(shape) = reshape {
        check_dims(kind, name, "reshape", shape)?;
        let (var_a, fixed_a) = split_dims(dims);
        let (var_b, fixed_b) = split_dims(shape);
        if var_a != var_b || fixed_a != fixed_b {
            return Err(format!(
                "{kind} '{name}' reshape {shape:?} does not hold the same number of elements as dims {dims:?}"
            ));
        }
    }
    Ok(())
}

fn check_dims(kind: &str, name: &str, what: &str, dims: &[i64]) -> Result<(), String> {
    if let Some(d) = dims.iter().find(|&&d| d == 0 || d < -1) {
        return Err(format!(
            "{kind} '{name}' {what} {dims:?} has invalid dimension {d} (use -1 for a variable size)"
        ));
    }
    Ok(())
}

/// Number of variable dims and the product of the fixed ones (saturating, as it only feeds a comparison).
fn split_dims(dims: &[i64]) -> (usize, i64) {
    let var = dims.iter().filter(|&&d| d == -1).count();
    let fixed = dims.iter().filter(|&&d| d > 0).fold(1i64, |a, &d| a.saturating_mul(d));
    (var, fixed)
}

#[cfg(test)]
mod tests {
    use super::super::parse_pbtxt;
    use super::*;

    #[test]
    fn file_names_in_the_config_stay_inside_the_model() {
        let base = "name: \"m\" input [ { name: \"x\" data_type: TYPE_FP32 dims: [ 1 ] } ] ";
        let e = check(&format!("{base} default_model_filename: \"../../etc/passwd\"")).unwrap_err();
        assert!(
            e.starts_with("default_model_filename '../../etc/passwd' must be a file inside"),
            "{e}"
        );
        let e = check(&format!("{base} default_model_filename: \"/abs/model.onnx\"")).unwrap_err();
        assert!(e.contains("inside the model directory"), "{e}");
        let e = check(&format!(
            "{base} output [ {{ name: \"y\" data_type: TYPE_FP32 dims: [ 1 ] label_filename: \"../l.txt\" }} ]"
        ))
        .unwrap_err();
        assert!(e.starts_with("output 'y': label_filename '../l.txt'"), "{e}");
        assert!(check(&format!("{base} default_model_filename: \"w.onnx\"")).is_ok());
    }

    fn check(text: &str) -> Result<(), String> {
        validate_config(&parse_pbtxt(text).unwrap())
    }

    #[test]
    fn good_config_passes() {
        check(
            "name: \"m\" max_batch_size: 4 input [ { name: \"a\" data_type: TYPE_FP32 dims: [ -1, 4 ] reshape { shape: [ -1, 2, 2 ] } } ] output [ { name: \"b\" data_type: TYPE_STRING dims: [ 1 ] } ]",
        )
        .unwrap();
    }

    #[test]
    fn precise_errors() {
        let cases = [
            ("max_batch_size: -1", "max_batch_size must be >= 0"),
            ("input [ { name: \"a\" data_type: TYPE_FP32 } ]", "input 'a' must specify dims"),
            ("input [ { name: \"a\" dims: [1] } ]", "input 'a' has no valid data_type"),
            ("input [ { name: \"a\" data_type: TYPE_FP32 dims: [ 0 ] } ]", "invalid dimension 0"),
            ("input [ { name: \"a\" data_type: TYPE_FP32 dims: [ -2 ] } ]", "invalid dimension -2"),
            (
                "input [ { name: \"a\" data_type: TYPE_FP32 dims: [1] }, { name: \"a\" data_type: TYPE_FP32 dims: [1] } ]",
                "input 'a' is declared more than once",
            ),
            (
                "output [ { name: \"o\" data_type: TYPE_FP32 dims: [1] }, { name: \"o\" data_type: TYPE_FP32 dims: [1] } ]",
                "output 'o' is declared more than once",
            ),
            (
                "input [ { name: \"a\" data_type: TYPE_FP32 dims: [ 6 ] reshape { shape: [ 4 ] } } ]",
                "does not hold the same number of elements",
            ),
            ("version_policy { latest { num_versions: 0 } }", "num_versions"),
            ("dynamic_batching { priority_levels: 5000 }", "at most 1024"),
            ("version_policy { specific { versions: [0] } }", "version 0"),
        ];
        for (body, want) in cases {
            let e = check(&format!("name: \"m\" {body}")).unwrap_err();
            assert!(e.contains(want), "{body}: {e}");
        }
        assert!(check("max_batch_size: 1").unwrap_err().contains("no name"));
    }
}
