//! Triton's logging extension: the process's log settings (`log_info`, `log_warning`,
//! `log_error`, `log_verbose_level`, `log_format`, `log_file`), read and changed at run time over
//! `GET/POST /v2/logging` and gRPC `LogSettings`; every log line passes `allows`.
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};

use serde::Serialize;
use tracing::Level;

use crate::error::{Error, Result};

/// The live settings (one set per process).
struct Live {
    info: AtomicBool,
    warning: AtomicBool,
    error: AtomicBool,
    verbose: AtomicU32,
    /// 0: "default", 1: "ISO8601".
    format: AtomicU8,
}

static LIVE: Live = Live {
    info: AtomicBool::new(true),
    warning: AtomicBool::new(true),
    error: AtomicBool::new(true),
    verbose: AtomicU32::new(0),
    format: AtomicU8::new(0),
};

const FORMATS: [&str; 2] = ["default", "ISO8601"];

/// The file the log goes to (`--log-file`); unset: standard output.
static FILE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Records where the log is written (`--log-file`), as `log_file` reports it; the first call wins.
pub fn set_file(path: &str) {
    let _ = FILE.set(path.to_string());
}

/// The format the server starts with (`--log-format`); an unknown name is refused.
pub fn set_format(format: &str) -> Result<()> {
    update(&[("log_format".into(), SettingValue::Str(format.to_string()))]).map(|_| ())
}

/// The settings as the extension reports them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LogSettings {
    pub log_file: String,
    pub log_info: bool,
    pub log_warning: bool,
    pub log_error: bool,
    pub log_verbose_level: u32,
    pub log_format: String,
}

/// One value of a change, as HTTP JSON or a gRPC `SettingValue` carries it.
#[derive(Debug, Clone, PartialEq)]
pub enum SettingValue {
    Bool(bool),
    Uint(u64),
    Str(String),
}

pub fn settings() -> LogSettings {
    LogSettings {
        log_file: FILE.get().cloned().unwrap_or_default(),
        log_info: LIVE.info.load(Ordering::Relaxed),
        log_warning: LIVE.warning.load(Ordering::Relaxed),
        log_error: LIVE.error.load(Ordering::Relaxed),
        log_verbose_level: LIVE.verbose.load(Ordering::Relaxed),
        log_format: FORMATS[usize::from(LIVE.format.load(Ordering::Relaxed)).min(1)].to_string(),
    }
}

/// The verbose level the server starts with (`--log-verbose`).
pub fn set_verbose(level: u32) {
    LIVE.verbose.store(level, Ordering::Relaxed);
}

/// Applies a change: every key and value is checked first, so a bad one changes nothing.
pub fn update(changes: &[(String, SettingValue)]) -> Result<LogSettings> {
    let mut next = settings();
    for (key, value) in changes {
        let wrong = |what: &str| Error::invalid(format!("log setting '{key}' must be {what}, got {value:?}"));
        match (key.as_str(), value) {
            ("log_info", SettingValue::Bool(b)) => next.log_info = *b,
            ("log_warning", SettingValue::Bool(b)) => next.log_warning = *b,
            ("log_error", SettingValue::Bool(b)) => next.log_error = *b,
            ("log_info" | "log_warning" | "log_error", _) => return Err(wrong("a boolean")),
            ("log_verbose_level", SettingValue::Uint(n)) => {
                next.log_verbose_level = u32::try_from(*n).map_err(|_| wrong("a level from 0 to 4294967295"))?
            }
            ("log_verbose_level", _) => return Err(wrong("a non-negative integer")),
            ("log_format", SettingValue::Str(f)) if FORMATS.contains(&f.as_str()) => next.log_format = f.clone(),
            ("log_format", _) => return Err(wrong("\"default\" or \"ISO8601\"")),
            ("log_file", SettingValue::Str(f)) if *f == next.log_file => {}
            ("log_file", _) => {
                return Err(Error::invalid(
                    "log_file cannot be changed at run time: give --log-file when starting the server \
                     (without it the log is its standard output)",
                ))
            }
            _ => {
                return Err(Error::invalid(format!(
                    "unknown log setting '{key}' (known: log_file, log_info, log_warning, log_error, \
                     log_verbose_level, log_format)"
                )))
            }
        }
    }
    LIVE.info.store(next.log_info, Ordering::Relaxed);
    LIVE.warning.store(next.log_warning, Ordering::Relaxed);
    LIVE.error.store(next.log_error, Ordering::Relaxed);
    LIVE.verbose.store(next.log_verbose_level, Ordering::Relaxed);
    let format = FORMATS.iter().position(|f| *f == next.log_format).unwrap_or(0);
    LIVE.format.store(format as u8, Ordering::Relaxed);
    Ok(next)
}

/// Whether a line of `level` is written under the current settings (debug from verbose level 1,
/// trace from 2).
pub fn allows(level: &Level) -> bool {
    match *level {
        Level::ERROR => LIVE.error.load(Ordering::Relaxed),
        Level::WARN => LIVE.warning.load(Ordering::Relaxed),
        Level::INFO => LIVE.info.load(Ordering::Relaxed),
        Level::DEBUG => LIVE.verbose.load(Ordering::Relaxed) >= 1,
        _ => LIVE.verbose.load(Ordering::Relaxed) >= 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(key: &str, value: SettingValue) -> (String, SettingValue) {
        (key.to_string(), value)
    }

    #[test]
    fn changes_apply_together_and_a_bad_one_changes_nothing() {
        let before = settings();
        let e = update(&[
            set("log_info", SettingValue::Bool(false)),
            set("log_verbose_level", SettingValue::Str("1".into())),
        ])
        .unwrap_err();
        assert!(e.message.contains("log_verbose_level"), "{}", e.message);
        assert_eq!(settings(), before, "nothing changed");
        for bad in [
            set("log_format", SettingValue::Str("xml".into())),
            set("log_file", SettingValue::Str("/tmp/x.log".into())),
            set("log_colour", SettingValue::Bool(true)),
            set("log_error", SettingValue::Uint(1)),
        ] {
            assert!(update(std::slice::from_ref(&bad)).is_err(), "{bad:?}");
        }
        let after = update(&[
            set("log_info", SettingValue::Bool(false)),
            set("log_verbose_level", SettingValue::Uint(2)),
            set("log_format", SettingValue::Str("ISO8601".into())),
            set("log_file", SettingValue::Str(String::new())),
        ])
        .unwrap();
        assert_eq!((after.log_info, after.log_verbose_level), (false, 2));
        assert_eq!(after.log_format, "ISO8601");
        assert!(!allows(&Level::INFO) && allows(&Level::WARN) && allows(&Level::TRACE));
        update(&[
            set("log_info", SettingValue::Bool(true)),
            set("log_verbose_level", SettingValue::Uint(0)),
            set("log_format", SettingValue::Str("default".into())),
        ])
        .unwrap();
        assert!(allows(&Level::INFO) && !allows(&Level::DEBUG));
        assert_eq!(settings(), before);
    }
}
