//! mesh-ops binary.
fn main() {}
