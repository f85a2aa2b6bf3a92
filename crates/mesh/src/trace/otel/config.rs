//! The OpenTelemetry mode's settings (`--trace-config opentelemetry,KEY=VALUE`) as tritonserver
//! 2.51 reads them: the collector's `url`, `resource` attributes (repeatable), and the batch span
//! processor's `bsp_max_queue_size`, `bsp_schedule_delay` and `bsp_max_export_batch_size`, which
//! default to `OTEL_BSP_*` from the environment, else 2048, 5000 ms and 512. Sans-IO: the
//! environment is a lookup the caller passes.

/// The batch span processor's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bsp {
    /// Spans the queue holds; more are dropped, each with a warning.
    pub max_queue_size: u32,
    /// Milliseconds between exports.
    pub schedule_delay_ms: u32,
    /// Spans one export (one OTLP request) carries at most.
    pub max_export_batch_size: u32,
}

impl Default for Bsp {
    fn default() -> Self {
        Bsp {
            max_queue_size: 2048,
            schedule_delay_ms: 5000,
            max_export_batch_size: 512,
        }
    }
}

/// The OpenTelemetry settings the server started with.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OtelConfig {
    /// Every setting as the trace settings API shows it, in order: those given (a repeated one
    /// each time), then the batch processor's defaults that were not.
    pub entries: Vec<(String, String)>,
    /// Where spans go (the last `url` given); None: `OTEL_EXPORTER_OTLP_*` or localhost:4318.
    pub url: Option<String>,
    /// `resource=KEY=VALUE` attributes, in order (a later one of a key wins).
    pub resource: Vec<(String, String)>,
    pub bsp: Bsp,
}

/// The three batch processor settings, their environment variables and defaults.
const BSP: [(&str, &str, &str); 3] = [
    ("bsp_max_queue_size", "OTEL_BSP_MAX_QUEUE_SIZE", "2048"),
    ("bsp_schedule_delay", "OTEL_BSP_SCHEDULE_DELAY", "5000"),
    ("bsp_max_export_batch_size", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "512"),
];

/// A number read as tritonserver reads these (C++ `std::stoul`, kept to 32 bits): leading blanks
/// and a sign, then the digits up to the first other character; no digit is invalid, more than
/// 64 bits is out of bound, a minus wraps.
fn stoul(v: &str) -> Result<u32, String> {
    let t = v.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    let (negative, t) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let digits = &t[..t.bytes().take_while(u8::is_ascii_digit).count()];
    if digits.is_empty() {
        return Err(format!("Invalid option value. Got {v}"));
    }
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("Provided option value is out of bound. Got {v}"))?;
    Ok(if negative { n.wrapping_neg() } else { n } as u32)
}

/// Reads the `opentelemetry,` settings given (in order), with `env` for the defaults; errors are
/// tritonserver's (`Bad option: "--trace-config opentelemetry,bsp_schedule_delay".` or
/// `Bad option: "OTEL_BSP_SCHEDULE_DELAY".`, then the reason).
pub fn parse(given: &[(String, String)], env: &dyn Fn(&str) -> Option<String>) -> Result<OtelConfig, String> {
    let mut config = OtelConfig::default();
    let mut bsp = [None; 3];
    for (key, value) in given {
        let mut shown = value.clone();
        if let Some(at) = BSP.iter().position(|(name, _, _)| name == key) {
            let n =
                stoul(value).map_err(|why| format!("Bad option: \"--trace-config opentelemetry,{key}\".\n{why}"))?;
            bsp[at] = Some(n);
            shown = n.to_string();
        } else if key == "url" {
            config.url = Some(value.clone());
        } else if key == "resource" {
            // Split at the first '='; without one, the whole value is the key and the value.
            let (k, v) = value.split_once('=').unwrap_or((value, value));
            config.resource.push((k.to_string(), v.to_string()));
        }
        config.entries.push((key.clone(), shown));
    }
    for (at, (name, var, default)) in BSP.iter().enumerate() {
        if bsp[at].is_some() {
            continue;
        }
        let text = env(var).unwrap_or_else(|| default.to_string());
        let n = stoul(&text).map_err(|why| format!("Bad option: \"{var}\".\n{why}"))?;
        bsp[at] = Some(n);
        config.entries.push((name.to_string(), n.to_string()));
    }
    let [queue, delay, batch] = bsp.map(|n| n.unwrap_or_default());
    config.bsp = Bsp {
        max_queue_size: queue,
        schedule_delay_ms: delay,
        max_export_batch_size: batch,
    };
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn given(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn defaults_follow_the_settings_given() {
        let c = parse(
            &given(&[
                ("url", "localhost:10000/v1/traces"),
                ("resource", "test.key=test.value"),
                ("resource", "service.name=test_triton"),
                ("bsp_schedule_delay", "0"),
                ("unknown", "kept"),
            ]),
            &no_env,
        )
        .unwrap();
        assert_eq!(c.url.as_deref(), Some("localhost:10000/v1/traces"));
        assert_eq!(
            c.resource,
            given(&[("test.key", "test.value"), ("service.name", "test_triton")])
        );
        assert_eq!(c.bsp.schedule_delay_ms, 0);
        assert_eq!((c.bsp.max_queue_size, c.bsp.max_export_batch_size), (2048, 512));
        let keys: Vec<&str> = c.entries.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "url",
                "resource",
                "resource",
                "bsp_schedule_delay",
                "unknown",
                "bsp_max_queue_size",
                "bsp_max_export_batch_size"
            ]
        );
    }

    #[test]
    fn the_environment_gives_defaults_only_for_what_is_not_given() {
        let env = |k: &str| match k {
            "OTEL_BSP_MAX_QUEUE_SIZE" => Some("bad_value".to_string()),
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE" => Some("7".to_string()),
            _ => None,
        };
        let e = parse(&[], &env).unwrap_err();
        assert!(e.starts_with("Bad option: \"OTEL_BSP_MAX_QUEUE_SIZE\".\n"), "{e}");
        let c = parse(&given(&[("bsp_max_queue_size", "1")]), &env).unwrap();
        assert_eq!((c.bsp.max_queue_size, c.bsp.max_export_batch_size), (1, 7));
    }

    #[test]
    fn numbers_are_read_as_stoul_reads_them() {
        assert_eq!(stoul("12abc"), Ok(12));
        assert_eq!(stoul("  +3"), Ok(3));
        assert_eq!(stoul("-1"), Ok(u32::MAX));
        assert_eq!(stoul("bad_value").unwrap_err(), "Invalid option value. Got bad_value");
        assert!(stoul("99999999999999999999999").unwrap_err().contains("out of bound"));
        let e = parse(&given(&[("bsp_schedule_delay", "x")]), &no_env).unwrap_err();
        assert_eq!(
            e,
            "Bad option: \"--trace-config opentelemetry,bsp_schedule_delay\".\nInvalid option value. Got x"
        );
    }

    #[test]
    fn a_resource_without_equals_is_its_own_key_and_value() {
        let c = parse(&given(&[("resource", "lonely")]), &no_env).unwrap();
        assert_eq!(c.resource, given(&[("lonely", "lonely")]));
    }
}
