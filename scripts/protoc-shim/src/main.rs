//! A protoc command line over protox: the arguments prost-build passes (`-I`, `-o`,
//! `--include_imports`, `--include_source_info`, files) and their `--flag=value` forms; anything else
//! is refused by name, so a build that needs more of protoc fails saying what it asked for.
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Default, PartialEq)]
struct Args {
    includes: Vec<PathBuf>,
    out: Option<PathBuf>,
    imports: bool,
    source_info: bool,
    files: Vec<PathBuf>,
    version: bool,
}

fn parse(argv: impl IntoIterator<Item = String>) -> Result<Args, String> {
    let mut args = Args::default();
    let mut it = argv.into_iter();
    while let Some(a) = it.next() {
        let mut value = |flag: &str, inline: Option<&str>| -> Result<PathBuf, String> {
            match inline {
                Some(v) if !v.is_empty() => Ok(PathBuf::from(v)),
                _ => it
                    .next()
                    .map(PathBuf::from)
                    .ok_or_else(|| format!("{flag} needs a value")),
            }
        };
        match a.as_str() {
            "--version" => args.version = true,
            "--include_imports" => args.imports = true,
            "--include_source_info" => args.source_info = true,
            "-I" | "--proto_path" => args.includes.push(value(&a, None)?),
            "-o" | "--descriptor_set_out" => args.out = Some(value(&a, None)?),
            _ if a.starts_with("--proto_path=") => args
                .includes
                .push(value("--proto_path", a.split_once('=').map(|p| p.1))?),
            _ if a.starts_with("--descriptor_set_out=") => {
                args.out = Some(value("--descriptor_set_out", a.split_once('=').map(|p| p.1))?)
            }
            _ if a.starts_with("-I") => args.includes.push(PathBuf::from(&a[2..])),
            _ if a.starts_with("-o") => args.out = Some(PathBuf::from(&a[2..])),
            _ if a.starts_with('-') => {
                return Err(format!(
                    "mesh-protoc: unsupported option {a} (only descriptor sets are made)"
                ))
            }
            _ => args.files.push(PathBuf::from(a)),
        }
    }
    Ok(args)
}

fn run(args: Args) -> Result<(), String> {
    if args.version {
        println!("libprotoc 3.21.12 (mesh-protoc over protox 0.10)");
        return Ok(());
    }
    let out = args
        .out
        .ok_or("mesh-protoc: -o FILE is required (only descriptor sets are made)")?;
    if args.files.is_empty() {
        return Err("mesh-protoc: no input files".into());
    }
    let includes = if args.includes.is_empty() {
        vec![PathBuf::from(".")]
    } else {
        args.includes
    };
    let mut compiler = protox::Compiler::new(includes).map_err(|e| format!("{e:?}"))?;
    compiler
        .include_imports(args.imports)
        .include_source_info(args.source_info);
    compiler.open_files(&args.files).map_err(|e| format!("{e:?}"))?;
    std::fs::write(&out, compiler.encode_file_descriptor_set()).map_err(|e| format!("writing {}: {e}", out.display()))
}

fn main() -> ExitCode {
    match parse(std::env::args().skip(1)).and_then(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(v: &[&str]) -> Result<Args, String> {
        parse(v.iter().map(|s| s.to_string()))
    }

    #[test]
    fn prost_build_arguments() {
        let a = p(&[
            "--include_imports",
            "--include_source_info",
            "-o",
            "/t/set",
            "-I",
            "proto",
            "-Iinc",
            "proto/a.proto",
        ])
        .unwrap();
        assert_eq!(a.includes, [PathBuf::from("proto"), PathBuf::from("inc")]);
        assert_eq!(a.out, Some(PathBuf::from("/t/set")));
        assert!(a.imports && a.source_info);
        assert_eq!(a.files, [PathBuf::from("proto/a.proto")]);
    }

    #[test]
    fn other_options_are_refused_by_name() {
        let e = p(&["--rust_out=x", "a.proto"]).unwrap_err();
        assert!(e.contains("--rust_out=x"), "{e}");
        assert!(p(&["-o"]).unwrap_err().contains("needs a value"));
    }

    #[test]
    fn compiles_with_well_known_types() {
        let dir = std::env::temp_dir().join(format!("mesh-protoc-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("p")).unwrap();
        std::fs::write(
            dir.join("p/x.proto"),
            "syntax = \"proto3\";\nimport \"google/protobuf/descriptor.proto\";\nmessage X { google.protobuf.FileDescriptorProto f = 1; }\n",
        )
        .unwrap();
        let out = dir.join("set");
        let args = Args {
            includes: vec![dir.join("p")],
            out: Some(out.clone()),
            imports: true,
            source_info: true,
            files: vec![dir.join("p/x.proto")],
            version: false,
        };
        run(args).unwrap();
        let set: prost_types_like::Set = prost::Message::decode(&*std::fs::read(&out).unwrap()).unwrap();
        assert!(set
            .file
            .iter()
            .any(|f| f.name.as_deref() == Some("google/protobuf/descriptor.proto")));
        assert!(set.file.iter().any(|f| f.name.as_deref() == Some("x.proto")));
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Just enough of FileDescriptorSet to read the file names back.
    mod prost_types_like {
        #[derive(Clone, PartialEq, prost::Message)]
        pub struct Set {
            #[prost(message, repeated, tag = "1")]
            pub file: Vec<File>,
        }
        #[derive(Clone, PartialEq, prost::Message)]
        pub struct File {
            #[prost(string, optional, tag = "1")]
            pub name: Option<String>,
        }
    }
}
