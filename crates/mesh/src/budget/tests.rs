//! Tests of the fair budget: the rule on its own, and floods simulated against it.
use std::net::SocketAddr;

use super::*;
use crate::error::Code;

fn conn(port: u16) -> Client {
    Client::Connection(SocketAddr::from(([127, 0, 0, 1], port)))
}

const FLAG: &str = "--max-inflight-bytes";

#[test]
fn admits_up_to_the_limit_and_releases_on_drop() {
    let b = FairBudget::new(100, 0, FLAG);
    let a = b.admit("m", Client::Local, 60).unwrap();
    let c = b.admit("m", Client::Local, 40).unwrap();
    let e = b.admit("m", Client::Local, 1).expect_err("over the limit");
    // Busy, not broken: a router may send it to another node, since it never ran.
    assert_eq!(e.code, Code::Overloaded);
    assert!(e.message.contains("--max-inflight-bytes 100"), "{}", e.message);
    assert_eq!(b.used(), 100, "a refused request must not hold bytes");
    drop(a);
    assert_eq!(b.used(), 40);
    let _d = b.admit("m", Client::Local, 60).unwrap();
    drop(c);
    assert_eq!(b.used(), 60);
}

#[test]
fn a_request_larger_than_the_budget_says_so() {
    let b = FairBudget::new(10, 1, FLAG);
    let e = b.admit("m", Client::Local, 11).expect_err("too large");
    assert_eq!(e.code, Code::Unavailable);
    assert!(e.message.contains("larger than the in-flight budget"), "{}", e.message);
    assert_eq!(b.used(), 0);
}

#[test]
fn a_party_alone_fills_the_pool_but_not_the_reserve() {
    let mut s = Shares::new(800, 100, FLAG);
    while s.admit("flood", conn(1), 10).is_ok() {}
    assert_eq!(s.used(), 700, "the pool is first come, the reserve is not");
    let e = s.admit("flood", conn(1), 10).unwrap_err();
    assert_eq!(e.code, Code::Overloaded);
    assert!(
        e.message.contains("model 'flood' from client 127.0.0.1:1"),
        "{}",
        e.message
    );
    assert!(e.message.contains("past its fair share of 200 bytes"), "{}", e.message);
    assert!(e.message.contains("last 100 bytes"), "{}", e.message);
}

#[test]
fn another_model_finds_the_reserve_while_one_floods() {
    let mut s = Shares::new(800, 100, FLAG);
    while s.admit("flood", conn(1), 10).is_ok() {}
    // Two models active: the newcomer's model's share is 800 / 3, its client's 800 / 3 / 2.
    assert_eq!(s.shares("other", conn(2)), (266, 133));
    for _ in 0..10 {
        s.admit("other", conn(2), 10)
            .expect("the reserve is for those under their share");
    }
    assert_eq!(s.used(), 800);
    assert!(s.admit("other", conn(2), 10).is_err(), "nobody passes the limit");
}

#[test]
fn another_client_of_the_flooded_model_finds_the_first_half_of_the_reserve() {
    let mut s = Shares::new(800, 100, FLAG);
    while s.admit("m", conn(1), 10).is_ok() {}
    for _ in 0..5 {
        s.admit("m", conn(2), 10)
            .expect("a second client of the same model is under its share");
    }
    let e = s.admit("m", conn(2), 10).unwrap_err();
    assert!(e.message.contains("model 'm' holds 750 bytes"), "{}", e.message);
    assert!(s.admit("m", conn(1), 10).is_err(), "the flooder stays refused");
    s.admit("other", conn(3), 10)
        .expect("the second half is kept for models under their share");
}

#[test]
fn late_connections_of_a_flooded_model_leave_the_second_half_to_other_models() {
    let mut s = Shares::new(16_000, 2_000, FLAG);
    // The first connections take the pool; the later ones, under their share, the first half.
    for port in 1..=16 {
        for _ in 0..100 {
            let _ = s.admit("flood", conn(port), 100);
        }
    }
    assert!(s.used() <= 15_000, "the flood took the second half: {}", s.used());
    for _ in 0..10 {
        s.admit("other", conn(99), 100)
            .expect("another model's client finds the second half");
    }
}

#[test]
fn a_thousand_connections_at_one_model_leave_the_second_half_to_others() {
    // The first connections take the pool; each later one, under its share (about 1 MB / 2 / n,
    // many requests of 16 bytes), takes what its share allows of the reserve's first half.
    let mut s = Shares::new(1_000_000, 125_000, FLAG);
    for port in 1..=1000 {
        while s.admit("flood", conn(port), 16).is_ok() {}
    }
    assert!(
        s.used() > 875_000,
        "the flood's clients, under their shares, used the first half"
    );
    assert!(
        s.used() <= 937_500,
        "the flood took the second half: {} bytes",
        s.used()
    );
    for _ in 0..100 {
        s.admit("other", conn(5000), 16)
            .expect("another model's client is served");
    }
}

#[test]
fn without_a_reserve_it_is_first_come() {
    let mut s = Shares::new(100, 0, FLAG);
    s.admit("flood", conn(1), 100).unwrap();
    assert!(s.admit("other", conn(2), 1).is_err());
}

#[test]
fn released_parties_leave_no_entry() {
    let b = FairBudget::new(1000, 100, FLAG);
    let permits: Vec<Permit> = (0..50)
        .map(|i| b.admit(&format!("m{}", i % 5), conn(i), 10).unwrap())
        .collect();
    assert_eq!(b.shares.locked().models.len(), 5);
    drop(permits);
    let shares = b.shares.locked();
    assert_eq!(shares.used(), 0);
    assert!(shares.models.is_empty(), "idle models and clients must not pile up");
}

/// A tiny deterministic generator for the simulations (no clock, no thread).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

/// Requests in flight in a simulation: (model, client, bytes), finishing at random.
#[derive(Default)]
struct Sim {
    inflight: Vec<(&'static str, Client, u64)>,
}

impl Sim {
    /// Finishes each request in flight with probability `1 / every`.
    fn finish_some(&mut self, s: &mut Shares, rng: &mut Lcg, every: u64) {
        self.inflight.retain(|&(m, c, b)| {
            let done = rng.next().is_multiple_of(every);
            if done {
                s.release(m, c, b);
            }
            !done
        });
    }

    fn send(&mut self, s: &mut Shares, model: &'static str, client: Client, bytes: u64) -> bool {
        let ok = s.admit(model, client, bytes).is_ok();
        if ok {
            self.inflight.push((model, client, bytes));
        }
        ok
    }
}

#[test]
fn a_flood_from_300_connections_at_a_slow_model_does_not_starve_another_model() {
    // 16 MiB, requests charged 16 KiB, the flooded model slow (a request in 200 finishes a tick),
    // the victim fast (half of its requests finish each tick) and sending 4 at a time.
    let mut s = Shares::new(16 << 20, 2 << 20, FLAG);
    let (mut rng, mut sim, mut fast) = (Lcg(7), Sim::default(), Sim::default());
    let (mut refused_victim, mut refused_flood, mut sent_victim) = (0, 0, 0);
    for _ in 0..2_000 {
        for port in 0..300 {
            for _ in 0..3 {
                if !sim.send(&mut s, "slow", conn(port), 16 << 10) {
                    refused_flood += 1;
                }
            }
        }
        let victim = conn(9_999);
        while fast.inflight.len() < 4 {
            sent_victim += 1;
            if !fast.send(&mut s, "fast", victim, 16 << 10) {
                refused_victim += 1;
                break;
            }
        }
        sim.finish_some(&mut s, &mut rng, 200);
        fast.finish_some(&mut s, &mut rng, 2);
    }
    assert!(
        refused_flood > 100_000,
        "the flood was refused only {refused_flood} times"
    );
    assert_eq!(
        refused_victim, 0,
        "the victim was refused {refused_victim} of {sent_victim}"
    );
}

#[test]
fn two_floods_each_keep_a_share() {
    // Two models flooded, one always first to take what was freed: the other still holds a fair part.
    let mut s = Shares::new(1 << 20, 1 << 17, FLAG);
    let (mut rng, mut sim) = (Lcg(11), Sim::default());
    for _ in 0..2_000 {
        for _ in 0..50 {
            sim.send(&mut s, "a", conn(1), 1 << 10);
        }
        for _ in 0..50 {
            sim.send(&mut s, "b", conn(2), 1 << 10);
        }
        sim.finish_some(&mut s, &mut rng, 20);
    }
    let held_b = s.held("b", conn(2));
    // b's share with two models active is 1 MiB / 3 / 2; it reaches most of it from the reserve.
    assert!(held_b >= 100 << 10, "b holds only {held_b} bytes");
    assert!(s.used() <= 1 << 20);
}
