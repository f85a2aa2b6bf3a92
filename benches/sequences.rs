//! The sequence table's cost per request as open sequences pile up (issue 52): no model, no server.
//!
//! Run: `cargo bench -p mesh-node --bench sequences -- [INSTANCES] [MILLIS_PER_POINT]` (default 2
//! instances, 300 ms measured per point). A model as the issue's: the oldest strategy's 131 072
//! slots per instance, 120 s idle timeout. For N open sequences (10 … 100 000, never ended, all
//! idle), it times (a) a START of a new sequence and (b) a request of an open one (not START),
//! each as a request passes the table: `try_begin`, then `finish`. The clock is fake: a fixed base
//! advancing 1 µs per operation, so nothing idles out. The STARTs are timed in batches that grow
//! the table by at most 10 % (at least 10), each batch ended (untimed) before the next.
use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh_node::serving::sequence::{Flags, SequenceId, SequenceSetup, Sequences};

const SIZES: [usize; 5] = [10, 100, 1_000, 10_000, 100_000];
/// Operations per point at most (keeps the fake clock far below the idle timeout).
const MAX_OPS: usize = 200_000;
/// Ids of measured STARTs, away from the open sequences' 1..=N.
const FRESH: u64 = 1 << 40;

struct Table {
    s: Sequences,
    now: Instant,
    instances: Vec<String>,
    /// Multiplicative congruential generator picking which open sequence a request goes to.
    rng: u64,
}

impl Table {
    fn tick(&mut self) -> Instant {
        self.now += Duration::from_micros(1);
        self.now
    }

    /// One request's passage: admitted, then finished (no state).
    fn request(&mut self, id: u64, start: bool, end: bool) {
        let now = self.tick();
        let flags = Flags {
            id: SequenceId::Int(id),
            start,
            end,
        };
        let instances: Vec<&str> = self.instances.iter().map(String::as_str).collect();
        let ticket = self
            .s
            .try_begin("m", &flags, &instances, now)
            .expect("admitted")
            .expect("a free slot");
        self.s.finish(&flags.id, &ticket, None, end, now);
    }

    fn pick(&mut self, open: usize) -> u64 {
        self.rng = self
            .rng
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.rng >> 33) % open as u64 + 1
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let instances: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(2);
    let budget = Duration::from_millis(args.get(1).and_then(|s| s.parse().ok()).unwrap_or(300));
    let setup = SequenceSetup {
        idle: Duration::from_secs(120),
        controls: Vec::new(),
        states: Vec::new(),
        iterative: false,
        slots: 131_072,
    };
    let mut t = Table {
        s: Sequences::new(Arc::new(setup)),
        now: Instant::now(),
        instances: (0..instances).map(|i| format!("i{i}")).collect(),
        rng: 0x2545_f491_4f6c_dd1d,
    };
    println!("{instances} instance(s), 131 072 slots each, idle 120 s, {budget:?} per point");
    println!();
    println!("| open sequences | START ns/op | request ns/op |");
    println!("|---:|---:|---:|");
    let mut open = 0usize;
    let mut fresh = FRESH;
    let mut rows = Vec::new();
    for n in SIZES {
        while open < n {
            open += 1;
            t.request(open as u64, true, false);
        }
        // (a) STARTs of new sequences, in batches ended between rounds.
        let batch = (n / 10).clamp(10, 1_000);
        let (mut spent, mut ops) = (Duration::ZERO, 0usize);
        while spent < budget && ops < MAX_OPS {
            let first = fresh;
            let began = Instant::now();
            for _ in 0..batch {
                t.request(fresh, true, false);
                fresh += 1;
            }
            spent += began.elapsed();
            ops += batch;
            for id in first..fresh {
                t.request(id, false, true);
            }
        }
        let start_ns = spent.as_secs_f64() * 1e9 / ops as f64;
        // (b) requests of open sequences.
        let (mut spent, mut ops) = (Duration::ZERO, 0usize);
        while spent < budget && ops < MAX_OPS {
            let ids: Vec<u64> = (0..1_000).map(|_| t.pick(open)).collect();
            let began = Instant::now();
            for &id in &ids {
                t.request(id, false, false);
            }
            spent += began.elapsed();
            ops += ids.len();
        }
        let request_ns = spent.as_secs_f64() * 1e9 / ops as f64;
        assert_eq!(t.s.len(t.now), open, "no sequence idled out or was lost");
        println!("| {n} | {start_ns:.0} | {request_ns:.0} |");
        rows.push((start_ns, request_ns));
    }
    let (first, last) = (rows[0], rows[rows.len() - 1]);
    println!();
    println!(
        "100 000 open / 10 open: START x{:.1}, request x{:.1}",
        last.0 / first.0,
        last.1 / first.1
    );
}
