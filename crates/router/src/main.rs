//! mesh-router binary.
fn main() {}
