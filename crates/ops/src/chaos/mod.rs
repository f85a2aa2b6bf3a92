//! `mesh-ops chaos relay`: a UDP relay that delays, jitters, drops, duplicates, reorders or blocks
//! the datagrams of a link pointed through it (this kernel has no netem), changed at run time by
//! commands on its standard input.
//!
//! Each client address (a node dialing the relay) gets its own upstream socket to the target, so
//! the target sees one peer per client, and answers go back to the client they belong to.
pub mod policy;

use mesh::sync::Locked;
use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::io::AsyncBufReadExt;
use tokio::net::UdpSocket;

use policy::{Chaos, Direction, Impairment};

/// The largest datagram relayed (QUIC's are at most 1472 bytes on this link; this is any UDP).
const MAX_DATAGRAM: usize = 65_535;
/// Most distinct clients at once (each costs a socket).
const MAX_CLIENTS: usize = 256;

#[derive(Debug, Clone, clap::Args)]
#[command(
    after_help = "Commands on standard input, one per line, each answered on standard output:\n  \
    set [up|down] delay_ms=N jitter_ms=N drop=P duplicate=P reorder=P\n  block up|down|both\n  unblock\n  \
    stats\nUp is client to target, down is target to client."
)]
pub struct RelayArgs {
    /// Where clients send datagrams (e.g. what a node's --cluster-join names).
    #[arg(long)]
    pub listen: SocketAddr,
    /// Where they are relayed to (e.g. a router's cluster port).
    #[arg(long)]
    pub target: SocketAddr,
    /// Delay of every datagram, both ways, in ms.
    #[arg(long, default_value_t = 0)]
    pub delay_ms: u64,
    /// Random extra delay of up to this, in ms.
    #[arg(long, default_value_t = 0)]
    pub jitter_ms: u64,
    /// Probability that a datagram is lost.
    #[arg(long, default_value_t = 0.0)]
    pub drop: f64,
    /// Probability that a datagram is delivered twice.
    #[arg(long, default_value_t = 0.0)]
    pub duplicate: f64,
    /// Probability that a datagram is held back so later ones overtake it.
    #[arg(long, default_value_t = 0.0)]
    pub reorder: f64,
    /// Seed of the random choices (default: random; printed either way, to replay a run).
    #[arg(long)]
    pub seed: Option<u64>,
}

#[derive(Debug, clap::Subcommand)]
pub enum ChaosCommand {
    /// Relay UDP between clients and a target with impairments (see its --help for run-time commands).
    Relay(RelayArgs),
}

impl RelayArgs {
    fn impairment(&self) -> Result<Impairment, String> {
        let imp = Impairment {
            delay: Duration::from_millis(self.delay_ms),
            jitter: Duration::from_millis(self.jitter_ms),
            drop: self.drop,
            duplicate: self.duplicate,
            reorder: self.reorder,
            blocked: false,
        };
        imp.validate()?;
        Ok(imp)
    }
}

struct Shared {
    chaos: Mutex<Chaos>,
    rng: Mutex<StdRng>,
    seed: u64,
}

impl Shared {
    fn decide(&self, dir: Direction) -> Vec<Instant> {
        let mut rng = self.rng.locked();
        let mut chaos = self.chaos.locked();
        chaos.decide(dir, Instant::now(), &mut *rng)
    }
}

/// Sends `bytes` at each of `times` (a datagram lost: no time; duplicated: two).
fn deliver(socket: Arc<UdpSocket>, to: SocketAddr, bytes: Arc<[u8]>, times: Vec<Instant>) {
    for at in times {
        let (socket, bytes) = (socket.clone(), bytes.clone());
        if at <= Instant::now() {
            let _ = socket.try_send_to(&bytes, to);
            continue;
        }
        tokio::spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            let _ = socket.send_to(&bytes, to).await;
        });
    }
}

/// Relays one client's answers from the target back to it.
async fn downstream(upstream: Arc<UdpSocket>, listen: Arc<UdpSocket>, client: SocketAddr, shared: Arc<Shared>) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    while let Ok(n) = upstream.recv(&mut buf).await {
        let times = shared.decide(Direction::Down);
        deliver(listen.clone(), client, Arc::from(&buf[..n]), times);
    }
}

async fn relay(args: RelayArgs, shared: Arc<Shared>) -> Result<(), String> {
    let listen = Arc::new(
        UdpSocket::bind(args.listen)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?,
    );
    let at = listen
        .local_addr()
        .map_err(|e| format!("cannot read the relay's address: {e}"))?;
    println!("relay {at} -> {} seed={}", args.target, shared.seed);
    let _ = std::io::stdout().flush();
    let bind_any: SocketAddr = if args.target.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }
        .parse()
        .expect("a socket address");
    let mut clients: HashMap<SocketAddr, Arc<UdpSocket>> = HashMap::new();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let (n, from) = match listen.recv_from(&mut buf).await {
            Ok(v) => v,
            // An ICMP error of an earlier send (a client went away) is not the relay's end.
            Err(_) => continue,
        };
        let upstream = match clients.get(&from) {
            Some(u) => u.clone(),
            None => {
                if clients.len() >= MAX_CLIENTS {
                    continue;
                }
                let u = UdpSocket::bind(bind_any)
                    .await
                    .map_err(|e| format!("cannot open a socket toward {}: {e}", args.target))?;
                u.connect(args.target)
                    .await
                    .map_err(|e| format!("cannot reach {}: {e}", args.target))?;
                let u = Arc::new(u);
                tokio::spawn(downstream(u.clone(), listen.clone(), from, shared.clone()));
                clients.insert(from, u.clone());
                u
            }
        };
        let times = shared.decide(Direction::Up);
        deliver(upstream, args.target, Arc::from(&buf[..n]), times);
    }
}

/// Reads commands from standard input and answers each on standard output.
async fn control(shared: Arc<Shared>) {
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let answer = shared.chaos.locked().command(&line);
        let mut out = std::io::stdout();
        let _ = match answer {
            Ok(text) if text.is_empty() => Ok(()),
            Ok(text) => writeln!(out, "{text}"),
            Err(e) => writeln!(out, "error: {e}"),
        };
        let _ = out.flush();
    }
}

/// Runs the relay until it is killed (its standard input closing does not stop it).
pub fn main(command: ChaosCommand) -> ! {
    let ChaosCommand::Relay(args) = command;
    let code = match run(args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("mesh-ops chaos: {e}");
            2
        }
    };
    std::process::exit(code)
}

fn run(args: RelayArgs) -> Result<(), String> {
    let imp = args.impairment()?;
    let seed = args.seed.unwrap_or_else(rand::random);
    let shared = Arc::new(Shared {
        chaos: Mutex::new(Chaos {
            up: imp,
            down: imp,
            ..Default::default()
        }),
        rng: Mutex::new(StdRng::seed_from_u64(seed)),
        seed,
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    runtime.block_on(async move {
        tokio::spawn(control(shared.clone()));
        relay(args, shared).await
    })
}
