//! How mesh-ops writes what routers answer: lenient readers for JSON that may lack fields or
//! hold other types, tables, ages and durations, terminal-safe text, and JSON re-indented.
use std::fmt::Write;

use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// A value of type `T`, or its default when null or of another type.
pub fn lenient<'de, D: Deserializer<'de>, T: Default + serde::de::DeserializeOwned>(d: D) -> Result<T, D::Error> {
    Ok(serde_json::from_value(Value::deserialize(d)?).unwrap_or_default())
}

/// The items of a list that read as `T` (objects); others are skipped. A non-list is empty.
pub fn lenient_list<'de, D: Deserializer<'de>, T: serde::de::DeserializeOwned>(d: D) -> Result<Vec<T>, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::Array(items) => items
            .into_iter()
            .filter_map(|item| serde_json::from_value(item).ok())
            .collect(),
        _ => Vec::new(),
    })
}

/// A string; a number or boolean is written out; anything else is empty.
pub fn text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(value_text(Value::deserialize(d)?))
}

/// A list of strings (see [`text`]); a non-list is empty.
pub fn texts<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::Array(items) => items.into_iter().map(value_text).collect(),
        _ => Vec::new(),
    })
}

fn value_text(value: Value) -> String {
    match value {
        Value::String(s) => s,
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        _ => String::new(),
    }
}

/// A report age: "120 ms", "3.2 s", "4m 05s".
pub fn age(ms: f64) -> String {
    match ms {
        ms if !ms.is_finite() || ms < 0.0 => "-".into(),
        ms if ms < 1000.0 => format!("{} ms", ms.round()),
        ms => seconds(ms / 1000.0),
    }
}

/// A duration in seconds: "3.2 s", "4m 05s", "2h 03m", "3d 04h".
pub fn seconds(s: f64) -> String {
    if !s.is_finite() || s < 0.0 {
        return "-".into();
    }
    if s < 60.0 {
        return format!("{s:.1} s");
    }
    let whole = s as u64;
    match whole {
        w if w < 3600 => format!("{}m {:02}s", w / 60, w % 60),
        w if w < 86_400 => format!("{}h {:02}m", w / 3600, w % 3600 / 60),
        w => format!("{}d {:02}h", w / 86_400, w % 86_400 / 3600),
    }
}

/// Rows under headers, columns padded to their widest cell; "(none)" for no rows.
pub fn table(headers: &[&str], rows: impl Iterator<Item = Vec<String>>) -> String {
    let rows: Vec<Vec<String>> = rows
        .map(|row| row.iter().map(|cell| empty_dash(sanitize(cell))).collect())
        .collect();
    if rows.is_empty() {
        return "  (none)\n".into();
    }
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header_row: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header_row).chain(&rows) {
        let mut line = String::new();
        for (i, (cell, width)) in row.iter().zip(&widths).enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            let _ = write!(line, "{cell:<width$}");
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn empty_dash(cell: String) -> String {
    match cell.is_empty() {
        true => "-".into(),
        false => cell,
    }
}

/// Text from the network made safe for a terminal: control characters become '?'.
pub fn sanitize(text: &str) -> String {
    text.chars().map(|c| if c.is_control() { '?' } else { c }).collect()
}

/// Re-indents valid JSON text with two spaces, keeping its keys in the order received and its numbers as
/// written (parsing into a map would sort the keys).
pub fn pretty_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len() * 2);
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    let mut chars = json.chars().peekable();
    let newline = |out: &mut String, depth: usize| {
        out.push('\n');
        out.extend(std::iter::repeat_n("  ", depth));
    };
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            '{' | '[' => {
                out.push(c);
                while chars.peek().is_some_and(|c| c.is_whitespace()) {
                    chars.next();
                }
                if let Some(&close @ ('}' | ']')) = chars.peek() {
                    out.push(close);
                    chars.next();
                } else {
                    depth += 1;
                    newline(&mut out, depth);
                }
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(c);
            }
            ',' => {
                out.push(c);
                newline(&mut out, depth);
            }
            ':' => out.push_str(": "),
            c if c.is_whitespace() => {}
            c => out.push(c),
        }
    }
    out
}
