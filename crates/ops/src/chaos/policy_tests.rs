//! Tests of the relay's decisions with a seeded random source (no sockets, no clock).
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::SeedableRng;

use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Decides `n` datagrams Up at `t0`; returns every delivery time.
fn run(chaos: &mut Chaos, n: usize, seed: u64, t0: Instant) -> Vec<Vec<Instant>> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| chaos.decide(Direction::Up, t0, &mut rng)).collect()
}

#[test]
fn a_clean_relay_delivers_everything_at_once() {
    let t0 = Instant::now();
    let mut c = Chaos::default();
    let out = run(&mut c, 100, 1, t0);
    assert!(out.iter().all(|at| at == &vec![t0]));
    assert_eq!(c.counts.received, 100);
    assert_eq!(c.stats(), "received=100 dropped=0 blocked=0 duplicated=0 reordered=0");
}

#[test]
fn delay_and_jitter_bound_every_delivery() {
    let t0 = Instant::now();
    let mut c = Chaos::default();
    c.command("set delay_ms=20 jitter_ms=10").unwrap();
    let out = run(&mut c, 1000, 2, t0);
    let waits: Vec<Duration> = out.iter().map(|at| at[0] - t0).collect();
    assert!(waits.iter().all(|w| *w >= ms(20) && *w <= ms(30)), "{waits:?}");
    assert!(
        waits.iter().any(|w| *w > ms(25)) && waits.iter().any(|w| *w < ms(25)),
        "jitter spreads them"
    );
}

#[test]
fn drop_duplicate_and_reorder_happen_at_about_their_rates_and_replay_by_seed() {
    let t0 = Instant::now();
    let mut c = Chaos::default();
    c.command("set up drop=0.2 duplicate=0.1 reorder=0.1 delay_ms=5")
        .unwrap();
    let out = run(&mut c, 10_000, 3, t0);
    let k = c.counts;
    assert!((1_700..2_300).contains(&k.dropped), "{k:?}");
    assert_eq!(out.iter().filter(|a| a.is_empty()).count() as u64, k.dropped);
    assert!((600..1_000).contains(&k.duplicated), "{k:?}");
    assert_eq!(out.iter().filter(|a| a.len() == 2).count() as u64, k.duplicated);
    assert!((600..1_000).contains(&k.reordered), "{k:?}");
    // A held-back datagram arrives after one sent with it that was not.
    assert!(out.iter().any(|a| a.first().is_some_and(|t| *t - t0 >= ms(10))));
    // The same seed gives the same run.
    let mut again = Chaos::default();
    again
        .command("set up drop=0.2 duplicate=0.1 reorder=0.1 delay_ms=5")
        .unwrap();
    assert_eq!(run(&mut again, 10_000, 3, t0), out);
    // Down was not touched.
    let mut rng = StdRng::seed_from_u64(4);
    assert_eq!(c.decide(Direction::Down, t0, &mut rng), vec![t0]);
}

#[test]
fn blocking_one_direction_is_a_partition_of_that_direction_only() {
    let t0 = Instant::now();
    let mut c = Chaos::default();
    let mut rng = StdRng::seed_from_u64(5);
    assert_eq!(c.command("block up").unwrap(), "ok blocked up");
    assert!(c.decide(Direction::Up, t0, &mut rng).is_empty());
    assert_eq!(c.decide(Direction::Down, t0, &mut rng), vec![t0]);
    c.command("block both").unwrap();
    assert!(c.decide(Direction::Down, t0, &mut rng).is_empty());
    assert_eq!(c.counts.blocked, 2);
    c.command("unblock").unwrap();
    assert_eq!(c.decide(Direction::Up, t0, &mut rng), vec![t0]);
}

#[test]
fn bad_commands_are_clear_errors_and_change_nothing() {
    let mut c = Chaos::default();
    c.command("set delay_ms=7").unwrap();
    for (line, why) in [
        ("set drop=1.5", "probability"),
        ("set drop=x", "not a number"),
        ("set delay_ms=-1", "whole number"),
        ("set color=red", "unknown setting"),
        ("set", "KEY=VALUE"),
        ("set up", "KEY=VALUE"),
        ("set delay_ms", "not KEY=VALUE"),
        ("block sideways", "up, down or both"),
        ("explode", "unknown command"),
    ] {
        let e = c.command(line).unwrap_err();
        assert!(e.contains(why), "{line}: {e}");
    }
    assert_eq!(c.up.delay, ms(7));
    assert_eq!(c.up.drop, 0.0);
    assert_eq!(c.command("").unwrap(), "");
}
