//! Reading tritonserver's `--trace-config` flags (sans-IO: the environment is a lookup): global
//! `KEY=VALUE` settings (`level`, `rate`, `count`, `file`, `log-frequency`, `mode`), the trace
//! file mode's `triton,KEY=VALUE`, and the OpenTelemetry mode's `opentelemetry,KEY=VALUE`, with
//! tritonserver's errors for a bad mode or a bad OpenTelemetry setting.
use super::otel::config::{self, OtelConfig};
use super::Change;

/// The trace mode (`--trace-config mode=`): Triton's trace files, or OpenTelemetry spans.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Mode {
    #[default]
    Triton,
    OpenTelemetry,
}

impl Mode {
    /// Its name in the trace settings API.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Triton => "triton",
            Mode::OpenTelemetry => "opentelemetry",
        }
    }

    /// A mode's name as tritonserver reads it (any case).
    fn parse(text: &str) -> Result<Mode, String> {
        match text.to_ascii_lowercase().as_str() {
            "triton" => Ok(Mode::Triton),
            "opentelemetry" => Ok(Mode::OpenTelemetry),
            other => Err(format!(
                "invalid value for trace mode option: {other}. Available options are \"triton\" and \"opentelemetry\""
            )),
        }
    }
}

/// What the flags say.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Flags {
    /// The trace file (trace file mode only).
    pub file: String,
    /// The settings the server starts with.
    pub changes: Vec<Change>,
    pub mode: Mode,
    /// The OpenTelemetry settings (in that mode only).
    pub otel: Option<OtelConfig>,
    /// Warnings for settings the mode ignores, in tritonserver's words.
    pub warnings: Vec<String>,
}

/// Reads the flags (the legacy `--trace-*` ones come first, as `KEY=VALUE`), with `env` for the
/// OpenTelemetry batch processor's defaults.
pub fn parse(flags: &[String], env: &dyn Fn(&str) -> Option<String>) -> Result<Flags, String> {
    let mut out = Flags::default();
    let mut otel: Vec<(String, String)> = Vec::new();
    let mut log_frequency = false;
    for flag in flags {
        // `MODE,SETTING=VALUE`, where the text before the first comma has no '=' (a comma inside
        // a global setting's value, a file name's, is no mode).
        let (mode, body) = match flag.split_once(',') {
            Some(("", _)) => {
                return Err(format!(
                    "No trace mode specified. --trace-config option format is <trace mode>,<setting>=<value> \
                     or <setting>=<value>. Got {flag}"
                ))
            }
            Some((mode, body)) if !mode.contains('=') => (Some(Mode::parse(mode)?), body),
            _ => (None, flag.as_str()),
        };
        if mode == Some(Mode::OpenTelemetry) {
            match body.split_once('=') {
                Some((key, value)) if !key.is_empty() && !value.is_empty() => {
                    otel.push((key.to_string(), value.to_string()))
                }
                _ => {
                    return Err(format!(
                        "--trace-config option format is '<trace mode>,<setting>=<value>'. Got {flag}"
                    ))
                }
            }
            continue;
        }
        let (key, value) = body
            .split_once('=')
            .ok_or_else(|| format!("--trace-config '{flag}' is not [triton,]KEY=VALUE"))?;
        let key = match key {
            "level" => "trace_level",
            "rate" => "trace_rate",
            "count" => "trace_count",
            "file" => {
                out.file = value.to_string();
                continue;
            }
            "log-frequency" | "log_frequency" => {
                log_frequency = true;
                "log_frequency"
            }
            "mode" => {
                out.mode = Mode::parse(value).map_err(|why| format!("Bad option: \"--trace-config mode\".\n{why}"))?;
                continue;
            }
            other => return Err(format!("--trace-config: unknown setting '{other}'")),
        };
        // Levels accumulate (`--trace-level TIMESTAMPS --trace-level TENSORS`); other keys: the last wins.
        match out.changes.iter_mut().find(|(k, _)| k == key) {
            Some((_, Some(values))) if key == "trace_level" => values.push(value.to_string()),
            Some(change) => change.1 = Some(vec![value.to_string()]),
            None => out.changes.push((key.to_string(), Some(vec![value.to_string()]))),
        }
    }
    if out.mode == Mode::OpenTelemetry {
        // The trace file's settings mean nothing here; the server starts without them.
        if !std::mem::take(&mut out.file).is_empty() {
            out.warnings.push(
                "Warning: '--trace-file' is deprecated and will be ignored with opentelemetry tracing mode.".into(),
            );
        }
        if log_frequency {
            out.changes.retain(|(k, _)| k != "log_frequency");
            out.warnings.push(
                "Warning: '--trace-log-frequency' is deprecated and will be ignored with opentelemetry tracing mode."
                    .into(),
            );
        }
        out.otel = Some(config::parse(&otel, env)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn read(list: &[&str]) -> Result<Flags, String> {
        parse(&flags(list), &|_| None)
    }

    #[test]
    fn the_mode_and_its_settings() {
        let f = read(&[
            "level=TIMESTAMPS",
            "mode=OpenTelemetry",
            "opentelemetry,url=localhost:10000/v1/traces",
            "OPENTELEMETRY,resource=service.name=test_triton",
        ])
        .unwrap();
        assert_eq!(f.mode, Mode::OpenTelemetry);
        let otel = f.otel.unwrap();
        assert_eq!(otel.url.as_deref(), Some("localhost:10000/v1/traces"));
        assert_eq!(otel.resource, [("service.name".to_string(), "test_triton".to_string())]);
        let triton = read(&["opentelemetry,url=x", "triton,file=/tmp/t.json"]).unwrap();
        assert_eq!(
            (triton.mode, triton.otel, triton.file.as_str()),
            (Mode::Triton, None, "/tmp/t.json")
        );
    }

    #[test]
    fn tritons_errors_for_bad_modes_and_formats() {
        let e = read(&["mode=jaeger"]).unwrap_err();
        assert_eq!(
            e,
            "Bad option: \"--trace-config mode\".\ninvalid value for trace mode option: jaeger. \
             Available options are \"triton\" and \"opentelemetry\""
        );
        assert!(read(&["zipkin,url=x"])
            .unwrap_err()
            .starts_with("invalid value for trace mode option: zipkin."));
        assert!(read(&[",rate=1"]).unwrap_err().starts_with("No trace mode specified."));
        for bad in ["opentelemetry,url", "opentelemetry,=x", "opentelemetry,url="] {
            assert_eq!(
                read(&[bad]).unwrap_err(),
                format!("--trace-config option format is '<trace mode>,<setting>=<value>'. Got {bad}")
            );
        }
        let e = read(&["mode=opentelemetry", "opentelemetry,bsp_max_queue_size=bad_value"]).unwrap_err();
        assert!(
            e.starts_with("Bad option: \"--trace-config opentelemetry,bsp_max_queue_size\"."),
            "{e}"
        );
        let e = parse(&flags(&["mode=opentelemetry"]), &|k| {
            (k == "OTEL_BSP_SCHEDULE_DELAY").then(|| "bad_value".to_string())
        })
        .unwrap_err();
        assert!(e.starts_with("Bad option: \"OTEL_BSP_SCHEDULE_DELAY\"."), "{e}");
        assert!(
            read(&["opentelemetry,bsp_max_queue_size=bad"]).is_ok(),
            "only read in that mode"
        );
    }

    #[test]
    fn the_trace_files_settings_are_dropped_in_opentelemetry_mode() {
        let f = read(&["file=/tmp/t.json", "log-frequency=2", "rate=0", "mode=opentelemetry"]).unwrap();
        assert_eq!(f.file, "");
        assert_eq!(f.changes, [("trace_rate".to_string(), Some(vec!["0".to_string()]))]);
        assert_eq!(f.warnings.len(), 2);
        let f = read(&["file=/tmp/a,b.json"]).unwrap();
        assert_eq!(f.file, "/tmp/a,b.json", "a comma in a value is no mode");
    }
}
