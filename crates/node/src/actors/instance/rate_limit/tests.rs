//! The rate limiter's decisions, without threads: capacities, Triton's load errors, weighted turns.
use super::*;
use mesh::proto::model_rate_limiter::Resource;

fn config(resources: &[(&str, u32, bool)], priority: u32) -> ModelRateLimiter {
    ModelRateLimiter {
        resources: resources
            .iter()
            .map(|(name, count, global)| Resource {
                name: name.to_string(),
                count: *count,
                global: *global,
            })
            .collect(),
        priority,
    }
}

fn flags(list: &[&str]) -> Vec<ResourceFlag> {
    list.iter().map(|f| ResourceFlag::parse(f).unwrap()).collect()
}

fn key(name: &str, scope: Scope) -> Key {
    Key {
        name: name.into(),
        scope,
    }
}

#[test]
fn without_flags_a_resource_has_as_many_copies_as_the_hungriest_instance_needs() {
    let mut p = Pools::new(Vec::new());
    p.join(1, 0, &config(&[("R1", 4, false)], 1)).unwrap();
    p.join(2, 0, &config(&[("R1", 2, false)], 1)).unwrap();
    p.join(3, 0, &config(&[("R1", 2, false)], 1)).unwrap();
    assert_eq!(p.capacity(&key("R1", Scope::Device(0))), 4);
    assert_eq!(p.capacity(&key("R1", Scope::Device(1))), 0, "copies are per device");
    assert_eq!(p.request(2), [2]);
    assert_eq!(p.request(3), [3], "2 + 2 copies fit in 4");
    assert!(p.request(1).is_empty(), "4 more do not");
    assert_eq!(p.in_use(&key("R1", Scope::Device(0))), 4);
    assert!(p.release(2, false).is_empty(), "2 free copies are not enough for 4");
    assert_eq!(p.release(3, false), [1]);
    assert_eq!(p.in_use(&key("R1", Scope::Device(0))), 4);
}

#[test]
fn flags_that_leave_too_few_copies_refuse_the_instance_with_tritons_words() {
    let mut p = Pools::new(flags(&["resource1:1"]));
    let e = p.join(1, 0, &config(&[("resource1", 4, false)], 0)).unwrap_err();
    assert_eq!(
        e,
        "Resource count for \"resource1\" is limited to 1 which will prevent scheduling of one or more model instances, the minimum required count is 4"
    );
    // A device-specific flag gives no copies to other devices; a resource not named has none.
    let mut p = Pools::new(flags(&["resource1:10:10", "resource2:2"]));
    let e = p.join(1, 0, &config(&[("resource1", 4, false)], 0)).unwrap_err();
    assert!(e.contains("is limited to 0 which"), "{e}");
    let e = p.join(1, 0, &config(&[("other", 1, false)], 0)).unwrap_err();
    assert!(e.contains("\"other\" is limited to 0"), "{e}");
    // A global resource takes the largest count given for its name, whatever the device.
    p.join(2, 0, &config(&[("resource2", 2, true)], 0)).unwrap();
    p.join(3, 10, &config(&[("resource1", 10, false)], 0)).unwrap();
    assert_eq!(p.capacity(&key("resource2", Scope::Global)), 2);
    assert_eq!(p.capacity(&key("resource1", Scope::Device(10))), 10);
}

#[test]
fn a_resource_cannot_be_both_global_and_per_device() {
    let mut p = Pools::new(Vec::new());
    p.join(1, 0, &config(&[("resource2", 2, true)], 0)).unwrap();
    let e = p.join(2, 0, &config(&[("resource2", 2, false)], 0)).unwrap_err();
    assert_eq!(
        e,
        "Resource \"resource2\" is present as both global and device-specific resource in the model configuration."
    );
    assert!(p.request(2) == [2], "the refused instance is not a member");
}

#[test]
fn global_copies_are_shared_across_devices() {
    let mut p = Pools::new(Vec::new());
    p.join(1, 0, &config(&[("G", 1, true)], 0)).unwrap();
    p.join(2, 1, &config(&[("G", 1, true)], 0)).unwrap();
    assert_eq!(p.request(1), [1]);
    assert!(p.request(2).is_empty(), "the one global copy is taken on device 0");
    assert_eq!(p.release(1, false), [2]);
}

/// `ids` ask for turns, and every instance asks again as soon as its turn ends; counts turns over
/// `rounds` releases (`running` holds who has a turn, across calls).
fn contend(p: &mut Pools, running: &mut Vec<u64>, ids: &[u64], rounds: usize) -> HashMap<u64, usize> {
    let mut turns: HashMap<u64, usize> = HashMap::new();
    for id in ids {
        running.extend(p.request(*id));
    }
    for _ in 0..rounds {
        let holder = running.remove(0);
        *turns.entry(holder).or_default() += 1;
        running.extend(p.release(holder, true));
    }
    turns
}

#[test]
fn priority_two_gets_half_the_turns_of_priority_one() {
    let mut p = Pools::new(flags(&["R:1"]));
    p.join(1, 0, &config(&[("R", 1, false)], 1)).unwrap();
    p.join(2, 0, &config(&[("R", 1, false)], 2)).unwrap();
    let mut running = Vec::new();
    let turns = contend(&mut p, &mut running, &[1, 2], 300);
    assert!((199..=201).contains(&turns[&1]), "{turns:?}");
    assert!((99..=101).contains(&turns[&2]), "{turns:?}");
    // Priority 0 counts as 1.
    let mut p = Pools::new(flags(&["R:1"]));
    p.join(1, 0, &config(&[("R", 1, false)], 0)).unwrap();
    p.join(2, 0, &config(&[("R", 1, false)], 1)).unwrap();
    let mut running = Vec::new();
    let turns = contend(&mut p, &mut running, &[1, 2], 100);
    assert_eq!((turns[&1], turns[&2]), (50, 50));
}

#[test]
fn plenty_of_copies_let_both_run_whatever_their_priority() {
    let mut p = Pools::new(flags(&["R:2"]));
    p.join(1, 0, &config(&[("R", 1, false)], 1)).unwrap();
    p.join(2, 0, &config(&[("R", 1, false)], 4)).unwrap();
    assert_eq!(p.request(1), [1]);
    assert_eq!(p.request(2), [2]);
}

#[test]
fn an_idle_instance_saves_no_credit_for_later() {
    let mut p = Pools::new(flags(&["R:1"]));
    p.join(1, 0, &config(&[("R", 1, false)], 1)).unwrap();
    p.join(2, 0, &config(&[("R", 1, false)], 1)).unwrap();
    let mut running = Vec::new();
    contend(&mut p, &mut running, &[1], 100);
    // 1 ran 100 turns alone (it holds one now); 2 arrives and they alternate from here on.
    let turns = contend(&mut p, &mut running, &[2], 20);
    assert_eq!((turns[&1], turns[&2]), (10, 10), "{turns:?}");
}

/// Four copies of R: 1 holds one, 2 (needing all four) waits, then 3 (needing one) waits behind it.
fn a_hungry_instance_in_line() -> Pools {
    let mut p = Pools::new(flags(&["R:4"]));
    p.join(1, 0, &config(&[("R", 1, false)], 1)).unwrap();
    p.join(2, 0, &config(&[("R", 4, false)], 1)).unwrap();
    p.join(3, 0, &config(&[("R", 1, false)], 1)).unwrap();
    assert_eq!(p.request(1), [1]);
    assert!(p.request(2).is_empty());
    assert!(p.request(3).is_empty(), "3 would fit, but 2 asked first");
    p
}

#[test]
fn the_first_in_line_is_not_overtaken_by_smaller_needs() {
    let mut p = a_hungry_instance_in_line();
    assert_eq!(p.release(1, false), [2]);
    assert_eq!(p.release(2, false), [3]);
}

#[test]
fn leaving_takes_the_waiter_out_of_line() {
    let mut p = a_hungry_instance_in_line();
    assert_eq!(p.leave(2), [3]);
}

#[test]
fn resource_flags_parse_as_tritonserver_documents_them() {
    assert_eq!(
        ResourceFlag::parse("R1:10").unwrap(),
        ResourceFlag {
            name: "R1".into(),
            count: 10,
            device: None
        }
    );
    assert_eq!(ResourceFlag::parse("R2:5:1").unwrap().device, Some(1));
    for bad in ["R1", "R1:x", ":3", "R1:3:-1", "R1:3:0:1", "R1:-2"] {
        let e = ResourceFlag::parse(bad).unwrap_err();
        assert!(e.contains(bad), "{e}");
    }
}

#[test]
fn the_limiter_is_off_unless_asked_and_names_a_bad_mode() {
    let off = Limiter::from_flags(None, &[]).unwrap();
    assert!(off.join(0, Some(&config(&[("R", 1, false)], 1))).unwrap().is_none());
    let on = Limiter::from_flags(Some("execution_count"), &[]).unwrap();
    assert!(
        on.join(0, None).unwrap().is_none(),
        "a group without a rate_limiter is not limited"
    );
    assert!(on.join(0, Some(&config(&[("R", 1, false)], 1))).unwrap().is_some());
    let e = Limiter::from_flags(Some("fast"), &[]).err().unwrap();
    assert!(e.contains("'fast'"), "{e}");
}

#[test]
fn threads_wait_for_their_turn_and_hold_it_alone() {
    use std::sync::atomic::AtomicUsize;
    let limiter = Limiter::from_flags(Some("execution_count"), &["R:1".into()]).unwrap();
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let m = limiter.join(0, Some(&config(&[("R", 1, false)], 1))).unwrap().unwrap();
            let (running, most) = (running.clone(), most.clone());
            std::thread::spawn(move || {
                for _ in 0..200 {
                    let _turn = m.wait_turn();
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    std::thread::yield_now();
                    running.fetch_sub(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(most.load(Ordering::SeqCst), 1);
}

#[test]
fn a_turn_given_up_goes_to_the_next_in_line() {
    let mut p = Pools::new(flags(&["R:1"]));
    p.join(1, 0, &config(&[("R", 1, false)], 1)).unwrap();
    p.join(2, 0, &config(&[("R", 1, false)], 1)).unwrap();
    assert_eq!(p.request(1), [1]);
    // 1 ends its turn with another batch in hand and is granted again at once ...
    assert_eq!(p.release(1, true), [1]);
    assert!(p.request(2).is_empty());
    // ... but that batch is not run: the copy it held goes to 2.
    assert_eq!(p.withdraw(1, true), [2]);
    assert_eq!(p.in_use(&key("R", Scope::Device(0))), 1);
    // Still in line (not granted), 1 just leaves the line.
    assert!(p.request(1).is_empty());
    assert!(p.withdraw(1, false).is_empty());
    assert!(!p.is_waiting(1));
}

#[test]
fn a_member_that_leaves_gives_back_a_turn_it_never_took() {
    let limiter = Limiter::from_flags(Some("execution_count"), &["R:1".into()]).unwrap();
    let limits = config(&[("R", 1, false)], 1);
    let a = limiter.join(0, Some(&limits)).unwrap().unwrap();
    let b = limiter.join(0, Some(&limits)).unwrap().unwrap();
    a.wait_turn().end(true); // granted again at once, and not taken
    assert!(b.try_turn().is_none(), "a holds the only copy");
    drop(a);
    assert!(b.try_turn().is_some(), "b gets the copy a left behind");
}
