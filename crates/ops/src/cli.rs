//! The `mesh-ops` command line: clap definitions and dispatch to the library's commands.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use mesh::cluster::certs::{LeafRequest, Role, DEFAULT_CA_DAYS, DEFAULT_LEAF_DAYS};
use mesh::cluster::crl::Reason;

use crate::revoke::DEFAULT_CRL_DAYS;
use crate::{certs, control, revoke, status};

/// The operator's tool for a mesh cluster.
#[derive(Debug, Parser)]
#[command(name = "mesh-ops", version, about)]
pub struct Cli {
    /// A header every request to the router carries, KEY=VALUE (repeatable): the key of the
    /// router's `--http-restricted-api` for the `cluster` and `model-repository` groups. The
    /// environment variable MESH_OPS_HEADER holds one, so the secret stays out of shell history.
    #[arg(
        long = "header",
        global = true,
        value_name = "KEY=VALUE",
        env = "MESH_OPS_HEADER",
        hide_env_values = true
    )]
    pub headers: Vec<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create the cluster CA, issue certificates for mutual TLS between routers and nodes, and revoke them.
    #[command(subcommand)]
    Certs(CertsCommand),
    /// Show the router's view of the cluster: nodes, models, placement and recent events.
    Status(StatusArgs),
    /// List the cluster repository's models: replicas ready and wanted, bounds, nodes.
    Models(StatusArgs),
    /// Place a model of the cluster repository (or place it again after a change); waits until a replica is ready.
    Load(LoadArgs),
    /// Remove a model from every node; waits until none holds it.
    Unload(ModelArgs),
    /// Change a model's replica bounds at run time (the autoscaler stays within them).
    Scale(ScaleArgs),
    /// Move every placed model off a node (each new replica ready before the old one goes), then tell it it may stop.
    Drain(DrainArgs),
    /// Roll a model out from its serving version to a candidate in steps of traffic share: start, pause, resume,
    /// promote, abort, or show it (stored with placement's intent; the split of requests is still to come).
    Rollout(RolloutArgs),
    /// Load-test a model over HTTP or gRPC and summarize throughput and latency.
    Bench(crate::bench::BenchArgs),
    /// Impair a link on purpose: a UDP relay with delay, jitter, loss, duplication, reordering and partitions.
    #[command(subcommand)]
    Chaos(crate::chaos::ChaosCommand),
}

/// Where the router is and how long to wait for it.
#[derive(Debug, Args)]
pub struct RouterArgs {
    /// The router's HTTP address.
    #[arg(long, env = "MESH_ROUTER", default_value = status::DEFAULT_ROUTER)]
    pub router: String,
    /// Seconds to wait for the router to finish (loads and drains wait for replicas).
    #[arg(long, default_value_t = 120.0)]
    pub timeout_secs: f64,
}

#[derive(Debug, Args)]
pub struct ModelArgs {
    pub model: String,
    #[command(flatten)]
    pub router: RouterArgs,
}

#[derive(Debug, Args)]
pub struct LoadArgs {
    pub model: String,
    /// A file with the model's config as JSON (Triton's config override), placed instead of config.pbtxt.
    #[arg(long)]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub router: RouterArgs,
}

#[derive(Debug, Args)]
pub struct ScaleArgs {
    pub model: String,
    /// Fewest replicas.
    #[arg(long)]
    pub min: Option<u32>,
    /// Most replicas.
    #[arg(long)]
    pub max: Option<u32>,
    #[command(flatten)]
    pub router: RouterArgs,
}

#[derive(Debug, Args)]
pub struct DrainArgs {
    pub node: String,
    #[command(flatten)]
    pub router: RouterArgs,
}

/// What `mesh-ops rollout MODEL ACTION` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RolloutAction {
    /// Start a rollout to --candidate.
    Start,
    /// Hold it at its step.
    Pause,
    /// Run it again from its step.
    Resume,
    /// Send every request that names no version to the candidate now.
    Promote,
    /// Stop it: the serving version serves every request again.
    Abort,
    /// Show it.
    Status,
}

#[derive(Debug, Args)]
pub struct RolloutArgs {
    pub model: String,
    pub action: RolloutAction,
    /// The version to roll out (start only), as Triton names its version directories: 2.
    #[arg(long, required_if_eq("action", "start"))]
    pub candidate: Option<String>,
    /// The version that serves now (start only; default: the newest the nodes serve, else the newest below the
    /// candidate).
    #[arg(long)]
    pub serving: Option<String>,
    /// The candidate's share at each step, in percent, rising to 100 (start only; default 5,25,50,100).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u8).range(1..=100))]
    pub steps: Option<Vec<u8>>,
    /// The least time a step runs before it advances, in seconds (start only; default 60).
    #[arg(long)]
    pub min_step_seconds: Option<u64>,
    /// The least requests the candidate answers in a step before it advances (start only; default 100).
    #[arg(long)]
    pub min_step_requests: Option<u64>,
    /// The requests each version must answer in a step before the guard judges it (start only; default 100).
    #[arg(long)]
    pub min_requests: Option<u64>,
    /// The largest rise of the candidate's error rate over the serving version's, 0..1 (start only; default 0.01).
    #[arg(long)]
    pub max_error_rate_increase: Option<f64>,
    /// The largest ratio of the candidate's p99 latency to the serving version's (start only; default 1.5).
    #[arg(long)]
    pub max_p99_ratio: Option<f64>,
    /// Percent of the serving version's requests also sent to the candidate as shadows, whose answers are
    /// compared and never returned (start only; default 0).
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub shadow: Option<u8>,
    /// Print the router's JSON instead of a line.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub router: RouterArgs,
}

impl RolloutArgs {
    /// The flags of a start, refused with any other action.
    fn start_flags(&self) -> anyhow::Result<Option<crate::rollout::StartFlags>> {
        let flags = crate::rollout::StartFlags {
            candidate: self.candidate.clone().unwrap_or_default(),
            serving: self.serving.clone(),
            steps: self.steps.clone(),
            min_step_seconds: self.min_step_seconds,
            min_step_requests: self.min_step_requests,
            min_requests: self.min_requests,
            max_error_rate_increase: self.max_error_rate_increase,
            max_p99_ratio: self.max_p99_ratio,
            shadow: self.shadow,
        };
        if self.action == RolloutAction::Start {
            return Ok(Some(flags));
        }
        if flags != crate::rollout::StartFlags::default() {
            anyhow::bail!("--candidate, --serving, --steps and the step and guard flags are for 'start' only");
        }
        Ok(None)
    }
}

fn wait_of(secs: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|t| !t.is_zero())
        .ok_or_else(|| anyhow::anyhow!("--timeout-secs must be a positive number of seconds"))
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
    /// Issue DIR/NAME.pem and DIR/NAME.key, signed by the CA in DIR, for one role.
    /// SANs: NAME, --dns, --ip, localhost, 127.0.0.1 and ::1.
    Issue {
        /// Directory holding ca.pem and ca.key.
        dir: PathBuf,
        /// The member's name (letters, digits, '-', '_', '.'); a node's name in the cluster.
        name: String,
        /// What the certificate is for: `router` (a router's cluster port), `node` (a node joining routers; its
        /// cluster name is NAME), `server` (another TLS server: HTTPS, gRPC, etcd) or `client` (another TLS
        /// client: a mutual-TLS client, a router reaching etcd). Each role has one extended key usage, so a
        /// node certificate cannot serve as a router and a router certificate cannot join as a node.
        #[arg(long)]
        role: Role,
        /// An extra DNS name the member is reached by (repeatable).
        #[arg(long = "dns", value_name = "NAME")]
        dns: Vec<String>,
        /// An extra IP address the member is reached at (repeatable).
        #[arg(long = "ip", value_name = "ADDR")]
        ip: Vec<IpAddr>,
        /// Days the certificate stays valid.
        #[arg(long, default_value_t = DEFAULT_LEAF_DAYS)]
        days: u32,
        /// Hours the certificate stays valid, instead of --days: a short-lived certificate, renewed (with --force)
        /// by a timer or CronJob before it expires; routers and nodes pick the renewed files up without a restart.
        #[arg(long, conflicts_with = "days", value_parser = clap::value_parser!(u32).range(1..=876_000))]
        hours: Option<u32>,
        /// Replace an existing certificate of that name.
        #[arg(long)]
        force: bool,
    },
    /// Revoke a certificate: adds it to DIR/crl.pem, the CA's revocation list (signed, numbered, written
    /// atomically). Routers and nodes that use the list refuse it at the handshake and cut its live links.
    Revoke {
        /// Directory holding ca.pem and ca.key.
        dir: PathBuf,
        /// A NAME (every certificate issued for it is revoked) or a SERIAL in hex, as `openssl x509 -noout
        /// -serial` prints it.
        #[arg(value_name = "NAME|SERIAL")]
        target: String,
        /// Why: key-compromise, superseded, cessation-of-operation, affiliation-changed, privilege-withdrawn,
        /// ca-compromise, certificate-hold or unspecified.
        #[arg(long)]
        reason: Option<Reason>,
        /// Days until the list is due for renewal (its next update); refresh it with `mesh-ops certs crl DIR`.
        #[arg(long, default_value_t = DEFAULT_CRL_DAYS)]
        crl_days: u32,
    },
    /// Write DIR/crl.pem again with the next number and a new next-update time (an empty list if there was none),
    /// and print it.
    Crl {
        /// Directory holding ca.pem and ca.key.
        dir: PathBuf,
        /// Only print the list; write nothing.
        #[arg(long)]
        show: bool,
        /// Days until the list is due for renewal (its next update).
        #[arg(long, default_value_t = DEFAULT_CRL_DAYS)]
        crl_days: u32,
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
    // Certificates need no router (nor its headers).
    let command = match cli.command {
        Command::Certs(command) => return certs(command),
        other => other,
    };
    crate::http::set_headers(&cli.headers).map_err(anyhow::Error::msg)?;
    match command {
        Command::Certs(command) => certs(command),
        Command::Status(args) => status::run(&args.router, args.json, wait_of(args.timeout_secs)?),
        Command::Models(args) => control::models(&args.router, args.json, wait_of(args.timeout_secs)?),
        Command::Load(a) => {
            let config = match &a.config {
                Some(path) => Some(
                    std::fs::read_to_string(path)
                        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?,
                ),
                None => None,
            };
            control::load(&a.router.router, &a.model, config, wait_of(a.router.timeout_secs)?)
        }
        Command::Unload(a) => control::unload(&a.router.router, &a.model, wait_of(a.router.timeout_secs)?),
        Command::Scale(a) => control::scale(
            &a.router.router,
            &a.model,
            a.min,
            a.max,
            wait_of(a.router.timeout_secs)?,
        ),
        Command::Drain(a) => control::drain(&a.router.router, &a.node, wait_of(a.router.timeout_secs)?),
        Command::Rollout(a) => {
            let (router, wait) = (&a.router.router, wait_of(a.router.timeout_secs)?);
            let body = match (a.start_flags()?, a.action) {
                (_, RolloutAction::Status) => return crate::rollout::status(router, &a.model, a.json, wait),
                (Some(start), _) => start.body(),
                (None, action) => {
                    let name = format!("{action:?}").to_ascii_lowercase();
                    serde_json::json!({ "action": name })
                }
            };
            crate::rollout::act(router, &a.model, &body, a.json, wait)
        }
        Command::Bench(args) => crate::bench::main(args),
        Command::Chaos(command) => crate::chaos::main(command),
    }
}

/// Runs a `mesh-ops certs` command; returns what to print.
pub fn certs(command: CertsCommand) -> anyhow::Result<String> {
    match command {
        CertsCommand::Init {
            dir,
            force,
            days,
            common_name,
        } => Ok(certs::init(&dir, &common_name, days, force)?.to_string()),
        CertsCommand::Issue {
            dir,
            name,
            role,
            dns,
            ip,
            days,
            hours,
            force,
        } => {
            let req = LeafRequest {
                name,
                role,
                dns_names: dns,
                ip_addrs: ip,
                days,
                lifetime: hours.map(|h| Duration::from_secs(u64::from(h) * 3600)),
            };
            Ok(certs::issue(&dir, &req, force)?.to_string())
        }
        CertsCommand::Revoke {
            dir,
            target,
            reason,
            crl_days,
        } => Ok(revoke::revoke(&dir, &target, reason, crl_days)?.to_string()),
        CertsCommand::Crl { dir, show, crl_days } => Ok(revoke::crl(&dir, crl_days, show)?.to_string()),
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
            "--role",
            "node",
            "--dns",
            "a.example",
            "--ip",
            "10.0.0.1",
        ])
        .expect("issue");
        match cli.command {
            Command::Certs(CertsCommand::Issue {
                dns, ip, days, role, ..
            }) => {
                assert_eq!(
                    (dns, ip.len(), days, role),
                    (vec!["a.example".to_string()], 1, DEFAULT_LEAF_DAYS, Role::Node)
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(
            Cli::try_parse_from(["mesh-ops", "certs", "issue", "d", "n", "--role", "node", "--ip", "nope"]).is_err()
        );
        let no_role = Cli::try_parse_from(["mesh-ops", "certs", "issue", "d", "n"]).expect_err("the role is required");
        assert!(no_role.to_string().contains("--role"), "{no_role}");
        let bad = Cli::try_parse_from(["mesh-ops", "certs", "issue", "d", "n", "--role", "admin"]).expect_err("role");
        assert!(
            bad.to_string().contains("one of: router, node, server, client"),
            "{bad}"
        );
        let cli = Cli::try_parse_from(["mesh-ops", "status", "--json"]).expect("status");
        assert!(matches!(cli.command, Command::Status(StatusArgs { json: true, .. })));
        let cli = Cli::try_parse_from(["mesh-ops", "scale", "m", "--min", "1", "--max", "3"]).expect("scale");
        assert!(matches!(
            cli.command,
            Command::Scale(ScaleArgs {
                min: Some(1),
                max: Some(3),
                ..
            })
        ));
        assert!(Cli::try_parse_from(["mesh-ops", "scale", "m", "--min", "-1"]).is_err());
        let cli = Cli::try_parse_from(["mesh-ops", "certs", "issue", "d", "n", "--role", "node", "--hours", "8"]);
        assert!(matches!(
            cli.expect("hours").command,
            Command::Certs(CertsCommand::Issue { hours: Some(8), .. })
        ));
        let both = [
            "mesh-ops", "certs", "issue", "d", "n", "--role", "node", "--hours", "8", "--days", "2",
        ];
        assert!(Cli::try_parse_from(both).is_err(), "--hours and --days together");
        assert!(
            Cli::try_parse_from(["mesh-ops", "certs", "issue", "d", "n", "--role", "node", "--hours", "0"]).is_err()
        );
        let cli = Cli::try_parse_from([
            "mesh-ops",
            "certs",
            "revoke",
            "d",
            "node-a",
            "--reason",
            "key-compromise",
        ]);
        assert!(matches!(
            cli.expect("revoke").command,
            Command::Certs(CertsCommand::Revoke { ref target, reason: Some(Reason::KeyCompromise), crl_days: DEFAULT_CRL_DAYS, .. })
                if target == "node-a"
        ));
        let bad =
            Cli::try_parse_from(["mesh-ops", "certs", "revoke", "d", "n", "--reason", "stolen"]).expect_err("reason");
        assert!(bad.to_string().contains("one of: key-compromise"), "{bad}");
        assert!(matches!(
            Cli::try_parse_from(["mesh-ops", "certs", "crl", "d", "--show"])
                .expect("crl")
                .command,
            Command::Certs(CertsCommand::Crl { show: true, .. })
        ));
        assert!(matches!(
            Cli::try_parse_from(["mesh-ops", "drain", "node-a"]).expect("drain").command,
            Command::Drain(DrainArgs { ref node, .. }) if node == "node-a"
        ));
    }

    fn rollout(args: &[&str]) -> Result<RolloutArgs, clap::Error> {
        let cli = Cli::try_parse_from(["mesh-ops", "rollout"].iter().chain(args))?;
        match cli.command {
            Command::Rollout(a) => Ok(a),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn rollout_takes_an_action_and_start_flags_only_with_start() {
        let a = rollout(&[
            "m",
            "start",
            "--candidate",
            "2",
            "--steps",
            "10,50,100",
            "--max-p99-ratio",
            "2",
        ])
        .unwrap();
        let start = a.start_flags().unwrap().expect("a start");
        assert_eq!(
            start.body(),
            serde_json::json!({"action": "start", "candidate": "2", "steps": [10, 50, 100], "max_p99_ratio": 2.0})
        );
        let e = rollout(&["m", "start"]).unwrap_err();
        assert!(e.to_string().contains("--candidate"), "{e}");
        assert!(rollout(&["m", "start", "--candidate", "2", "--steps", "0,100"]).is_err());
        assert!(rollout(&["m", "start", "--candidate", "2", "--steps", "5,101"]).is_err());
        assert!(rollout(&["m", "restart"]).is_err());
        let a = rollout(&["m", "pause"]).unwrap();
        assert_eq!((a.action, a.start_flags().unwrap()), (RolloutAction::Pause, None));
        let e = rollout(&["m", "abort", "--steps", "5,100"])
            .unwrap()
            .start_flags()
            .unwrap_err();
        assert!(e.to_string().contains("for 'start' only"), "{e}");
        let a = rollout(&["m", "status", "--json", "--router", "http://r:1"]).unwrap();
        assert!(a.json && a.router.router == "http://r:1");
    }
}
