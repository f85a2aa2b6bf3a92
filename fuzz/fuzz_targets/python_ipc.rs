//! Fuzzes what a Python stub sends the node: length-prefixed JSON frames read one after another
//! from the socket, and the tensors each frame describes (in the node's shared memory or inline in
//! the frame's blob), as responses and BLS requests are read.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use mesh_node::backend::python::ipc::{self, Shm};

/// Bytes of the shared memory the stub's tensors may name.
const SHM_BYTES: usize = 4096;

fn shm() -> &'static Shm {
    static SHM: OnceLock<Shm> = OnceLock::new();
    SHM.get_or_init(|| {
        let path = std::env::temp_dir().join(format!("mesh-fuzz-ipc-{}", std::process::id()));
        let shm = Shm::create(&path, SHM_BYTES).expect("a temporary file for the stub's shared memory");
        shm.unlink_once();
        shm
    })
}

fuzz_target!(|data: &[u8]| {
    let shm = shm();
    let mut stream = data;
    // The node reads frames until the socket fails; so does this, until the input is used up.
    while let Ok((header, blob)) = ipc::read_frame(&mut stream) {
        for key in ["outputs", "inputs"] {
            for desc in header[key].as_array().map(|v| v.as_slice()).unwrap_or_default() {
                let _ = ipc::decode_tensor(shm, desc, &blob);
            }
        }
    }
});
