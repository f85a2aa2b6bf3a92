//! What the fuzz targets share: realistic model configs and a registered shared-memory region, so
//! the decoders get past the lookups a real server does and into the tensor checks.
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::OnceLock;

use mesh::config::{parse_pbtxt, ModelConfig};
use mesh::shm::SharedMemory;

/// The configs a target picks from (index 0 by default). 0 has several inputs of several types,
/// batched; the others have one input each, as a raw (`Inference-Header-Content-Length: 0`) body
/// needs, and cover a fixed-size variable dimension, BYTES and a non-batching model.
pub const CONFIGS: [&str; 4] = [
    r#"name: "multi"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1, 4 ] },
  { name: "INPUT1" data_type: TYPE_INT64 dims: [ 2 ] },
  { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] },
  { name: "MASK" data_type: TYPE_BOOL dims: [ 3 ] optional: true },
  { name: "HALF" data_type: TYPE_FP16 dims: [ 2, 2 ] optional: true reshape: { shape: [ 4 ] } }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1, 4 ] },
  { name: "LABEL" data_type: TYPE_STRING dims: [ 1 ] }
]"#,
    r#"name: "raw_fp32"
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1, 3 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]"#,
    r#"name: "raw_bytes"
max_batch_size: 4
input [ { name: "S" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "T" data_type: TYPE_STRING dims: [ 1 ] } ]"#,
    r#"name: "raw_int8"
input [ { name: "B" data_type: TYPE_INT8 dims: [ 2, -1 ] } ]
output [ { name: "C" data_type: TYPE_UINT16 dims: [ 2, -1 ] } ]"#,
];

/// The response a server would give back for `request`: its inputs as outputs, so the targets drive
/// the encoders with whatever the decoders let through.
pub fn echo(request: mesh::InferRequest) -> mesh::InferResponse {
    mesh::InferResponse {
        model_name: request.model_name,
        model_version: request.model_version,
        id: request.id,
        outputs: request.inputs,
        parameters: request.parameters,
    }
}

/// The configs, parsed once.
pub fn configs() -> &'static [ModelConfig] {
    static PARSED: OnceLock<Vec<ModelConfig>> = OnceLock::new();
    PARSED.get_or_init(|| {
        CONFIGS
            .iter()
            .map(|text| parse_pbtxt(text).expect("the fuzz configs are valid"))
            .collect()
    })
}

/// Bytes of the system shared-memory object behind the registered regions.
const SHM_BYTES: u64 = 4096;

/// A registry with two system regions a request may name: `r0` (the whole 4 KiB object) and `r1`
/// (1 KiB from offset 64). The object is this process's own, unlinked once registered; without
/// /dev/shm the registry is empty.
pub fn shared_memory() -> &'static SharedMemory {
    static SHM: OnceLock<SharedMemory> = OnceLock::new();
    SHM.get_or_init(|| {
        let shm = SharedMemory::default();
        let key = format!("mesh-fuzz-{}", std::process::id());
        let path = std::path::Path::new("/dev/shm").join(&key);
        if let Ok(file) = std::fs::File::create(&path) {
            if file.set_len(SHM_BYTES).is_ok() {
                let _ = shm.register_system("r0", &key, 0, SHM_BYTES);
                let _ = shm.register_system("r1", &key, 64, 1024);
            }
            let _ = std::fs::remove_file(&path);
        }
        shm
    })
}

/// Splits a target's input at its first newline: the line (as text) and the rest; None when there
/// is no newline or the line is not UTF-8.
pub fn split_line(data: &[u8]) -> Option<(&str, &[u8])> {
    let at = data.iter().position(|&b| b == b'\n')?;
    Some((std::str::from_utf8(&data[..at]).ok()?, &data[at + 1..]))
}

/// The largest single allocation a target may make: libFuzzer's `-malloc_limit_mb` (by default its
/// `-rss_limit_mb`, 2048) needs a sanitizer's allocator hooks, which a build without sanitizers
/// lacks, so this allocator enforces it: a bigger request is a crash the fuzzer keeps.
pub const MALLOC_LIMIT: usize = 2048 << 20;

/// The system allocator, refusing (as a crash) any one allocation over [`MALLOC_LIMIT`].
struct Capped;

fn check(size: usize) {
    if size > MALLOC_LIMIT {
        // libfuzzer-sys's panic hook aborts, so this never unwinds out of the allocator.
        panic!("fuzz: one allocation of {size} bytes, over the {MALLOC_LIMIT}-byte limit");
    }
}

// SAFETY: forwards to the system allocator unchanged once the size is checked.
unsafe impl GlobalAlloc for Capped {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        check(layout.size());
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        check(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        check(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Capped = Capped;
