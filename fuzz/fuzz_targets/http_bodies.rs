//! Fuzzes the other HTTP body readers: the bounded JSON reader every JSON body goes through,
//! gzip/deflate decompression with its size cap, and repository load bodies (their parameters,
//! base64 files and the `config` override, parsed as JSON into a model config and validated).
//!
//! Input: a selector byte, then the body: `j` bounded JSON, `g` gzip, `d` deflate (each
//! decompressed body is read as JSON too), `l` a load body; any other first byte: bounded JSON of
//! the whole input.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use mesh::http::{compress, json_bounded};

/// A small cap, so a body that inflates past it is refused quickly.
const LIMIT: usize = 64 << 10;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    match selector {
        b'g' | b'd' => {
            let encoding = http::HeaderValue::from_static(if selector == b'g' { "gzip" } else { "deflate" });
            if let Ok(plain) = compress::decode(Some(&encoding), Bytes::copy_from_slice(body), LIMIT) {
                assert!(plain.len() <= LIMIT, "decompressed past the limit");
                let _ = json_bounded::parse(&plain, "request JSON");
            }
        }
        b'l' => {
            if let Ok(options) = mesh::http::load_options(body) {
                if let Some(config) = options.config {
                    if let Ok(config) = mesh::config::config_from_json(&config) {
                        let _ = mesh::config::validate_config(&config);
                    }
                }
            }
        }
        b'j' => {
            let _ = json_bounded::parse(body, "request JSON");
        }
        _ => {
            let _ = json_bounded::parse(data, "request JSON");
        }
    }
});
