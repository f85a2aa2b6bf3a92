//! Fuzzes `config.pbtxt`: the text-format parser (with Triton's colon-less lists and its error
//! positions), the structural validation, and the config's JSON rendering read back.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mesh::config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok((parsed, _fields)) = config::parse_pbtxt_with_fields(text) else {
        return;
    };
    if config::validate_config(&parsed).is_ok() {
        let json = config::config_to_json(&parsed);
        let _ = config::config_from_json(&json.to_string());
    }
});
