//! Protobuf text-format parsing of `config.pbtxt`, accepting Triton's colon-less lists (`input [ ... ]`).
use prost_reflect::DynamicMessage;

use super::{model_config_descriptor, ModelConfig};

/// Parses config.pbtxt text; errors name the problem with its line and column.
pub fn parse_pbtxt(text: &str) -> Result<ModelConfig, String> {
    parse_pbtxt_with_fields(text).map(|(c, _)| c)
}

/// Parses config.pbtxt and also lists the top-level fields the text sets, since proto3
/// cannot tell an omitted `max_batch_size` from an explicit 0 and auto-complete must.
pub fn parse_pbtxt_with_fields(text: &str) -> Result<(ModelConfig, Vec<String>), String> {
    let Lexed {
        text: normalized,
        inserted,
        top_level,
    } = add_list_colons(text);
    let dynamic = DynamicMessage::parse_text_format(model_config_descriptor(), &normalized).map_err(|e| {
        match span_start(&format!("{e:?}")) {
            Some(pos) => {
                let orig = pos - inserted.iter().filter(|&&at| at < pos).count();
                let (line, col) = line_col(text, orig);
                format!("config.pbtxt line {line} column {col}: {e}")
            }
            None => format!("config.pbtxt: {e}"),
        }
    })?;
    let config = dynamic
        .transcode_to::<ModelConfig>()
        .map_err(|e| format!("config.pbtxt: {e}"))?;
    Ok((config, top_level))
}

struct Lexed {
    text: String,
    /// Offsets in `text` where a ':' was inserted.
    inserted: Vec<usize>,
    /// Identifiers seen outside any braces or brackets: the top-level field names.
    top_level: Vec<String>,
}

/// Inserts ':' between a field name and a following '[', skipping strings and comments.
fn add_list_colons(text: &str) -> Lexed {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len() + 16);
    let mut inserted = Vec::new();
    let mut top_level = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    // Offset in `out` just after the last identifier, if nothing but space/comments followed it.
    let mut after_ident: Option<usize> = None;
    while i < b.len() {
        let c = b[i];
        match c {
            b'#' => {
                let end = text[i..].find('\n').map_or(b.len(), |n| i + n);
                out.push_str(&text[i..end]);
                i = end;
            }
            b'"' | b'\'' => {
                let mut j = i + 1;
                while j < b.len() && b[j] != c && b[j] != b'\n' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                let end = (j + 1).min(b.len());
                out.push_str(&text[i..end]);
                i = end;
                after_ident = None;
            }
            c if c.is_ascii_whitespace() => {
                out.push(c as char);
                i += 1;
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let start = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'.') {
                    i += 1;
                }
                out.push_str(&text[start..i]);
                if depth == 0 {
                    top_level.push(text[start..i].to_string());
                }
                after_ident = Some(out.len());
                continue;
            }
            b'[' => {
                if let Some(at) = after_ident {
                    out.insert(at, ':');
                    inserted.push(at);
                }
                out.push('[');
                i += 1;
                depth += 1;
                after_ident = None;
            }
            b'{' | b'<' => {
                out.push(c as char);
                i += 1;
                depth += 1;
                after_ident = None;
            }
            b']' | b'}' | b'>' => {
                out.push(c as char);
                i += 1;
                depth = depth.saturating_sub(1);
                after_ident = None;
            }
            _ => {
                let ch = text[i..].chars().next().unwrap_or('\u{fffd}');
                out.push(ch);
                i += ch.len_utf8().max(1);
                after_ident = None;
            }
        }
    }
    Lexed {
        text: out,
        inserted,
        top_level,
    }
}

/// Finds the first `span: A..B` in an error's Debug text (the Display form has no position).
fn span_start(debug: &str) -> Option<usize> {
    let at = debug.find("span: ")? + "span: ".len();
    let digits: String = debug[at..].chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rfind('\n').map_or(before.len(), |n| before.len() - n - 1) + 1;
    (line, col)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{model_instance_group::Kind, model_version_policy::PolicyChoice};

    const TRITON_STYLE: &str = r#"
# a comment with input [ brackets ] and "quotes"
name: "simple"   # trailing comment
platform: "onnxruntime_onnx"
max_batch_size: 8
version_policy: { specific { versions: [1, 3] } }
input [
  {
    name: "INPUT0"
    data_type: TYPE_FP32
    dims: [ 16 ]
    reshape { shape [ 4, 4 ] }
  },
  {
    name: "IN[1]"
    data_type: TYPE_STRING
    dims [ -1 ]
    optional: true
  }
]
output [ { name: "OUTPUT0" data_type: TYPE_INT64 dims: [ 16 ] label_filename: "labels.txt" } ]
instance_group [ { count: 2 kind: KIND_CPU }, { kind: KIND_GPU gpus: [ 0, 1 ] } ]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
  priority_levels: 2
  default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 5 max_queue_size: 10 }
  priority_queue_policy { key: 1 value: { max_queue_size: 3 } }
}
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
parameters [ { key: "k2" value { string_value: "it's # not a comment" } } ]
model_warmup [ { name: "w" batch_size: 1 inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [16] zero_data: true } } } ]
optimization { execution_accelerators { gpu_execution_accelerator : [ { name : "tensorrt" parameters { key: "precision_mode" value: "FP16" } } ] } }
model_transaction_policy { decoupled: false }
response_cache { enable: true }
"#;

    #[test]
    fn parses_triton_style_config_with_every_field_kind() {
        let c = parse_pbtxt(TRITON_STYLE).unwrap();
        assert_eq!(c.name, "simple");
        assert_eq!(c.max_batch_size, 8);
        assert_eq!(c.input.len(), 2);
        assert_eq!(c.input[0].dims, vec![16]);
        assert_eq!(c.input[0].reshape.as_ref().unwrap().shape, vec![4, 4]);
        assert_eq!(c.input[1].name, "IN[1]");
        assert!(c.input[1].optional);
        assert_eq!(c.output[0].data_type, crate::proto::DataType::TypeInt64 as i32);
        assert_eq!(c.instance_group[0].count, 2);
        assert_eq!(c.instance_group[0].kind, Kind::Cpu as i32);
        assert_eq!(c.instance_group[1].gpus, vec![0, 1]);
        match c.version_policy.unwrap().policy_choice.unwrap() {
            PolicyChoice::Specific(s) => assert_eq!(s.versions, vec![1, 3]),
            other => panic!("wrong policy {other:?}"),
        }
        let Some(crate::proto::model_config::SchedulingChoice::DynamicBatching(db)) = c.scheduling_choice else {
            panic!("no dynamic batching")
        };
        assert_eq!(db.preferred_batch_size, vec![4, 8]);
        assert_eq!(db.priority_queue_policy[&1].max_queue_size, 3);
        assert_eq!(c.parameters["intra_op_thread_count"].string_value, "1");
        assert_eq!(c.parameters["k2"].string_value, "it's # not a comment");
        assert_eq!(c.model_warmup[0].inputs["INPUT0"].dims, vec![16]);
        assert!(c.response_cache.unwrap().enable);
    }

    #[test]
    fn reports_top_level_fields() {
        let (_, f) =
            parse_pbtxt_with_fields("name: \"m\" # max_batch_size\ninput [ { name: \"max_batch_size\" } ]").unwrap();
        assert_eq!(f, vec!["name", "input"]);
        let (_, f) = parse_pbtxt_with_fields("max_batch_size: 0").unwrap();
        assert_eq!(f, vec!["max_batch_size"]);
    }

    #[test]
    fn strings_and_comments_are_never_rewritten() {
        let c = parse_pbtxt("name: \"a [b] c\" # x [ y ]\nplatform: 'p[1]'").unwrap();
        assert_eq!(c.name, "a [b] c");
        assert_eq!(c.platform, "p[1]");
    }

    #[test]
    fn unknown_field_error_names_field_and_line() {
        let e = parse_pbtxt("name: \"m\"\nmax_batch_size: 1\n  foo_bar: 1\n").unwrap_err();
        assert!(e.contains("foo_bar"), "{e}");
        assert!(e.contains("line 3 column 3"), "{e}");
    }

    #[test]
    fn positions_account_for_inserted_colons() {
        let e = parse_pbtxt("input [ { name: \"a\" } ]\noutput [ { nme: \"b\" } ]").unwrap_err();
        assert!(e.contains("line 2 column 12"), "{e}");
        assert!(e.contains("nme"), "{e}");
    }

    #[test]
    fn unknown_enum_value_is_named() {
        let e = parse_pbtxt("input [ { name: \"a\" data_type: TYPE_FLOAT99 } ]").unwrap_err();
        assert!(e.contains("TYPE_FLOAT99"), "{e}");
        assert!(e.contains("line 1"), "{e}");
    }

    #[test]
    fn syntax_errors_do_not_panic() {
        for bad in [
            "input [",
            "name: ",
            "{{{",
            "name: \"unterminated",
            "]]]",
            "max_batch_size: 99999999999",
        ] {
            assert!(parse_pbtxt(bad).is_err(), "{bad}");
        }
    }
}
