//! Custom metrics Python models define (`pb_utils.MetricFamily`): counters, gauges and histograms
//! kept here, in the node, and rendered on `/metrics` after Triton's own. Families and metrics are
//! counted references: each Python object holds one, per stub, so a stub that dies gives its back.
use mesh::sync::Locked;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{LazyLock, Mutex};

use serde_json::{json, Value};

/// At most this many metrics (label sets) across all families, and buckets per histogram: a model
/// that makes a metric per request is refused rather than allowed to grow `/metrics` without end.
const MAX_METRICS: usize = 10_000;
const MAX_FAMILIES: usize = 1_000;
const MAX_BUCKETS: usize = 256;
const MAX_LABELS: usize = 32;
const MAX_TEXT: usize = 4096;

/// Families the node exports itself: a custom family may not take their names.
const RESERVED: [&str; 6] = [
    "nv_inference_",
    "nv_cache_",
    "nv_cpu_",
    "nv_gpu_",
    "nv_energy_",
    "mesh_",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    /// `pb_utils.MetricFamily.COUNTER`, `GAUGE`, `HISTOGRAM`.
    fn of(n: u64) -> Option<Kind> {
        [Kind::Counter, Kind::Gauge, Kind::Histogram].get(n as usize).copied()
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

type Labels = Vec<(String, String)>;

enum Series {
    Value(f64),
    Histogram {
        bounds: Vec<f64>,
        counts: Vec<u64>,
        sum: f64,
        count: u64,
    },
}

struct Metric {
    series: Series,
    /// References per holder (a stub's label).
    holders: BTreeMap<String, usize>,
}

struct Family {
    description: String,
    kind: Kind,
    holders: BTreeMap<String, usize>,
    metrics: BTreeMap<Labels, Metric>,
}

/// Every custom family of the node.
#[derive(Default)]
pub struct Registry {
    families: Mutex<BTreeMap<String, Family>>,
}

/// The node's registry (process-wide, like the metrics recorder it renders beside).
pub static CUSTOM: LazyLock<Registry> = LazyLock::new(Registry::default);

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn labels_of(frame: &Value, kind: Kind) -> Result<Labels, String> {
    let mut labels = Labels::new();
    let given = frame["labels"].as_object();
    if given.is_some_and(|l| l.len() > MAX_LABELS) {
        return Err(format!("a metric has at most {MAX_LABELS} labels"));
    }
    for (k, v) in given.into_iter().flatten() {
        // Prometheus label names: no ':' (unlike metric names), none reserved.
        if !valid_name(k) || k.contains(':') || k.starts_with("__") {
            return Err(format!("invalid metric label name '{k}'"));
        }
        if kind == Kind::Histogram && k == "le" {
            return Err("a histogram metric cannot have a label named 'le' (its buckets use it)".into());
        }
        let v = v
            .as_str()
            .ok_or_else(|| format!("metric label '{k}' must be a string"))?;
        if v.len() > MAX_TEXT {
            return Err(format!("metric label '{k}' is longer than {MAX_TEXT} bytes"));
        }
        labels.push((k.clone(), v.to_string()));
    }
    labels.sort();
    Ok(labels)
}

fn take(holders: &mut BTreeMap<String, usize>, holder: &str) -> bool {
    match holders.get_mut(holder) {
        Some(n) if *n > 1 => *n -= 1,
        Some(_) => {
            holders.remove(holder);
        }
        None => {}
    }
    holders.is_empty()
}

impl Registry {
    fn families(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Family>> {
        self.families.locked()
    }

    /// Applies one `metric` frame of a stub (`holder` names it) and returns the stub's answer:
    /// `{"value": ...}` or `{"error": ...}`.
    pub fn apply(&self, holder: &str, frame: &Value) -> Value {
        match self.try_apply(holder, frame) {
            // JSON has no NaN or infinities: those answer as text, which Python's float() reads.
            Ok(value) if !value.is_finite() => json!({ "value": number(value) }),
            Ok(value) => json!({ "value": value }),
            Err(e) => json!({ "error": e }),
        }
    }

    fn try_apply(&self, holder: &str, frame: &Value) -> Result<f64, String> {
        let name = frame["family"].as_str().unwrap_or_default();
        let mut families = self.families();
        let action = frame["action"].as_str().unwrap_or_default();
        if action == "family" {
            if !valid_name(name) {
                return Err(format!("invalid metric family name '{name}'"));
            }
            if let Some(prefix) = RESERVED.iter().find(|p| name.starts_with(*p)) {
                return Err(format!(
                    "metric family name '{name}' is reserved for the server's own metrics ({prefix}*)"
                ));
            }
            if frame["description"].as_str().is_some_and(|d| d.len() > MAX_TEXT) {
                return Err(format!("a metric family description is at most {MAX_TEXT} bytes"));
            }
            let kind = frame["kind"]
                .as_u64()
                .and_then(Kind::of)
                .ok_or("the metric family kind must be COUNTER, GAUGE or HISTOGRAM")?;
            if families.len() >= MAX_FAMILIES && !families.contains_key(name) {
                return Err(format!("too many metric families (at most {MAX_FAMILIES})"));
            }
            let family = families.entry(name.to_string()).or_insert_with(|| Family {
                description: frame["description"].as_str().unwrap_or_default().to_string(),
                kind,
                holders: BTreeMap::new(),
                metrics: BTreeMap::new(),
            });
            if family.kind != kind {
                return Err(format!(
                    "metric family '{name}' already exists as a {}, not a {}",
                    family.kind.name(),
                    kind.name()
                ));
            }
            *family.holders.entry(holder.to_string()).or_default() += 1;
            return Ok(0.0);
        }
        let total: usize = match action {
            "metric" => families.values().map(|f| f.metrics.len()).sum(),
            _ => 0,
        };
        let family = families.get_mut(name).ok_or_else(|| {
            "Invalid metric operation as the corresponding 'MetricFamily' has been deleted.".to_string()
        })?;
        if action == "family_drop" {
            if take(&mut family.holders, holder) {
                families.remove(name);
            }
            return Ok(0.0);
        }
        let labels = labels_of(frame, family.kind)?;
        if action == "metric" {
            if !family.metrics.contains_key(&labels) && total >= MAX_METRICS {
                return Err(format!("too many custom metrics (at most {MAX_METRICS})"));
            }
            let series = match family.kind {
                Kind::Histogram => {
                    let bounds = buckets(&frame["buckets"])?;
                    let counts = vec![0; bounds.len()];
                    Series::Histogram {
                        bounds,
                        counts,
                        sum: 0.0,
                        count: 0,
                    }
                }
                _ => Series::Value(0.0),
            };
            let metric = family.metrics.entry(labels).or_insert_with(|| Metric {
                series,
                holders: BTreeMap::new(),
            });
            *metric.holders.entry(holder.to_string()).or_default() += 1;
            return Ok(0.0);
        }
        let kind = family.kind;
        let metric = family
            .metrics
            .get_mut(&labels)
            .ok_or("Invalid metric operation as the corresponding 'Metric' has been deleted.")?;
        // Numbers, or text for NaN and the infinities (which JSON cannot carry).
        let v = match &frame["value"] {
            Value::String(text) => text.parse::<f64>().unwrap_or(f64::NAN),
            other => other.as_f64().unwrap_or(0.0),
        };
        match (action, &mut metric.series) {
            ("metric_drop", _) => {
                if take(&mut metric.holders, holder) {
                    family.metrics.remove(&labels);
                }
                Ok(0.0)
            }
            ("value", Series::Value(x)) => Ok(*x),
            ("increment", Series::Value(x)) if kind == Kind::Gauge || v >= 0.0 => {
                *x += v;
                Ok(*x)
            }
            ("set", Series::Value(x)) if kind == Kind::Gauge => {
                *x = v;
                Ok(*x)
            }
            (
                "observe",
                Series::Histogram {
                    bounds,
                    counts,
                    sum,
                    count,
                },
            ) => {
                for (b, c) in bounds.iter().zip(counts.iter_mut()) {
                    if v <= *b {
                        *c += 1;
                    }
                }
                *sum += v;
                *count += 1;
                Ok(0.0)
            }
            (action, _) => Err(format!("{action} is not supported on a {} metric", kind.name())),
        }
    }

    /// Gives back every reference a stub held (it exited or its instance was unloaded).
    pub fn release(&self, holder: &str) {
        let mut families = self.families();
        families.retain(|_, f| {
            f.metrics.retain(|_, m| {
                m.holders.remove(holder);
                !m.holders.is_empty()
            });
            f.holders.remove(holder);
            !f.holders.is_empty()
        });
    }

    /// The families in Prometheus' text format.
    pub fn render(&self) -> String {
        let families = self.families();
        let mut out = String::new();
        for (name, f) in families.iter() {
            let _ = writeln!(out, "# HELP {name} {}", escape(&f.description, false));
            let _ = writeln!(out, "# TYPE {name} {}", f.kind.name());
            for (labels, m) in &f.metrics {
                match &m.series {
                    Series::Value(v) => {
                        let _ = writeln!(out, "{name}{} {}", label_text(labels, None), number(*v));
                    }
                    Series::Histogram {
                        bounds,
                        counts,
                        sum,
                        count,
                    } => {
                        for (b, c) in bounds.iter().zip(counts) {
                            let _ = writeln!(out, "{name}_bucket{} {c}", label_text(labels, Some(&b.to_string())));
                        }
                        let _ = writeln!(out, "{name}_bucket{} {count}", label_text(labels, Some("+Inf")));
                        let _ = writeln!(out, "{name}_sum{} {}", label_text(labels, None), number(*sum));
                        let _ = writeln!(out, "{name}_count{} {count}", label_text(labels, None));
                    }
                }
            }
        }
        out
    }
}

/// A histogram's bucket bounds: given, finite and strictly increasing.
fn buckets(value: &Value) -> Result<Vec<f64>, String> {
    let list = value
        .as_array()
        .ok_or("a histogram metric needs buckets (a list of increasing upper bounds)")?;
    if list.len() > MAX_BUCKETS {
        return Err(format!("a histogram has at most {MAX_BUCKETS} buckets"));
    }
    let bounds: Vec<f64> = list.iter().filter_map(|b| b.as_f64()).collect();
    if bounds.len() != list.len() || bounds.iter().any(|b| !b.is_finite()) {
        return Err("histogram buckets must be finite numbers".into());
    }
    if bounds.windows(2).any(|w| w[0] >= w[1]) {
        return Err("histogram buckets must be in strictly increasing order".into());
    }
    Ok(bounds)
}

/// A sample value in Prometheus' text format (`NaN`, `+Inf`, `-Inf` for the special ones).
fn number(v: f64) -> String {
    match v {
        v if v.is_nan() => "NaN".into(),
        f64::INFINITY => "+Inf".into(),
        f64::NEG_INFINITY => "-Inf".into(),
        v => v.to_string(),
    }
}

fn escape(text: &str, quote: bool) -> String {
    let mut s = text.replace('\\', "\\\\").replace('\n', "\\n");
    if quote {
        s = s.replace('"', "\\\"");
    }
    s
}

fn label_text(labels: &Labels, le: Option<&str>) -> String {
    let mut parts: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v, true)))
        .collect();
    if let Some(le) = le {
        parts.push(format!("le=\"{le}\""));
    }
    match parts.is_empty() {
        true => String::new(),
        false => format!("{{{}}}", parts.join(",")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(r: &Registry, holder: &str, frame: Value) -> Value {
        r.apply(holder, &frame)
    }

    #[test]
    fn counters_and_gauges_keep_their_rules_and_render() {
        let r = Registry::default();
        let l = json!({"a": "x\"y"});
        op(
            &r,
            "s",
            json!({"action": "family", "family": "c", "description": "my counter", "kind": 0}),
        );
        op(&r, "s", json!({"action": "metric", "family": "c", "labels": l}));
        let v = op(
            &r,
            "s",
            json!({"action": "increment", "family": "c", "labels": l, "value": 2.5}),
        );
        assert_eq!(v["value"], 2.5);
        let neg = op(
            &r,
            "s",
            json!({"action": "increment", "family": "c", "labels": l, "value": -1}),
        );
        assert!(neg["error"].as_str().unwrap().contains("counter"), "{neg}");
        assert!(op(
            &r,
            "s",
            json!({"action": "set", "family": "c", "labels": l, "value": 1})
        )["error"]
            .is_string());
        op(
            &r,
            "s",
            json!({"action": "family", "family": "g", "description": "", "kind": 1}),
        );
        op(&r, "s", json!({"action": "metric", "family": "g"}));
        op(&r, "s", json!({"action": "set", "family": "g", "value": -4}));
        let text = r.render();
        assert!(text.contains("# TYPE c counter\nc{a=\"x\\\"y\"} 2.5\n"), "{text}");
        assert!(text.contains("g -4\n"), "{text}");
        let other = op(&r, "s", json!({"action": "family", "family": "c", "kind": 1}));
        assert!(other["error"].as_str().unwrap().contains("already exists"));
        op(&r, "s", json!({"action": "set", "family": "g", "value": "nan"}));
        assert!(
            r.render().contains("g NaN\n"),
            "NaN travels as text and renders as Prometheus'"
        );
        op(&r, "s", json!({"action": "set", "family": "g", "value": "-inf"}));
        assert!(r.render().contains("g -Inf\n"));
    }

    #[test]
    fn names_that_would_break_the_scrape_are_refused() {
        let r = Registry::default();
        let reserved = op(
            &r,
            "s",
            json!({"action": "family", "family": "nv_inference_count", "kind": 0}),
        );
        assert!(reserved["error"].as_str().unwrap().contains("reserved"), "{reserved}");
        op(&r, "s", json!({"action": "family", "family": "h", "kind": 2}));
        let le = op(
            &r,
            "s",
            json!({"action": "metric", "family": "h", "labels": {"le": "1"}, "buckets": [1]}),
        );
        assert!(le["error"].as_str().unwrap().contains("'le'"), "{le}");
        let colon = op(
            &r,
            "s",
            json!({"action": "metric", "family": "h", "labels": {"a:b": "1"}, "buckets": [1]}),
        );
        assert!(colon["error"].as_str().unwrap().contains("label name"), "{colon}");
        assert_eq!(r.render().matches("# TYPE").count(), 1);
    }

    #[test]
    fn histograms_count_cumulatively_and_check_their_buckets() {
        let r = Registry::default();
        op(
            &r,
            "s",
            json!({"action": "family", "family": "h", "description": "d", "kind": 2}),
        );
        for bad in [json!(null), json!([2.5, 0.1]), json!([1, 1])] {
            let e = op(&r, "s", json!({"action": "metric", "family": "h", "buckets": bad}));
            assert!(e["error"].is_string(), "{bad} accepted");
        }
        op(
            &r,
            "s",
            json!({"action": "metric", "family": "h", "buckets": [0.1, 1.0, 10.0]}),
        );
        for v in [0.05, 1.5, 6.0] {
            op(&r, "s", json!({"action": "observe", "family": "h", "value": v}));
        }
        let text = r.render();
        for line in [
            "h_bucket{le=\"0.1\"} 1",
            "h_bucket{le=\"1\"} 1",
            "h_bucket{le=\"10\"} 3",
            "h_bucket{le=\"+Inf\"} 3",
            "h_count 3",
        ] {
            assert!(text.contains(line), "{line} missing in {text}");
        }
        assert!(op(&r, "s", json!({"action": "value", "family": "h"}))["error"].is_string());
    }

    #[test]
    fn references_keep_families_until_every_holder_lets_go() {
        let r = Registry::default();
        let family = json!({"action": "family", "family": "f", "description": "first", "kind": 0});
        op(&r, "a", family.clone());
        op(
            &r,
            "a",
            json!({"action": "family", "family": "f", "description": "second", "kind": 0}),
        );
        op(&r, "b", family);
        op(&r, "a", json!({"action": "family_drop", "family": "f"}));
        assert!(r.render().contains("# HELP f first"), "the first description stays");
        r.release("a");
        assert!(r.render().contains("# HELP f"), "b still holds it");
        r.release("b");
        assert!(r.render().is_empty());
        let gone = op(&r, "b", json!({"action": "value", "family": "f"}));
        assert!(gone["error"].as_str().unwrap().contains("has been deleted"));
    }
}
