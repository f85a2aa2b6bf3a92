//! The exporter's HTTP client: HTTP/1 to the collector on the export worker's runtime, one
//! connection kept from export to export (keep-alive, as opentelemetry-cpp's curl does), over
//! plain TCP (`http://`, what Triton's tests use) or TLS (`https://`),
//! checked against the CA bundle of `OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE` or
//! `OTEL_EXPORTER_OTLP_CERTIFICATE` (OpenTelemetry's variables), else the system's. A collector's
//! answer is read up to [`MAX_ANSWER`] bytes. An export is sent again on a new connection only
//! when the kept one took none of it (closed by the collector meanwhile): never twice; a
//! connection idle for [`KEEP_IDLE`] is not used again.
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use opentelemetry_http::{HttpClient, HttpError};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};

/// The largest answer read from a collector.
const MAX_ANSWER: usize = 4 << 20;
/// The largest CA bundle read.
const MAX_BUNDLE: u64 = 16 << 20;
/// Debian's and Ubuntu's bundle of the system's trusted CAs.
pub const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The last export's connection, with the collector it goes to (`scheme://authority`) and when
/// its answer came.
type Kept = Option<(String, SendRequest<Full<Bytes>>, Instant)>;

/// How long a kept connection may have been idle and still carry the next export: a connection
/// idle for longer may have been dropped silently on the way (a NAT or a firewall forgets it), and
/// an export written into it would be lost rather than sent again.
const KEEP_IDLE: Duration = Duration::from_secs(15);

/// The client; `tls`: how an `https://` collector is checked (None: no CA bundle could be read);
/// `kept`: the connection the next export tries first.
#[derive(Debug, Clone)]
pub struct Client {
    tls: Option<Arc<rustls::ClientConfig>>,
    kept: Arc<Mutex<Kept>>,
}

impl Client {
    /// A client trusting the CA bundle the environment (`env`) names, else the system's. A bundle
    /// that was named but cannot be used is an error; without one, an `https://` collector fails
    /// each export with the reason.
    pub fn new(env: &dyn Fn(&str) -> Option<String>) -> Result<Client, String> {
        let given = [
            "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
        ]
        .iter()
        .find_map(|k| env(k).filter(|v| !v.is_empty()).map(|v| (*k, v)));
        let path = given.as_ref().map_or(SYSTEM_BUNDLE, |(_, v)| v.as_str());
        let tls = match tls_config(Path::new(path)) {
            Ok(config) => Some(Arc::new(config)),
            Err(e) => match given {
                Some((key, _)) => return Err(format!("{key}: the CA bundle {path}: {e}")),
                None => None,
            },
        };
        Ok(Client {
            tls,
            kept: Arc::default(),
        })
    }

    /// A new connection to the collector (`https`: over TLS).
    async fn connect(&self, host: String, port: u16, https: bool) -> Result<SendRequest<Full<Bytes>>, HttpError> {
        let tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
        // An export is written whole: Nagle's wait for an ACK would only delay its last segment.
        tcp.set_nodelay(true)?;
        if !https {
            return handshake(tcp).await;
        }
        let Some(tls) = &self.tls else {
            return Err(format!(
                "no CA bundle to check the https collector {host}:{port} with ({SYSTEM_BUNDLE} cannot be read): \
                 set OTEL_EXPORTER_OTLP_CERTIFICATE"
            )
            .into());
        };
        let name = ServerName::try_from(host)?;
        let stream = tokio_rustls::TlsConnector::from(tls.clone()).connect(name, tcp).await?;
        handshake(stream).await
    }

    /// Reads the collector's answer on `sender`'s connection, which is kept for the next export.
    async fn answer(
        &self,
        to: String,
        sender: SendRequest<Full<Bytes>>,
        answer: http::Response<hyper::body::Incoming>,
    ) -> Result<http::Response<Bytes>, HttpError> {
        let (parts, body) = answer.into_parts();
        let body = Limited::new(body, MAX_ANSWER).collect().await?.to_bytes();
        *self.kept.lock().unwrap_or_else(|e| e.into_inner()) = Some((to, sender, Instant::now()));
        Ok(http::Response::from_parts(parts, body))
    }
}

fn tls_config(path: &Path) -> Result<rustls::ClientConfig, String> {
    use std::io::Read;
    let mut pem = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_BUNDLE).read_to_end(&mut pem))
        .map_err(|e| e.to_string())?;
    let mut roots = rustls::RootCertStore::empty();
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("not PEM certificates: {e}"))?;
    let (added, _) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err("no usable CA certificate in it".into());
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

#[async_trait]
impl HttpClient for Client {
    async fn send_bytes(&self, request: http::Request<Bytes>) -> Result<http::Response<Bytes>, HttpError> {
        let (mut parts, body) = request.into_parts();
        let https = match parts.uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => return Err(format!("a collector's url is http:// or https://, not {}", parts.uri).into()),
        };
        let authority = parts.uri.authority().ok_or("the collector's url has no host")?.clone();
        let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        parts.headers.insert(http::header::HOST, authority.as_str().parse()?);
        parts.uri = parts.uri.path_and_query().map_or("/", |p| p.as_str()).parse()?;
        let mut request = http::Request::from_parts(parts, Full::new(body));
        let to = format!("{}://{authority}", if https { "https" } else { "http" });
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some((_, mut sender, _)) =
            kept.filter(|(k, s, at)| *k == to && !s.is_closed() && at.elapsed() < KEEP_IDLE)
        {
            if sender.ready().await.is_ok() {
                match sender.try_send_request(request).await {
                    Ok(answer) => return self.answer(to, sender, answer).await,
                    // Unsent (the collector closed the connection meanwhile): a new one takes it.
                    Err(mut e) => match e.take_message() {
                        Some(unsent) => request = unsent,
                        None => return Err(Box::new(e.into_error())),
                    },
                }
            }
        }
        let mut sender = self.connect(host, port, https).await?;
        let answer = sender.send_request(request).await?;
        self.answer(to, sender, answer).await
    }
}

async fn handshake<S>(stream: S) -> Result<SendRequest<Full<Bytes>>, HttpError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    Ok(sender)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A TLS collector on loopback for "localhost" that answers one request 200 and hands back what
    /// it read; and its CA certificate's PEM.
    async fn tls_collector() -> (u16, String, tokio::task::JoinHandle<String>) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
            )
            .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let served = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let Ok(mut tls) = acceptor.accept(tcp).await else {
                return String::new();
            };
            let mut got = vec![0u8; 4096];
            let n = tls.read(&mut got).await.unwrap();
            let _ = tls.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}").await;
            let _ = tls.shutdown().await;
            String::from_utf8_lossy(&got[..n]).into_owned()
        });
        (port, cert.pem(), served)
    }

    fn post(url: &str) -> http::Request<Bytes> {
        http::Request::post(url)
            .body(Bytes::from_static(b"{\"resourceSpans\":[]}"))
            .unwrap()
    }

    /// A plain collector on loopback that answers every request 200, closing each connection after
    /// `per_connection` answers (its `connection: close` header says so on the last when `say`);
    /// counts the connections and requests it took.
    async fn counting_collector(per_connection: usize, say: bool) -> (u16, Arc<Mutex<(usize, usize)>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let counts = Arc::new(Mutex::new((0, 0)));
        let seen = counts.clone();
        tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                seen.lock().unwrap().0 += 1;
                let seen = seen.clone();
                tokio::spawn(async move {
                    for served in 1..=per_connection {
                        // Each request: a head naming its length, then that many bytes of body.
                        let mut got = Vec::new();
                        let mut buf = [0u8; 4096];
                        let body_at = loop {
                            let n = tcp.read(&mut buf).await.unwrap_or(0);
                            if n == 0 {
                                return;
                            }
                            got.extend_from_slice(&buf[..n]);
                            if let Some(at) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                                break at + 4;
                            }
                        };
                        let head = String::from_utf8_lossy(&got[..body_at]).to_ascii_lowercase();
                        let length: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map_or(0, |v| v.trim().parse().unwrap());
                        while got.len() < body_at + length {
                            let n = tcp.read(&mut buf).await.unwrap();
                            got.extend_from_slice(&buf[..n]);
                        }
                        seen.lock().unwrap().1 += 1;
                        let close = if say && served == per_connection {
                            "connection: close\r\n"
                        } else {
                            ""
                        };
                        let answer = format!("HTTP/1.1 200 OK\r\n{close}content-length: 2\r\n\r\n{{}}");
                        tcp.write_all(answer.as_bytes()).await.unwrap();
                    }
                    let _ = tcp.shutdown().await;
                });
            }
        });
        (port, counts)
    }

    #[tokio::test]
    async fn exports_share_one_kept_connection() {
        let (port, counts) = counting_collector(usize::MAX, false).await;
        let client = Client::new(&|_| None).unwrap();
        for _ in 0..3 {
            let answer = client
                .send_bytes(post(&format!("http://127.0.0.1:{port}/v1/traces")))
                .await
                .unwrap();
            assert_eq!(answer.status(), 200);
            assert_eq!(answer.body().as_ref(), b"{}");
        }
        assert_eq!(*counts.lock().unwrap(), (1, 3), "three exports, one connection");
    }

    #[tokio::test]
    async fn a_connection_the_collector_closed_is_replaced_without_losing_an_export() {
        for say in [true, false] {
            let (port, counts) = counting_collector(1, say).await;
            let client = Client::new(&|_| None).unwrap();
            for _ in 0..3 {
                let answer = client
                    .send_bytes(post(&format!("http://127.0.0.1:{port}/v1/traces")))
                    .await
                    .unwrap_or_else(|e| panic!("an export failed (connection: close said: {say}): {e}"));
                assert_eq!(answer.status(), 200);
                // The collector's close reaches the kept connection before the next export.
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            assert_eq!(*counts.lock().unwrap(), (3, 3), "connection: close said: {say}");
        }
    }

    #[tokio::test]
    async fn an_https_collector_is_checked_against_the_named_ca_bundle() {
        let (port, ca, served) = tls_collector().await;
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path().join("ca.pem");
        std::fs::write(&bundle, ca).unwrap();
        let path = bundle.to_str().unwrap().to_string();
        let env = |k: &str| (k == "OTEL_EXPORTER_OTLP_CERTIFICATE").then(|| path.clone());
        let client = Client::new(&env).unwrap();
        let answer = client
            .send_bytes(post(&format!("https://localhost:{port}/v1/traces")))
            .await
            .expect("exported over TLS");
        assert_eq!(answer.status(), 200);
        let got = served.await.unwrap();
        assert!(got.starts_with("POST /v1/traces HTTP/1.1"), "{got}");
        assert!(got.contains("resourceSpans"), "{got}");
    }

    #[tokio::test]
    async fn an_https_collector_the_bundle_does_not_vouch_for_is_refused() {
        let (port, _, served) = tls_collector().await;
        let (_, other_ca, _) = tls_collector().await;
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path().join("other.pem");
        std::fs::write(&bundle, other_ca).unwrap();
        let path = bundle.to_str().unwrap().to_string();
        let env = |k: &str| (k == "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE").then(|| path.clone());
        let e = Client::new(&env)
            .unwrap()
            .send_bytes(post(&format!("https://localhost:{port}/v1/traces")))
            .await
            .expect_err("an unknown issuer");
        assert!(e.to_string().to_lowercase().contains("certificate"), "{e}");
        assert_eq!(served.await.unwrap(), "", "nothing was sent");
    }

    #[test]
    fn a_named_bundle_that_cannot_be_used_is_an_error_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate").unwrap();
        for path in [dir.path().join("missing.pem"), junk] {
            let path = path.to_str().unwrap().to_string();
            let env = |k: &str| (k == "OTEL_EXPORTER_OTLP_CERTIFICATE").then(|| path.clone());
            let e = Client::new(&env).expect_err("a bundle that cannot be used");
            assert!(e.starts_with("OTEL_EXPORTER_OTLP_CERTIFICATE: the CA bundle"), "{e}");
        }
    }
}
