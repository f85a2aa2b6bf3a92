//! The `mesh-ops` command line: clap definitions and dispatch to the library's commands.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use mesh::cluster::certs::{LeafRequest, DEFAULT_CA_DAYS, DEFAULT_LEAF_DAYS};

use crate::{certs, status};

/// The operator's tool for a mesh cluster.
#[derive(Debug, Parser)]
#[command(name = "mesh-ops", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create the cluster CA and issue certificates for mutual TLS between routers and nodes.
    #[command(subcommand)]
    Certs(CertsCommand),
    /// Show the router's view of the cluster: nodes and models.
    Status(StatusArgs),
    /// Load-test a model over HTTP or gRPC and summarize throughput and latency.
    Bench(crate::bench::BenchArgs),
}

#[derive(Debug, Subcommand)]
pub enum CertsCommand {
    /// Create a cluster CA: DIR/ca.pem (give it to every member) and DIR/ca.key (keep it private).
    Init {
        /// Directory to write into (created if needed).
        dir: PathBuf,
        /// Replace an existing CA (every certificate it issued stops being accepted).
        #[arg(long)]
        force: bool,
        /// Days the CA stays valid.
        #[arg(long, default_value_t = DEFAULT_CA_DAYS)]
        days: u32,
        /// The CA's common name.
        #[arg(long, default_value = certs::DEFAULT_CA_NAME)]
        common_name: String,
    },
    /// Issue DIR/NAME.pem and DIR/NAME.key, signed by the CA in DIR; valid for serving and as a client.
    /// SANs: NAME, --dns, --ip, localhost, 127.0.0.1 and ::1.
    Issue {
        /// Directory holding ca.pem and ca.key.
        dir: PathBuf,
        /// The member's name (letters, digits, '-', '_', '.').
        name: String,
        /// An extra DNS name the member is reached by (repeatable).
        #[arg(long = "dns", value_name = "NAME")]
        dns: Vec<String>,
        /// An extra IP address the member is reached at (repeatable).
        #[arg(long = "ip", value_name = "ADDR")]
        ip: Vec<IpAddr>,
        /// Days the certificate stays valid.
        #[arg(long, default_value_t = DEFAULT_LEAF_DAYS)]
        days: u32,
        /// Replace an existing certificate of that name.
        #[arg(long)]
        force: bool,
    },
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The router's HTTP address.
    #[arg(long, env = "MESH_ROUTER", default_value = status::DEFAULT_ROUTER)]
    pub router: String,
    /// Print the router's JSON as received (pretty-printed) instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Seconds to wait for the router to connect and answer.
    #[arg(long, default_value_t = 5.0)]
    pub timeout_secs: f64,
}

/// Runs a parsed command line; returns what to print.
pub fn run(cli: Cli) -> anyhow::Result<String> {
    match cli.command {
        Command::Certs(CertsCommand::Init {
            dir,
            force,
            days,
            common_name,
        }) => Ok(certs::init(&dir, &common_name, days, force)?.to_string()),
        Command::Certs(CertsCommand::Issue {
            dir,
            name,
            dns,
            ip,
            days,
            force,
        }) => {
            let req = LeafRequest {
                name,
                dns_names: dns,
                ip_addrs: ip,
                days,
            };
            Ok(certs::issue(&dir, &req, force)?.to_string())
        }
        Command::Status(args) => {
            let timeout = Duration::try_from_secs_f64(args.timeout_secs)
                .ok()
                .filter(|t| !t.is_zero())
                .ok_or_else(|| anyhow::anyhow!("--timeout-secs must be a positive number of seconds"))?;
            status::run(&args.router, args.json, timeout)
        }
        Command::Bench(args) => crate::bench::main(args),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn command_line_is_consistent_and_parses() {
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from([
            "mesh-ops",
            "certs",
            "issue",
            "d",
            "n",
            "--dns",
            "a.example",
            "--ip",
            "10.0.0.1",
        ])
        .expect("issue");
        match cli.command {
            Command::Certs(CertsCommand::Issue { dns, ip, days, .. }) => {
                assert_eq!(
                    (dns, ip.len(), days),
                    (vec!["a.example".to_string()], 1, DEFAULT_LEAF_DAYS)
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(Cli::try_parse_from(["mesh-ops", "certs", "issue", "d", "n", "--ip", "nope"]).is_err());
        let cli = Cli::try_parse_from(["mesh-ops", "status", "--json"]).expect("status");
        assert!(matches!(cli.command, Command::Status(StatusArgs { json: true, .. })));
    }
}
