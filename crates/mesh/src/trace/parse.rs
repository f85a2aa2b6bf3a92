//! Reading changes to trace settings: the keys Triton knows, their values and Triton's errors for
//! bad ones (a sans-IO part of the trace extension).
use super::{Change, Fields, Mode};
use crate::error::{Error, Result};

/// A change to a known setting.
pub(super) type Known = (&'static str, Option<Vec<String>>);

/// The changes to settings `mode` knows. The trace file can never change (refused as Triton
/// refuses it: UNSUPPORTED in OpenTelemetry mode); in OpenTelemetry mode the mode is not a
/// setting (ignored, as Triton ignores it).
pub(super) fn parse_changes(changes: &[Change], mode: Mode) -> Result<Vec<Known>> {
    let mut out = Vec::new();
    for (key, value) in changes {
        let key: &'static str = match key.as_str() {
            "trace_level" => "trace_level",
            "trace_rate" => "trace_rate",
            "trace_count" => "trace_count",
            "log_frequency" => "log_frequency",
            "trace_file" => {
                let words = "trace file location can not be updated through network protocol";
                return Err(match mode {
                    Mode::Triton => Error::invalid(words),
                    Mode::OpenTelemetry => Error::unsupported(words),
                });
            }
            "trace_mode" if mode == Mode::OpenTelemetry => continue,
            "trace_mode" => "trace_mode",
            _ => continue, // as Triton: a setting it does not know is ignored
        };
        out.push((key, value.clone()));
    }
    Ok(out)
}

fn one<'a>(key: &str, values: &'a [String]) -> Result<&'a str> {
    match values {
        [v] => Ok(v.trim()),
        _ => Err(Error::invalid(format!("'{key}' takes one value, got {}", values.len()))),
    }
}

/// A setting's number as Triton reads it (a 32-bit integer): not a number is "Unable to parse",
/// one past 32 bits is "out of range [ lo, hi ]" (the range Triton names for the setting).
fn number(key: &str, v: &str, range: (i64, i64)) -> Result<i64> {
    use std::num::IntErrorKind::{NegOverflow, PosOverflow};
    let out_of_range = || {
        Error::invalid(format!(
            "Unable to parse '{key}', value is out of range [ {}, {} ], got: {v}",
            range.0, range.1
        ))
    };
    match v.parse::<i64>() {
        Ok(n) if i32::try_from(n).is_ok() => Ok(n),
        Ok(_) => Err(out_of_range()),
        Err(e) if matches!(e.kind(), PosOverflow | NegOverflow) => Err(out_of_range()),
        Err(_) => Err(Error::invalid(format!("Unable to parse '{key}', got: {v}"))),
    }
}

/// A setting Triton keeps unsigned (`trace_rate`, `log_frequency`): its one value, where a
/// negative one is "Unable to parse".
fn unsigned(key: &str, values: &[String]) -> Result<u64> {
    let v = one(key, values)?;
    u64::try_from(number(key, v, (0, u32::MAX.into()))?)
        .map_err(|_| Error::invalid(format!("Unable to parse '{key}', got: {v}")))
}

/// Applies `changes`; `zero_rate`: a rate of 0 is taken (OpenTelemetry mode's start-up settings:
/// only requests that bring a trace context are traced).
pub(super) fn apply(fields: &mut Fields, changes: &[Known], zero_rate: bool) -> Result<()> {
    for (key, value) in changes {
        let Some(values) = value else {
            match *key {
                "trace_level" => fields.level = None,
                "trace_rate" => fields.rate = None,
                "trace_count" => fields.count = None,
                "log_frequency" => fields.log_frequency = None,
                _ => {}
            }
            continue;
        };
        match *key {
            "trace_level" => {
                let levels: Vec<String> = values.iter().map(|v| v.trim().to_ascii_uppercase()).collect();
                if let Some(bad) = levels
                    .iter()
                    .find(|l| !matches!(l.as_str(), "OFF" | "TIMESTAMPS" | "TENSORS"))
                {
                    return Err(Error::invalid(format!(
                        "'trace_level' takes OFF, TIMESTAMPS or TENSORS, got '{bad}'"
                    )));
                }
                if levels.is_empty() {
                    return Err(Error::invalid("'trace_level' needs at least one level"));
                }
                if levels.len() > 1 && levels.iter().any(|l| l == "OFF") {
                    return Err(Error::invalid("Expect only one trace level 'OFF' is specified"));
                }
                fields.level = Some(levels);
            }
            "trace_rate" => {
                let rate = unsigned(key, values)?;
                if rate == 0 && !zero_rate {
                    return Err(Error::invalid(
                        "Attempting to set invalid trace setting :sample rate must be non-zero",
                    ));
                }
                fields.rate = Some(rate);
            }
            "trace_count" => {
                let v = one(key, values)?;
                let count = number(key, v, (-1, i32::MAX.into()))?;
                if count < -1 {
                    return Err(Error::invalid(format!(
                        "Unable to parse 'trace_count'. Expecting value >= -1, got:{v}"
                    )));
                }
                fields.count = Some(count);
            }
            "log_frequency" => fields.log_frequency = Some(unsigned(key, values)?),
            "trace_mode" if one(key, values)? != "triton" => {
                return Err(Error::invalid("'trace_mode' can only be 'triton'"));
            }
            _ => {}
        }
    }
    Ok(())
}
