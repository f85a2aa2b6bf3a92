//! tritonserver's getopt_long rule for flag values on the binaries' clap command lines: a flag that
//! needs a value takes the next argument as it, even one that begins with `-` (`--trace-count -1`).
use std::fmt::Debug;

use clap::error::ErrorKind;
use clap::{Arg, Command, Parser};

/// Lets a flag that needs a value take the next argument whatever it begins with, as getopt_long
/// does for an option with a required argument; applied to every flag of a binary with
/// `#[command(mut_args = mesh::getopt::value_may_begin_with_dash)]`.
///
/// Flags that take no value are left alone, and so are flags whose value is optional
/// (`num_args = 0..=1`, such as `--grpc-use-ssl`): a dash-leading argument after them is the next
/// flag, never their value, so `--grpc-use-ssl --grpc-server-cert PATH` keeps meaning two flags
/// (their values are booleans, and no boolean begins with `-`).
pub fn value_may_begin_with_dash(arg: Arg) -> Arg {
    let optional = arg.get_num_args().is_some_and(|n| n.min_values() == 0);
    if arg.get_long().is_some() && arg.get_action().takes_values() && !optional {
        arg.allow_hyphen_values(true)
    } else {
        arg
    }
}

/// Dash-leading values every value-taking flag is tried with by [`check_dash_values`]: a negative
/// number and a word.
pub const DASH_VALUES: [&str; 2] = ["-1", "-x"];

/// What [`check_dash_values`] found: the flags it tried (each long name and alias, with `--`), and
/// the ones that broke the rule, each with why.
#[derive(Debug, Default)]
pub struct DashValueReport {
    pub required: Vec<String>,
    pub optional: Vec<String>,
    pub failures: Vec<String>,
}

/// Parses `base` + `extra` as `T`'s command line: the parsed flags' debug text, or the error's kind
/// and text.
fn parse<T: Parser + Debug>(base: &[&str], extra: &[&str]) -> Result<String, (ErrorKind, String)> {
    let argv = std::iter::once("prog")
        .chain(base.iter().copied())
        .chain(extra.iter().copied());
    T::try_parse_from(argv)
        .map(|t| format!("{t:?}"))
        .map_err(|e| (e.kind(), e.to_string()))
}

/// Walks every flag of `T` (so a flag added later is covered too) and checks the getopt rule:
/// a flag that needs a value takes `--flag -1` and `--flag -x` exactly as `--flag=-1` and
/// `--flag=-x` (the same flags parsed, or the same refusal of the value), given twice as well; at
/// the end of the line without its value it is refused with a message naming it; a flag whose
/// value is optional swallows no flag after it. `base` makes a valid command line on its own.
/// For the binaries' tests.
pub fn check_dash_values<T: Parser + Debug>(base: &[&str]) -> DashValueReport {
    let mut report = DashValueReport::default();
    let mut cmd: Command = T::command();
    cmd.build();
    // (name given, the flag's long name, value optional, takes dash-leading values)
    let flags: Vec<(String, String, bool, bool)> = cmd
        .get_arguments()
        .filter(|a| a.get_action().takes_values() && a.get_long().is_some())
        .flat_map(|a| {
            let optional = a.get_num_args().is_some_and(|n| n.min_values() == 0);
            let long = a.get_long().unwrap_or_default();
            let names = std::iter::once(long).chain(a.get_all_aliases().unwrap_or_default());
            let hyphen = a.is_allow_hyphen_values_set();
            names
                .map(move |n| (format!("--{n}"), format!("--{long}"), optional, hyphen))
                .collect::<Vec<_>>()
        })
        .collect();
    for (flag, long, optional, hyphen) in flags {
        let mut fail = |why: String| report.failures.push(format!("{flag}: {why}"));
        if optional {
            if hyphen {
                fail("its value is optional, yet it would take the next flag as its value".into());
            }
            let before = parse::<T>(&[], &[&[flag.as_str()][..], base].concat());
            let after = parse::<T>(base, &[&flag]);
            if before != after || before.is_err() {
                fail(format!(
                    "given before other flags it changes them: {before:?} vs {after:?}"
                ));
            }
            report.optional.push(flag);
            continue;
        }
        if !hyphen {
            fail("a value beginning with '-' is not taken as its value".into());
        }
        for value in DASH_VALUES {
            let joined = format!("{flag}={value}");
            let attached = parse::<T>(base, &[&joined]);
            let separate = parse::<T>(base, &[&flag, value]);
            if attached != separate {
                fail(format!(
                    "`{flag} {value}` gives {separate:?} but `{joined}` gives {attached:?}"
                ));
            }
            if let Err((ErrorKind::UnknownArgument, e)) = &separate {
                fail(format!("`{flag} {value}` reads the value as a flag: {e}"));
            }
            let twice = parse::<T>(base, &[&flag, value, &flag, value]);
            if twice != parse::<T>(base, &[&joined, &joined]) {
                fail(format!(
                    "`{flag} {value}` given twice differs from `{joined}` twice: {twice:?}"
                ));
            }
        }
        match parse::<T>(base, &[&flag]) {
            // clap names the flag by its long name, also when an alias was given.
            Err((_, e)) if e.contains(&format!("'{long} <")) && e.contains("value is required") => {}
            other => fail(format!("without its value at the end of the line: {other:?}")),
        }
        report.required.push(flag);
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Parser)]
    #[command(mut_args = value_may_begin_with_dash)]
    struct Cli {
        #[arg(long)]
        count: Option<i64>,
        #[arg(long)]
        port: Option<u16>,
        #[arg(long, alias = "store")]
        path: Vec<String>,
        #[arg(long, value_delimiter = ',')]
        gpus: Vec<i32>,
        #[arg(long, num_args = 0..=1, default_value_t = false, default_missing_value = "true",
              action = clap::ArgAction::Set)]
        ssl: bool,
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
        strict: bool,
        #[arg(long)]
        dev: bool,
    }

    fn cli(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
    }

    #[test]
    fn a_value_may_begin_with_a_dash_in_both_forms() {
        let c = cli(&[
            "--count",
            "-1",
            "--path",
            "-a",
            "--store=-b",
            "--gpus",
            "-1,0",
            "--strict",
            "false",
        ])
        .unwrap();
        assert_eq!(c.count, Some(-1));
        assert_eq!(c.path, ["-a", "-b"]);
        assert_eq!(c.gpus, [-1, 0]);
        assert!(!c.strict);
        // getopt takes whatever follows as the value, a flag's name included.
        assert_eq!(cli(&["--path", "--dev"]).unwrap().path, ["--dev"]);
        assert!(!cli(&["--path", "--dev"]).unwrap().dev);
        // A value the type refuses is refused as that flag's value, not read as an unknown flag.
        let e = cli(&["--port", "-1"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ValueValidation);
        assert!(e.to_string().contains("'-1' for '--port"), "{e}");
    }

    #[test]
    fn a_missing_value_is_refused_naming_the_flag() {
        let e = cli(&["--dev", "--count"]).unwrap_err();
        assert!(e.to_string().contains("'--count <COUNT>'"), "{e}");
        assert!(e.to_string().contains("value is required"), "{e}");
    }

    #[test]
    fn an_optional_value_takes_no_flag_after_it() {
        let c = cli(&["--ssl", "--count", "-1"]).unwrap();
        assert!(c.ssl);
        assert_eq!(c.count, Some(-1));
        assert!(!cli(&["--ssl", "false"]).unwrap().ssl);
        assert!(cli(&["--ssl=false"]).is_ok_and(|c| !c.ssl));
    }

    #[test]
    fn the_walk_covers_every_value_taking_flag_and_alias() {
        let report = check_dash_values::<Cli>(&["--dev"]);
        assert!(report.failures.is_empty(), "{:#?}", report.failures);
        assert_eq!(
            report.required,
            ["--count", "--port", "--path", "--store", "--gpus", "--strict"]
        );
        assert_eq!(report.optional, ["--ssl"]);
    }

    #[derive(Debug, Parser)]
    struct Plain {
        #[arg(long)]
        count: Option<i64>,
    }

    #[test]
    fn the_walk_reports_a_flag_without_the_rule() {
        let report = check_dash_values::<Plain>(&[]);
        assert_eq!(report.required, ["--count"]);
        assert!(
            report
                .failures
                .iter()
                .any(|f| f.starts_with("--count: a value beginning with '-'")),
            "{:#?}",
            report.failures
        );
    }
}
