//! mesh-ops binary: parses the command line, runs it, prints the result or the error (exit code 1).
use clap::Parser;

fn main() {
    match mesh_ops::cli::run(mesh_ops::cli::Cli::parse()) {
        Ok(text) => println!("{text}"),
        Err(e) => {
            eprintln!("mesh-ops: {e:#}");
            std::process::exit(1);
        }
    }
}
