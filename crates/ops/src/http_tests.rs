//! Tests of the minimal HTTP client against a one-shot `TcpListener` server in a thread.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::thread;
use std::time::Duration;

use super::{get, parse_headers, read_response, Error, Url};

const TIMEOUT: Duration = Duration::from_secs(5);

/// Serves one connection with `answer` (raw bytes) and returns the URL and a handle yielding the request head.
pub(crate) fn serve_once(answer: Vec<u8>) -> (String, thread::JoinHandle<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let handle = thread::spawn(move || {
        let (stream, _) = listener.accept().expect("accept");
        let mut reader = BufReader::new(stream.try_clone().expect("clone"));
        let mut head = String::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                break;
            }
            head.push_str(&line);
        }
        let mut stream = stream;
        let _ = stream.write_all(&answer);
        head
    });
    (url, handle)
}

#[test]
fn ok_with_content_length_sends_a_proper_request() {
    let body = br#"{"nodes": []}"#;
    let mut answer = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    answer.extend_from_slice(body);
    let (url, server) = serve_once(answer);
    let response = get(&format!("{url}/mesh/v1/cluster"), TIMEOUT).expect("get");
    assert_eq!(response.status, 200);
    assert_eq!(response.reason, "OK");
    assert_eq!(response.header("content-type"), Some("application/json"));
    assert_eq!(response.body, body);
    let head = server.join().expect("server");
    assert!(head.starts_with("GET /mesh/v1/cluster HTTP/1.1\r\n"), "{head}");
    assert!(
        head.contains(&format!("Host: {}\r\n", url.trim_start_matches("http://"))),
        "{head}"
    );
    assert!(head.contains("Connection: close\r\n"), "{head}");
}

#[test]
fn error_status_is_returned_with_its_body() {
    let (url, _server) = serve_once(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\nboom".to_vec());
    let response = get(&url, TIMEOUT).expect("get");
    assert_eq!(
        (response.status, response.reason.as_str(), response.body.as_slice()),
        (500, "Internal Server Error", &b"boom"[..])
    );
}

#[test]
fn chunked_body_is_decoded() {
    let answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4;ext=1\r\n{\"a\"\r\nA\r\n: [1, 2, 3\r\n1\r\n]\r\n1\r\n}\r\n0\r\nX-Trailer: yes\r\n\r\n";
    let (url, _server) = serve_once(answer.to_vec());
    let response = get(&url, TIMEOUT).expect("get");
    assert_eq!(String::from_utf8_lossy(&response.body), r#"{"a": [1, 2, 3]}"#);
}

#[test]
fn body_without_length_is_read_to_close() {
    let (url, _server) = serve_once(b"HTTP/1.0 200 OK\r\n\r\nnot json at all".to_vec());
    assert_eq!(get(&url, TIMEOUT).expect("get").body, b"not json at all");
}

#[test]
fn refused_connection_is_a_connect_error() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address");
    drop(listener);
    let err = get(&format!("http://{addr}/"), TIMEOUT).expect_err("nobody listens");
    assert!(matches!(err, Error::Connect(_)), "{err}");
}

#[test]
fn silent_server_times_out() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/", listener.local_addr().expect("address"));
    let err = get(&url, Duration::from_millis(200)).expect_err("no answer");
    assert!(matches!(err, Error::Protocol(_)), "{err}");
    drop(listener);
}

#[test]
fn broken_answers_are_protocol_errors() {
    let cases: [&[u8]; 6] = [
        b"SSH-2.0-OpenSSH\r\n",
        b"HTTP/1.1 abc OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
    ];
    for case in cases {
        let err = read_response(case).expect_err("broken answer accepted");
        assert!(matches!(err, Error::Protocol(_)), "{err}");
    }
    assert!(read_response(&b""[..]).is_err());
}

#[test]
fn urls_parse_or_explain() {
    let url = Url::parse("http://localhost:8000").expect("url");
    assert_eq!(
        url,
        Url {
            host: "localhost".into(),
            port: 8000,
            path: "/".into()
        }
    );
    let url = Url::parse("HTTP://[::1]:9000/mesh/v1/cluster?x=1").expect("url");
    assert_eq!(
        url,
        Url {
            host: "[::1]".into(),
            port: 9000,
            path: "/mesh/v1/cluster?x=1".into()
        }
    );
    assert_eq!(Url::parse("http://router").expect("url").port, 80);
    for (bad, why) in [
        ("https://router:8000", "only http://"),
        ("router:8000", "expected http://"),
        ("http://:8000", "host"),
        ("http://router:99999", "bad port"),
        ("http://user@router", "user info"),
        ("http://router/a b", "spaces"),
    ] {
        let err = Url::parse(bad).expect_err(bad).to_string();
        assert!(err.contains(why), "{bad}: {err}");
    }
}

#[test]
fn header_flags_are_checked_and_never_echo_their_secret() {
    let ok = parse_headers(&["admin-key=s3:cr=t".to_string()]).unwrap();
    assert_eq!(ok, vec![("admin-key".to_string(), "s3:cr=t".to_string())]);
    let e = parse_headers(&["admin-key".to_string()]).unwrap_err();
    assert!(e.contains("KEY=VALUE"), "{e}");
    let e = parse_headers(&["bad key=secret".to_string()]).unwrap_err();
    assert!(e.contains("'bad key'") && !e.contains("secret"), "{e}");
    assert!(parse_headers(&["k=line\r\nx: y".to_string()]).is_err());
    assert!(parse_headers(&["=v".to_string()]).is_err());
}
