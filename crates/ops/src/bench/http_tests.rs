//! Tests of the HTTP side: metadata parsing, request bodies, and how answers are classified.
use super::*;

#[test]
fn model_info_from_metadata_and_config() {
    let metadata = json!({"name": "m", "inputs": [
        {"name": "x", "datatype": "FP32", "shape": [-1, 64]},
        {"name": "s", "datatype": "BYTES", "shape": [1]}]});
    let info = parse_model_info(&metadata, &json!({"max_batch_size": 32})).unwrap();
    assert_eq!(info.max_batch_size, 32);
    assert_eq!(info.inputs[0].shape, vec![-1, 64]);
    assert_eq!(info.inputs[1].datatype, "BYTES");
    // proto3 JSON leaves out a zero max_batch_size.
    assert_eq!(parse_model_info(&metadata, &json!({})).unwrap().max_batch_size, 0);
    let bad = parse_model_info(&json!({"inputs": [{"name": "x", "datatype": "FP32"}]}), &json!({}));
    assert!(bad.unwrap_err().contains("'x'"));
    assert!(parse_model_info(&metadata, &json!({"max_batch_size": -1})).is_err());
}

#[test]
fn paths_are_encoded_and_bodies_carry_binary_tensors() {
    assert_eq!(model_path("a b/c", Some("2")), "/v2/models/a%20b%2Fc/versions/2");
    let t = RequestTensor {
        name: "x".into(),
        datatype: mesh::DataType::Fp32,
        shape: vec![1, 2],
        data: Bytes::from_static(&[0, 0, 128, 63, 0, 0, 0, 64]),
    };
    let bodies = prepare("m", None, &[vec![t]]);
    let b = &bodies[0];
    assert_eq!(b.path, "/v2/models/m/infer");
    let header: Value = serde_json::from_slice(&b.bytes[..b.header_len]).unwrap();
    assert_eq!(header["inputs"][0]["parameters"]["binary_data_size"], 8);
    assert_eq!(header["inputs"][0]["shape"], json!([1, 2]));
    assert_eq!(header["parameters"]["binary_data_output"], true);
    assert_eq!(&b.bytes[b.header_len..], &[0, 0, 128, 63, 0, 0, 0, 64]);
}

#[test]
fn urls_take_http_or_host_port() {
    let t = Target::new("localhost:8000", Duration::from_secs(1)).unwrap();
    assert_eq!(
        (t.url(), t.addr.as_str(), t.host.as_str()),
        ("http://localhost:8000", "localhost:8000", "localhost:8000")
    );
    let t = Target::new("http://[::1]/base/", Duration::from_secs(1)).unwrap();
    assert_eq!(
        (t.addr.as_str(), t.host.as_str(), t.prefix.as_str()),
        ("[::1]:80", "[::1]", "/base")
    );
    assert_eq!(
        Target::new("https://h:1", Duration::from_secs(1)).unwrap_err().kind,
        SetupKind::Usage
    );
    assert_eq!(
        Target::new("h:notaport", Duration::from_secs(1)).unwrap_err().kind,
        SetupKind::Usage
    );
}

#[test]
fn error_text_prefers_the_servers_message() {
    assert_eq!(error_text(br#"{"error":"unknown model 'x'"}"#), "unknown model 'x'");
    assert_eq!(error_text(b"  plain failure \n"), "plain failure");
    assert_eq!(error_text(b""), "(empty body)");
}

/// Sends one request to a server that reads it and writes `reply` (then closes).
async fn exchange(reply: &'static [u8]) -> Result<(), RequestError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 64 << 10];
        let _ = conn.read(&mut buf).await;
        let _ = conn.write_all(reply).await;
    });
    let target = Arc::new(Target::new(&url, Duration::from_secs(5)).unwrap());
    let t = RequestTensor {
        name: "x".into(),
        datatype: mesh::DataType::Uint8,
        shape: vec![1],
        data: Bytes::from_static(&[1]),
    };
    let mut slot = Slot::new(target, Arc::new(prepare("m", None, &[vec![t]])));
    slot.infer(0).await
}

#[tokio::test]
async fn answers_are_classified_by_kind() {
    assert_eq!(
        exchange(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}").await,
        Ok(())
    );
    let busy = exchange(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 16\r\n\r\n{\"error\":\"busy\"}");
    assert_eq!(busy.await, Err(RequestError::new(ErrorKind::Http(503), "busy")));
    assert_eq!(exchange(b"").await.unwrap_err().kind, ErrorKind::Disconnected);
    let cut = exchange(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{}")
        .await
        .unwrap_err();
    assert_eq!(cut.kind, ErrorKind::Disconnected);
    assert_eq!(
        exchange(b"SMTP ready\r\n\r\n").await.unwrap_err().kind,
        ErrorKind::Protocol
    );
}

#[tokio::test]
async fn a_refused_connection_is_a_connect_error_naming_the_url() {
    // Bind then drop a listener: its port is (almost certainly) closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let target = Target::new(&url, Duration::from_secs(5)).unwrap();
    let err = target.model_info("m", None).await.unwrap_err();
    assert_eq!(err.kind, SetupKind::Unreachable);
    assert_eq!(err.message, format!("cannot reach {url}: connection refused"));
    let mut slot = Slot::new(Arc::new(target), Arc::new(Vec::new()));
    assert_eq!(slot.connect().await.unwrap_err().kind, ErrorKind::Connect);
}

#[tokio::test]
async fn a_server_closing_each_connection_costs_no_errors() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let mut buf = vec![0u8; 64 << 10];
            let _ = conn.read(&mut buf).await;
            let _ = conn
                .write_all(b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}")
                .await;
        }
    });
    let target = Arc::new(Target::new(&url, Duration::from_secs(5)).unwrap());
    let mut slot = Slot::new(target, Arc::new(prepare("m", None, &[Vec::new()])));
    for i in 0..50 {
        assert_eq!(slot.infer(0).await, Ok(()), "request {i}");
    }
}
