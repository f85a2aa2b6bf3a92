//! Fuzzes an HTTP infer body as the server reads it: the JSON header with binary tensors after it
//! (split by `Inference-Header-Content-Length`), or a raw body when that header is 0; then the
//! request checked against the model's config and its inputs echoed back through the response encoder.
//!
//! Input: one line `HEADER[;CONFIG]` (the header's value, empty for none; CONFIG indexes
//! `mesh_fuzz::CONFIGS`), then the body.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use mesh::http::{codec, raw};

fuzz_target!(|data: &[u8]| {
    let Some((line, body)) = mesh_fuzz::split_line(data) else {
        return;
    };
    let (header, config) = line.split_once(';').unwrap_or((line, "0"));
    let Ok(config) = config.parse::<usize>() else {
        return;
    };
    let Some(config) = mesh_fuzz::configs().get(config) else {
        return;
    };
    // As the server reads the header: absent, or a non-negative integer.
    let header_len = match header {
        "" => None,
        h => match h.trim().parse::<usize>() {
            Ok(n) => Some(n),
            Err(_) => return,
        },
    };
    let body = Bytes::copy_from_slice(body);
    let decoded = if header_len == Some(0) {
        let format = codec::OutputFormat {
            default_binary: true,
            ..Default::default()
        };
        raw::decode_raw(&config.name, "", config, body).map(|r| (r, format))
    } else {
        codec::decode_request(&config.name, "1", body, header_len, mesh_fuzz::shared_memory())
    };
    let Ok((request, format)) = decoded else {
        return;
    };
    let _ = mesh::validate::check_request(config, &request);
    let response = mesh_fuzz::echo(request);
    let _ = codec::encode_response(&response, &format);
});
