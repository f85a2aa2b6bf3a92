//! The OpenTelemetry export, off the request path: ended spans go into the batch span
//! processor's bounded queue ([`super::queue`]), which one thread of its own (with a small tokio
//! runtime) drains into opentelemetry-otlp's span exporter: OTLP/HTTP with a protobuf body, as
//! tritonserver 2.51 sends it (opentelemetry-cpp's default), over a hyper HTTP/1 client
//! ([`super::client`]). The request path only locks the queue to push.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry::KeyValue;
use opentelemetry_otlp::{Protocol, RetryPolicy, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter, SpanProcessor};
use opentelemetry_sdk::Resource;

use super::client::Client;
use super::config::OtelConfig;
use super::queue::{Next, Pushed, Queue, DROPPED};
use crate::sync::Locked;

/// The batch span processor: its queue, and the worker thread's wake-up.
#[derive(Debug)]
pub struct Processor {
    shared: Arc<Shared>,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: tokio::sync::Notify,
    /// The worker is exporting.
    busy: AtomicBool,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Shared")
    }
}

/// The resource of every span, by Triton's precedence: the SDK's attributes, then
/// `OTEL_RESOURCE_ATTRIBUTES`, then `service.name=SERVICE` (a node's `triton-inference-server`), then each
/// `resource=` setting (a later one of a key wins).
pub fn resource(config: &OtelConfig, service: &str, env: &dyn Fn(&str) -> Option<String>) -> Resource {
    let mut attributes = vec![
        ("telemetry.sdk.name".to_string(), "opentelemetry".to_string()),
        ("telemetry.sdk.language".to_string(), "rust".to_string()),
        ("telemetry.sdk.version".to_string(), "0.33.1".to_string()),
    ];
    for pair in env("OTEL_RESOURCE_ATTRIBUTES").unwrap_or_default().split(',') {
        if let Some((k, v)) = pair.split_once('=') {
            attributes.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    attributes.push(("service.name".into(), service.into()));
    attributes.extend(config.resource.iter().cloned());
    attributes
        .into_iter()
        .fold(Resource::builder_empty(), |b, (k, v)| {
            b.with_attribute(KeyValue::new(k, v))
        })
        .build()
}

/// A collector's url as tritonserver takes it (libcurl's): without a scheme, `http://`.
fn with_scheme(url: &str) -> String {
    if url.contains("://") {
        url.to_string()
    } else {
        format!("http://{url}")
    }
}

impl Processor {
    /// Starts the worker thread and its exporter (to `config.url`, else `OTEL_EXPORTER_OTLP_*`'s
    /// endpoint, else http://localhost:4318/v1/traces).
    /// `client`: how the collector is reached ([`Client::new`]).
    pub fn start(config: &OtelConfig, resource: Resource, client: Client) -> Result<Processor, String> {
        let mut builder = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_http_client(client)
            .with_retry_policy(RetryPolicy::disabled());
        if let Some(url) = &config.url {
            builder = builder.with_endpoint(with_scheme(url));
        }
        let mut exporter = builder
            .build()
            .map_err(|e| format!("--trace-config opentelemetry: {e}"))?;
        exporter.set_resource(&resource);
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::new(config.bsp, Instant::now())),
            wake: tokio::sync::Notify::new(),
            busy: AtomicBool::new(false),
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the OpenTelemetry exporter: {e}"))?;
        let worker = shared.clone();
        std::thread::Builder::new()
            .name("otel-export".into())
            .spawn(move || runtime.block_on(work(worker, exporter)))
            .map_err(|e| format!("cannot start the OpenTelemetry exporter: {e}"))?;
        Ok(Processor { shared })
    }

    /// Queues an ended span of `request` (`last`: its root); a full queue drops it with
    /// opentelemetry-cpp's warning.
    pub fn push(&self, request: u64, span: SpanData, last: bool) {
        let pushed = self.shared.queue.locked().push(request, span, last);
        match pushed {
            Pushed::Queued { wake: true } => self.shared.wake.notify_one(),
            Pushed::Queued { wake: false } => {}
            Pushed::Dropped => tracing::warn!("{DROPPED}"),
        }
    }

    /// Exports what is queued, waiting `timeout` at most for the collector.
    pub fn flush(&self, timeout: Duration) {
        self.shared.queue.locked().flush();
        self.shared.wake.notify_one();
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.shared.queue.locked().is_empty() && !self.shared.busy.load(Ordering::Acquire) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The worker: exports when the queue says, sleeps until it is woken or its timer comes.
async fn work(shared: Arc<Shared>, exporter: opentelemetry_otlp::SpanExporter) {
    let mut failing = false;
    loop {
        let next = {
            let mut queue = shared.queue.locked();
            let next = queue.next(Instant::now());
            shared.busy.store(matches!(next, Next::Export(_)), Ordering::Release);
            next
        };
        match next {
            Next::Export(spans) => {
                let result = tokio::time::timeout(Duration::from_secs(30), exporter.export(spans)).await;
                let error = match result {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some(e.to_string()),
                    Err(_) => Some("no answer in 30 s".to_string()),
                };
                match error {
                    // One warning per run of failures (a collector that is down fails every export).
                    Some(e) if !failing => {
                        tracing::warn!("OpenTelemetry: exporting spans failed: {e} (until one succeeds, further failures are logged at debug level)");
                        failing = true;
                    }
                    Some(e) => tracing::debug!("OpenTelemetry: exporting spans failed: {e}"),
                    None => failing = false,
                }
            }
            Next::Wait(Some(until)) => {
                tokio::select! {
                    () = shared.wake.notified() => {}
                    () = tokio::time::sleep_until(until.into()) => {}
                }
            }
            Next::Wait(None) => shared.wake.notified().await,
        }
    }
}

/// The processor as the SDK's trait, for spans a tracer provider would end (none of a request).
impl SpanProcessor for Processor {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &opentelemetry::Context) {}

    fn on_end(&self, span: SpanData) {
        self.push(0, span, true);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.flush(Duration::from_secs(5));
        Ok(())
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.flush(timeout);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_resource_follows_tritons_precedence() {
        let config = OtelConfig {
            resource: vec![
                ("service.name".into(), "test_triton".into()),
                ("test.key".into(), "a".into()),
                ("test.key".into(), "test.value".into()),
            ],
            ..Default::default()
        };
        let env = |k: &str| (k == "OTEL_RESOURCE_ATTRIBUTES").then(|| "service.name=env,env.key=e".to_string());
        let r = resource(&config, "triton-inference-server", &env);
        let get = |k: &'static str| r.get(&opentelemetry::Key::from_static_str(k)).map(|v| v.to_string());
        assert_eq!(get("service.name").as_deref(), Some("test_triton"));
        assert_eq!(get("test.key").as_deref(), Some("test.value"));
        assert_eq!(get("env.key").as_deref(), Some("e"));
        let plain = resource(&OtelConfig::default(), "triton-inference-server", &|_| None);
        let name = plain.get(&opentelemetry::Key::from_static_str("service.name"));
        assert_eq!(name.map(|v| v.to_string()).as_deref(), Some("triton-inference-server"));
    }

    /// One OTLP/HTTP request, read by a listener standing in for a collector: its head and body.
    fn collect_one(listener: std::net::TcpListener) -> std::thread::JoinHandle<(String, Vec<u8>)> {
        use std::io::{Read, Write};
        std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut data = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                let n = conn.read(&mut buf).unwrap();
                data.extend_from_slice(&buf[..n]);
                let Some(at) = data.windows(4).position(|w| w == b"\r\n\r\n") else {
                    continue;
                };
                let head = String::from_utf8_lossy(&data[..at]).to_string();
                let body = &data[at + 4..];
                let length = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().to_string())
                    })
                    .and_then(|v| v.parse::<usize>().ok())
                    .unwrap_or(0);
                if body.len() >= length {
                    conn.write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n",
                    )
                    .unwrap();
                    return (head, body.to_vec());
                }
            }
        })
    }

    #[test]
    fn spans_go_to_the_collector_as_otlp_http_protobuf() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let collector = collect_one(listener);
        let config = OtelConfig {
            url: Some(format!("127.0.0.1:{port}/v1/traces")),
            ..Default::default()
        };
        let processor = Processor::start(
            &config,
            resource(&config, "triton-inference-server", &|_| None),
            Client::new(&|_| None).unwrap(),
        )
        .unwrap();
        let mut registry = super::super::spans::Registry::default();
        let now = super::super::spans::Clock {
            unix_ns: 1_000_000_000,
            steady_ns: 5,
        };
        registry.root(1, None, false, now);
        let trace = crate::trace::Trace {
            id: 1,
            model: "simple".into(),
            version: 1,
            request_id: String::new(),
            parent_id: None,
            stamps: vec![("REQUEST_START", 10), ("REQUEST_END", 20)],
        };
        for e in registry.finish(&trace) {
            processor.push(e.request, e.span, e.last);
        }
        processor.flush(Duration::from_secs(10));
        let (head, body) = collector.join().unwrap();
        assert!(head.starts_with("POST /v1/traces HTTP/1.1"), "{head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: application/x-protobuf"),
            "{head}"
        );
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
        use prost::Message;
        let body = ExportTraceServiceRequest::decode(body.as_slice()).unwrap();
        let scope = &body.resource_spans[0].scope_spans[0];
        assert_eq!(scope.scope.as_ref().unwrap().name, "triton-server");
        let names: Vec<&str> = scope.spans.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["simple", "InferRequest"]);
    }

    #[test]
    fn a_url_without_scheme_is_http() {
        assert_eq!(
            with_scheme("localhost:10000/v1/traces"),
            "http://localhost:10000/v1/traces"
        );
        assert_eq!(with_scheme("https://c:4318/v1/traces"), "https://c:4318/v1/traces");
    }
}
