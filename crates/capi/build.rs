//! Build script: a `torch` build of the node needs libtorch at run time, so the library carries its path as rpath.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    // mesh-node (links = "mesh_node") passes on the libtorch directory torch-sys gave it.
    let Ok(lib) = std::env::var("DEP_MESH_NODE_LIBTORCH_LIB") else {
        return;
    };
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    if std::path::Path::new(&lib).join("libtorch_cuda.so").exists() {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,--as-needed");
    }
}
