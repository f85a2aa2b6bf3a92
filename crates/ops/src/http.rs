//! A minimal HTTP/1.1 GET and POST over `std::net::TcpStream` (http:// only; Content-Length, chunked or read-to-close).

use std::fmt;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// The largest body accepted (a cluster view is a few KiB; this bounds a misbehaving server).
const MAX_BODY: u64 = 64 << 20;
/// The longest status or header line accepted.
const MAX_LINE: u64 = 16 << 10;
/// The most header lines accepted.
const MAX_HEADERS: usize = 200;

/// Headers every request of this process carries (`mesh-ops --header`): set once, at start.
static EXTRA_HEADERS: std::sync::OnceLock<Vec<(String, String)>> = std::sync::OnceLock::new();

/// Parses `KEY=VALUE` headers (the router's restricted-API key) and has every later request carry
/// them. A name or value that would break the request line is refused, naming the header.
pub fn set_headers(values: &[String]) -> Result<(), String> {
    let headers = parse_headers(values)?;
    EXTRA_HEADERS
        .set(headers)
        .map_err(|_| "headers were already set".to_string())
}

/// `KEY=VALUE` flags as (name, value) pairs, checked.
pub fn parse_headers(values: &[String]) -> Result<Vec<(String, String)>, String> {
    let mut headers = Vec::new();
    for v in values {
        let (k, val) = v
            .split_once('=')
            .filter(|(k, _)| !k.is_empty())
            .ok_or_else(|| format!("--header '{}' must be KEY=VALUE", k_only(v)))?;
        let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
        if !k.chars().all(token) || val.chars().any(|c| c.is_control()) {
            return Err(format!("--header '{k}': not a valid HTTP header name and value"));
        }
        headers.push((k.to_string(), val.to_string()));
    }
    Ok(headers)
}

/// The part of a header flag before `=`: a value is a secret and is never shown.
fn k_only(v: &str) -> &str {
    v.split_once('=').map_or(v, |(k, _)| k)
}

/// A received response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// The status code, e.g. 200.
    pub status: u16,
    /// The reason phrase, e.g. `OK`.
    pub reason: String,
    /// The headers, names lower-cased, in order.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

impl Response {
    /// The first header named `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// Why a GET failed.
#[derive(Debug)]
pub enum Error {
    /// The URL is not `http://host[:port][/path]`.
    BadUrl(String),
    /// No connection could be made (refused, unresolvable, timed out).
    Connect(String),
    /// The connection broke or the answer was not HTTP/1.x.
    Protocol(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::BadUrl(msg) => write!(f, "bad URL: {msg}"),
            Error::Connect(msg) => write!(f, "cannot connect: {msg}"),
            Error::Protocol(msg) => write!(f, "bad HTTP answer: {msg}"),
        }
    }
}

impl std::error::Error for Error {}

/// The parts of an `http://` URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Url {
    /// Host as written (brackets kept for IPv6), used in the Host header.
    pub host: String,
    /// Port (80 when not written).
    pub port: u16,
    /// Path and query, starting with `/`.
    pub path: String,
}

impl Url {
    /// Parses `http://host[:port][/path]`.
    pub fn parse(url: &str) -> Result<Url, Error> {
        let rest = match url.split_once("://") {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => rest,
            Some((scheme, _)) => {
                return Err(Error::BadUrl(format!(
                    "{url}: only http:// is supported, not {scheme}://"
                )))
            }
            None => return Err(Error::BadUrl(format!("{url}: expected http://HOST:PORT"))),
        };
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) if rest.as_bytes()[i] == b'/' => (&rest[..i], rest[i..].to_string()),
            Some(i) => (&rest[..i], format!("/{}", &rest[i..])),
            None => (rest, "/".to_string()),
        };
        if authority.contains('@') {
            return Err(Error::BadUrl(format!("{url}: user info is not supported")));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (inside, after) = v6
                .split_once(']')
                .ok_or_else(|| Error::BadUrl(format!("{url}: unclosed '[' in the host")))?;
            (format!("[{inside}]"), after.strip_prefix(':'))
        } else {
            match authority.rsplit_once(':') {
                Some((host, port)) => (host.to_string(), Some(port)),
                None => (authority.to_string(), None),
            }
        };
        if host.is_empty() || host == "[]" || host.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(Error::BadUrl(format!("{url}: missing or bad host")));
        }
        let port = match port {
            None => 80,
            Some(p) => p
                .parse::<u16>()
                .map_err(|_| Error::BadUrl(format!("{url}: bad port '{p}'")))?,
        };
        if path.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(Error::BadUrl(format!(
                "{url}: spaces or control characters in the path"
            )));
        }
        Ok(Url { host, port, path })
    }

    fn socket_addrs(&self) -> Result<Vec<SocketAddr>, Error> {
        let bare = self.host.trim_start_matches('[').trim_end_matches(']');
        (bare, self.port)
            .to_socket_addrs()
            .map(Iterator::collect)
            .map_err(|e| Error::Connect(format!("cannot resolve {}: {e}", self.host)))
    }
}

/// `url` with `http://` in front when it names no scheme (`HOST:PORT` is `http://HOST:PORT`).
pub fn with_scheme(url: &str) -> String {
    match url.contains("://") {
        true => url.to_string(),
        false => format!("http://{url}"),
    }
}

/// GETs `url`; `timeout` bounds the connect and each read and write.
pub fn get(url: &str, timeout: Duration) -> Result<Response, Error> {
    send("GET", url, None, timeout)
}

/// POSTs a JSON body to `url`; `timeout` bounds the connect and each read and write.
pub fn post(url: &str, json: &str, timeout: Duration) -> Result<Response, Error> {
    send("POST", url, Some(json.as_bytes()), timeout)
}

/// Sends one request (with a JSON body, if any) and reads the answer.
fn send(method: &str, url: &str, body: Option<&[u8]>, timeout: Duration) -> Result<Response, Error> {
    let url = Url::parse(url)?;
    let addrs = url.socket_addrs()?;
    let mut last = None;
    let mut stream = None;
    for addr in &addrs {
        match TcpStream::connect_timeout(addr, timeout) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = Some(format!("{addr}: {e}")),
        }
    }
    let stream =
        stream.ok_or_else(|| Error::Connect(last.unwrap_or_else(|| format!("{} has no address", url.host))))?;
    let io = |e: std::io::Error| Error::Protocol(e.to_string());
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    let host = match url.port {
        80 => url.host.clone(),
        port => format!("{}:{port}", url.host),
    };
    let content = match body {
        Some(b) => format!("Content-Type: application/json\r\nContent-Length: {}\r\n", b.len()),
        None => String::new(),
    };
    let extra: String = EXTRA_HEADERS
        .get()
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    let request = format!(
        "{method} {} HTTP/1.1\r\nHost: {host}\r\nAccept: application/json\r\nUser-Agent: mesh-ops/{}\r\n{extra}{content}Connection: close\r\n\r\n",
        url.path,
        env!("CARGO_PKG_VERSION")
    );
    let mut out = request.into_bytes();
    out.extend_from_slice(body.unwrap_or_default());
    (&stream)
        .write_all(&out)
        .map_err(|e| Error::Protocol(format!("sending the request: {e}")))?;
    read_response(BufReader::new(stream))
}

/// Reads one response from `reader` (after a GET: a body always follows, except for 1xx, 204 and 304).
pub fn read_response(mut reader: impl BufRead) -> Result<Response, Error> {
    let status_line = read_line(&mut reader)?;
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    if !version.starts_with("HTTP/1.") {
        return Err(Error::Protocol(format!(
            "not an HTTP/1.x status line: {:?}",
            clip(&status_line)
        )));
    }
    let status = parts
        .next()
        .and_then(|code| code.parse::<u16>().ok())
        .filter(|code| (100..1000).contains(code))
        .ok_or_else(|| Error::Protocol(format!("bad status line: {:?}", clip(&status_line))))?;
    let reason = parts.next().unwrap_or_default().to_string();
    let mut headers = Vec::new();
    loop {
        let line = read_line(&mut reader)?;
        if line.is_empty() {
            break;
        }
        if headers.len() == MAX_HEADERS {
            return Err(Error::Protocol(format!("more than {MAX_HEADERS} headers")));
        }
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| Error::Protocol(format!("bad header line: {:?}", clip(&line))))?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
    }
    let mut response = Response {
        status,
        reason,
        headers,
        body: Vec::new(),
    };
    if matches!(status, 100..=199 | 204 | 304) {
        return Ok(response);
    }
    let chunked = response.header("transfer-encoding").is_some_and(|te| {
        te.split(',')
            .any(|coding| coding.trim().eq_ignore_ascii_case("chunked"))
    });
    response.body = if chunked {
        read_chunked(&mut reader)?
    } else if let Some(length) = response.header("content-length") {
        let length = length
            .parse::<u64>()
            .ok()
            .filter(|&n| n <= MAX_BODY)
            .ok_or_else(|| Error::Protocol(format!("bad or too large Content-Length: {:?}", clip(length))))?;
        read_exact(&mut reader, length)?
    } else {
        read_to_close(&mut reader)?
    };
    Ok(response)
}

fn read_chunked(reader: &mut impl BufRead) -> Result<Vec<u8>, Error> {
    let mut body = Vec::new();
    loop {
        let line = read_line(reader)?;
        let size_text = line.split(';').next().unwrap_or_default().trim();
        let size = u64::from_str_radix(size_text, 16)
            .map_err(|_| Error::Protocol(format!("bad chunk size line: {:?}", clip(&line))))?;
        if size == 0 {
            // Trailers, up to the empty line that ends the message.
            while !read_line(reader)?.is_empty() {}
            return Ok(body);
        }
        if body.len() as u64 + size > MAX_BODY {
            return Err(Error::Protocol(format!("body larger than {MAX_BODY} bytes")));
        }
        body.extend(read_exact(reader, size)?);
        if !read_line(reader)?.is_empty() {
            return Err(Error::Protocol("chunk not followed by CRLF".into()));
        }
    }
}

fn read_exact(reader: &mut impl Read, length: u64) -> Result<Vec<u8>, Error> {
    let mut body = Vec::new();
    reader
        .take(length)
        .read_to_end(&mut body)
        .map_err(|e| Error::Protocol(format!("reading the body: {e}")))?;
    if body.len() as u64 != length {
        return Err(Error::Protocol(format!(
            "body ended after {} of {length} bytes",
            body.len()
        )));
    }
    Ok(body)
}

fn read_to_close(reader: &mut impl Read) -> Result<Vec<u8>, Error> {
    let mut body = Vec::new();
    reader
        .take(MAX_BODY + 1)
        .read_to_end(&mut body)
        .map_err(|e| Error::Protocol(format!("reading the body: {e}")))?;
    if body.len() as u64 > MAX_BODY {
        return Err(Error::Protocol(format!("body larger than {MAX_BODY} bytes")));
    }
    Ok(body)
}

/// One CRLF- (or LF-) terminated line, without its terminator.
fn read_line(reader: &mut impl BufRead) -> Result<String, Error> {
    let mut line = Vec::new();
    let n = reader
        .take(MAX_LINE)
        .read_until(b'\n', &mut line)
        .map_err(|e| Error::Protocol(format!("reading the answer: {e}")))?;
    if n == 0 {
        return Err(Error::Protocol(
            "connection closed before the answer was complete".into(),
        ));
    }
    if line.last() != Some(&b'\n') {
        return Err(Error::Protocol(match n as u64 >= MAX_LINE {
            true => format!("a line longer than {MAX_LINE} bytes"),
            false => "connection closed in the middle of a line".into(),
        }));
    }
    line.pop();
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    String::from_utf8(line).map_err(|_| Error::Protocol("a status or header line is not UTF-8".into()))
}

fn clip(text: &str) -> String {
    text.chars().take(80).collect()
}

/// The router's base URL (`http://` added when missing, no trailing slash).
pub fn base(router: &str) -> String {
    with_scheme(router.trim().trim_end_matches('/'))
}

#[cfg(test)]
#[path = "http_tests.rs"]
pub(crate) mod tests;
