//! Fuzzes a generate-extension body (`/generate`, `/generate_stream`): the flat JSON object turned
//! into a request against the model's config, checked, and its inputs echoed through the encoder.
//!
//! Input: an optional leading digit picking one of `mesh_fuzz::CONFIGS` (0 without one), then the body.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mesh::http::generate;

fuzz_target!(|data: &[u8]| {
    let (config, body) = match data.first() {
        Some(&d @ b'0'..=b'3') => (usize::from(d - b'0'), &data[1..]),
        _ => (0, data),
    };
    let config = &mesh_fuzz::configs()[config];
    let Ok(request) = generate::decode_generate(&config.name, "", config, body) else {
        return;
    };
    let _ = mesh::validate::check_request(config, &request);
    let response = mesh_fuzz::echo(request);
    let _ = generate::encode_generate(&response);
});
