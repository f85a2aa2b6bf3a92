//! Fuzzes the bodies of `/v2/systemsharedmemory/region/{name}/register` and
//! `/v2/cudasharedmemory/region/{name}/register`: the JSON (and the CUDA handle's base64) read into
//! what registration is given; nothing is opened or mapped.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mesh::http::shm;

fuzz_target!(|data: &[u8]| {
    let _ = shm::parse_system_register(data);
    let _ = shm::parse_cuda_register(data);
});
