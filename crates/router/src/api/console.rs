//! The router's web console, part of its operator API (the restricted-API group `cluster`): the page
//! at `GET /mesh/v1/console`, its script and style built into the binary (no network needed to open
//! it), and `GET /mesh/v1/history`, each model's recent traffic for its charts.
use std::sync::Arc;
use std::time::Instant;

use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use mesh::sync::Locked;
use serde_json::{json, Value};

use crate::dispatch::RouterDispatch;
use crate::metrics::history::{History, Sample};

const PAGE: &str = include_str!("../console/index.html");
const SCRIPT: &str = include_str!("../console/console.js");
const STYLE: &str = include_str!("../console/console.css");

/// The page loads nothing from elsewhere, runs no inline script, and is not framed.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                      img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// The JSON of `GET /mesh/v1/history`: per model, one value per interval, oldest first. The
/// samples are copied under the history's lock and the JSON is built after it is let go, so a
/// client reading the history never holds back the requests that record into it.
pub fn history_json(history: &std::sync::Mutex<History>, now: Instant) -> Value {
    let (settings, snapshot) = {
        let mut h = history.locked();
        (h.settings(), h.snapshot(now))
    };
    let interval = settings.interval.as_secs_f64();
    let ms = |us: u32, s: &Sample| (s.requests() > 0).then(|| f64::from(us) / 1000.0);
    let models: Vec<Value> = snapshot
        .into_iter()
        .map(|m| {
            let s = &m.samples;
            json!({
                "name": m.name,
                "rps": s.iter().map(|x| x.requests() as f64 / interval).collect::<Vec<_>>(),
                "failed_rps": s.iter().map(|x| f64::from(x.failed) / interval).collect::<Vec<_>>(),
                "p50_ms": s.iter().map(|x| ms(x.p50_us, x)).collect::<Vec<_>>(),
                "p99_ms": s.iter().map(|x| ms(x.p99_us, x)).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "interval_s": interval,
        "samples": settings.samples,
        "models": models,
    })
}

/// The console's routes, merged into the operator API's (and so under its access rule).
pub fn routes(dispatch: Arc<RouterDispatch>) -> Router {
    Router::new()
        .route(
            "/mesh/v1/console",
            get(|| async { asset("text/html; charset=utf-8", PAGE) }),
        )
        .route(
            "/mesh/v1/console/console.js",
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            "/mesh/v1/console/console.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
        .route(
            "/mesh/v1/history",
            get(move || {
                let d = dispatch.clone();
                async move { Json(history_json(&d.history, Instant::now())) }
            }),
        )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::metrics::history::HistorySettings;

    #[test]
    fn history_json_has_rates_and_no_latency_where_no_request() {
        let t0 = Instant::now();
        let settings = HistorySettings {
            interval: Duration::from_secs(5),
            samples: 2,
            max_models: 4,
        };
        let mut h = History::new(settings, t0);
        for _ in 0..10 {
            h.record("m", Duration::from_millis(2), true, t0 + Duration::from_secs(6));
        }
        h.record("m", Duration::from_millis(2), false, t0 + Duration::from_secs(6));
        let v = history_json(&std::sync::Mutex::new(h), t0 + Duration::from_secs(10));
        assert_eq!(v["interval_s"], 5.0);
        let m = &v["models"][0];
        assert_eq!(m["name"], "m");
        assert_eq!(m["rps"], json!([0.0, 2.2]));
        assert_eq!(m["failed_rps"], json!([0.0, 0.2]));
        assert_eq!(m["p50_ms"][0], Value::Null);
        let p50 = m["p50_ms"][1].as_f64().unwrap();
        assert!((1.75..=2.25).contains(&p50), "{p50}");
    }

    #[test]
    fn the_page_names_only_its_own_assets() {
        assert!(PAGE.contains("/mesh/v1/console/console.js"));
        assert!(PAGE.contains("/mesh/v1/console/console.css"));
        for asset in [PAGE, SCRIPT, STYLE] {
            assert!(
                !asset.contains("http://") && !asset.contains("https://"),
                "an asset names another site"
            );
        }
    }
}
