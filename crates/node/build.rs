//! Build script: gives a `torch` build its libtorch's path as rpath and keeps libtorch_cuda linked.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    // torch-sys (links = "tch") exports its libtorch directory when the `torch` feature pulls it in.
    let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") else {
        return;
    };
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    // Passed on to dependents (`links = "mesh_node"`): libtritonserver.so needs the same rpath.
    println!("cargo:libtorch_lib={lib}");
    if std::path::Path::new(&lib).join("libtorch_cuda.so").exists() {
        // Nothing calls into libtorch_cuda directly, so the linker would drop it and torch would
        // see no CUDA device (tch-rs #980).
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,--as-needed");
    }
}
