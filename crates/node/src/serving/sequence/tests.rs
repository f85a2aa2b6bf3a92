//! Tests of the sequence batcher: control flags, start and end, implicit state and idle expiry.
use std::time::Duration;

use super::setup::{ControlKind, ControlSpec, StateSpec};
use super::*;
use mesh::proto::model_sequence_batching::control::Kind;
use mesh::Param;
use mesh::{DataType, NamedTensor};

fn setup(idle_ms: u64) -> Arc<SequenceSetup> {
    let flag = |input: &str, kind| ControlSpec {
        input: input.into(),
        kind: ControlKind::Flag {
            kind,
            dtype: DataType::Int32,
            values: [
                bytes::Bytes::from_static(&[0; 4]),
                bytes::Bytes::from_static(&[1, 0, 0, 0]),
            ],
        },
    };
    Arc::new(SequenceSetup {
        idle: Duration::from_millis(idle_ms),
        controls: vec![
            flag("START", Kind::ControlSequenceStart),
            flag("END", Kind::ControlSequenceEnd),
            flag("READY", Kind::ControlSequenceReady),
            ControlSpec {
                input: "CORRID".into(),
                kind: ControlKind::CorrId {
                    dtype: DataType::Uint64,
                },
            },
        ],
        states: vec![StateSpec {
            input: "S_IN".into(),
            output: "S_OUT".into(),
            initial: Tensor::from_values(vec![1], &[0f32]),
        }],
        iterative: false,
        slots: 0,
    })
}

fn flags(id: u64, start: bool, end: bool) -> Flags {
    Flags {
        id: SequenceId::Int(id),
        start,
        end,
    }
}

fn request(params: Vec<(&str, Param)>) -> mesh::InferRequest {
    mesh::InferRequest {
        parameters: params.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        ..Default::default()
    }
}

/// A request's flags as serving reads them: its parameters parsed once, then its sequence's flags.
fn flags_of(model: &str, request: &mesh::InferRequest) -> Result<Flags> {
    Flags::of(model, &mesh::params::Controls::parse(&request.parameters)?.sequence)
}

#[test]
fn flags_are_read_as_tritonclient_sends_them() {
    let f = flags_of(
        "m",
        &request(vec![
            ("sequence_id", Param::Int(7)),
            ("sequence_start", Param::Bool(true)),
            ("sequence_end", Param::Bool(false)),
        ]),
    )
    .unwrap();
    assert_eq!(f, flags(7, true, false));
    let s = flags_of("m", &request(vec![("sequence_id", Param::String("abc".into()))])).unwrap();
    assert_eq!((s.id, s.start, s.end), (SequenceId::Str("abc".into()), false, false));
    for bad in [
        vec![],
        vec![("sequence_id", Param::Int(0))],
        vec![("sequence_id", Param::String("".into()))],
    ] {
        let e = flags_of("m", &request(bad)).unwrap_err();
        assert!(
            e.message
                .contains("must specify a non-zero or non-empty correlation ID"),
            "{e}"
        );
    }
    let e = flags_of("m", &request(vec![("sequence_id", Param::Int(-4))])).unwrap_err();
    assert!(e.message.contains("positive integer or a string"), "{e}");
    let e = flags_of(
        "m",
        &request(vec![("sequence_id", Param::Int(1)), ("sequence_end", Param::Int(1))]),
    )
    .unwrap_err();
    assert!(e.message.contains("'sequence_end' must be a boolean"), "{e}");
}

fn v(x: f32) -> Vec<Tensor> {
    vec![Tensor::from_values(vec![1], &[x])]
}

#[test]
fn a_sequence_needs_start_keeps_its_instance_and_state_and_ends_with_end() {
    let t0 = Instant::now();
    let mut s = Sequences::new(setup(1000));
    let e = s.begin("m", &flags(1, false, false), &["i0", "i1"], t0).unwrap_err();
    assert!(e.message.contains("must specify the START flag"), "{e}");

    let first = s.begin("m", &flags(1, true, false), &["i0", "i1"], t0).unwrap();
    assert_eq!(
        s.state("m", &flags(1, true, false), &first).unwrap(),
        v(0.0),
        "initial state"
    );
    s.finish(&SequenceId::Int(1), &first, Some(v(5.0)), false, t0);
    // A second sequence goes to the other instance (fewest sequences).
    let other = s.begin("m", &flags(2, true, false), &["i0", "i1"], t0).unwrap();
    assert_ne!(other.instance, first.instance);

    let next = s.begin("m", &flags(1, false, false), &["i0", "i1"], t0).unwrap();
    assert_eq!(next.instance, first.instance, "pinned");
    assert_eq!(s.state("m", &flags(1, false, false), &next).unwrap(), v(5.0));
    // A failed request keeps the state.
    s.finish(&SequenceId::Int(1), &next, None, false, t0);
    let last = s.begin("m", &flags(1, false, true), &["i0", "i1"], t0).unwrap();
    assert_eq!(s.state("m", &flags(1, false, true), &last).unwrap(), v(5.0));
    s.finish(&SequenceId::Int(1), &last, Some(vec![]), true, t0);
    assert!(s.begin("m", &flags(1, false, false), &["i0"], t0).is_err(), "ended");
    assert_eq!(s.len(t0), 1);
}

#[test]
fn requests_admitted_behind_an_end_find_the_sequence_ended() {
    let t0 = Instant::now();
    let mut s = Sequences::new(setup(1000));
    let start = s.begin("m", &flags(1, true, false), &["i0"], t0).unwrap();
    s.finish(&SequenceId::Int(1), &start, Some(v(1.0)), false, t0);
    let end = s.begin("m", &flags(1, false, true), &["i0"], t0).unwrap();
    let behind = s.begin("m", &flags(1, false, false), &["i0"], t0).unwrap();
    s.finish(&SequenceId::Int(1), &end, Some(v(2.0)), true, t0);
    let e = s.state("m", &flags(1, false, false), &behind).unwrap_err();
    assert!(e.message.contains("must specify the START flag"), "{e}");
    // A START now makes a new sequence; the late request's end does not touch it.
    let again = s.begin("m", &flags(1, true, false), &["i0"], t0).unwrap();
    s.finish(&SequenceId::Int(1), &behind, None, false, t0);
    assert_eq!(s.state("m", &flags(1, true, false), &again).unwrap(), v(0.0));
    s.finish(&SequenceId::Int(1), &again, Some(v(7.0)), false, t0);
    let more = s.begin("m", &flags(1, false, false), &["i0"], t0).unwrap();
    assert_eq!(s.state("m", &flags(1, false, false), &more).unwrap(), v(7.0));
}

#[test]
fn an_idle_sequence_expires_but_not_while_a_request_runs() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let mut s = Sequences::new(setup(100));
    let a = s.begin("m", &flags(1, true, false), &["i0"], t0).unwrap();
    // Running for longer than the idle time: still active.
    let b = s.begin("m", &flags(2, true, false), &["i0"], t0 + ms(500)).unwrap();
    s.finish(&SequenceId::Int(1), &a, None, false, t0 + ms(600));
    s.finish(&SequenceId::Int(2), &b, None, false, t0 + ms(600));
    assert!(s.begin("m", &flags(1, false, false), &["i0"], t0 + ms(690)).is_ok());
    // Sequence 2 has been idle 101 ms.
    let e = s
        .begin("m", &flags(2, false, false), &["i0"], t0 + ms(701))
        .unwrap_err();
    assert!(
        e.message.contains("idle longer than max_sequence_idle_microseconds"),
        "{e}"
    );
    assert_eq!(s.len(t0 + ms(701)), 1);
}

#[test]
fn a_new_start_restarts_the_sequence_and_an_older_answer_cannot_overwrite_it() {
    let t0 = Instant::now();
    let mut s = Sequences::new(setup(1000));
    let old = s.begin("m", &flags(1, true, false), &["i0", "i1"], t0).unwrap();
    let restarted = s.begin("m", &flags(1, true, false), &["i0", "i1"], t0).unwrap();
    assert_eq!(restarted.instance, old.instance);
    assert!(
        Arc::ptr_eq(&restarted.turn, &old.turn),
        "waits behind the running request"
    );
    s.finish(&SequenceId::Int(1), &old, Some(v(9.0)), true, t0);
    assert_eq!(
        s.state("m", &flags(1, true, false), &restarted).unwrap(),
        v(0.0),
        "fresh state"
    );
    s.finish(&SequenceId::Int(1), &restarted, Some(v(3.0)), false, t0);
    let next = s.begin("m", &flags(1, false, false), &["i0"], t0).unwrap();
    assert_eq!(
        s.state("m", &flags(1, false, false), &next).unwrap(),
        v(3.0),
        "the old END did not end it"
    );
}

#[test]
fn a_start_whose_instance_is_gone_moves_to_one_that_is_there() {
    let t0 = Instant::now();
    let mut s = Sequences::new(setup(1000));
    let a = s.begin("m", &flags(1, true, false), &["i0"], t0).unwrap();
    s.finish(&SequenceId::Int(1), &a, None, false, t0);
    let b = s.begin("m", &flags(1, true, false), &["i1"], t0).unwrap();
    assert_eq!(b.instance, "i1");
}

#[test]
fn controls_and_state_are_added_and_the_next_state_taken_back() {
    let setup = setup(1000);
    let mut inputs = vec![];
    inputs::add(
        "m",
        &setup,
        &flags(42, true, false),
        vec![Tensor::from_values(vec![1], &[3f32])],
        true,
        &mut inputs,
    )
    .unwrap();
    let get = |n: &str| inputs.iter().find(|i| i.name == n).unwrap().tensor.clone();
    assert_eq!(get("START"), Tensor::from_values(vec![1, 1], &[1i32]));
    assert_eq!(get("END"), Tensor::from_values(vec![1, 1], &[0i32]));
    assert_eq!(get("READY"), Tensor::from_values(vec![1, 1], &[1i32]));
    assert_eq!(get("CORRID"), Tensor::from_values(vec![1, 1], &[42u64]));
    assert_eq!(get("S_IN"), Tensor::from_values(vec![1, 1], &[3f32]));

    let names = inputs::outputs(&setup, vec![], &["Y".to_string()]);
    assert_eq!(names, ["Y", "S_OUT"]);
    let mut outs = vec![
        NamedTensor {
            name: "Y".into(),
            tensor: Tensor::from_values(vec![1, 1], &[1f32]),
        },
        NamedTensor {
            name: "S_OUT".into(),
            tensor: Tensor::from_values(vec![1, 1], &[4f32]),
        },
    ];
    let next = inputs::take_states(&setup, &mut outs, true).unwrap();
    assert_eq!(next, vec![Tensor::from_values(vec![1], &[4f32])]);
    assert_eq!(outs.len(), 1, "the state is not returned to the client");

    let e = inputs::add(
        "m",
        &setup,
        &Flags {
            id: SequenceId::Str("x".into()),
            start: true,
            end: false,
        },
        vec![],
        true,
        &mut vec![],
    )
    .unwrap_err();
    assert!(e.message.contains("takes integer correlation IDs"), "{e}");
}

#[test]
fn an_iterative_sequence_model_takes_a_request_without_an_id_as_a_sequence_of_its_own() {
    let mut iterative = setup(1000);
    Arc::get_mut(&mut iterative).unwrap().iterative = true;
    let table = Arc::new(std::sync::Mutex::new(Sequences::new(iterative)));
    let plain = request(vec![]);
    let a = Step::begin(&table, &plain, 1, &["i0"]).unwrap();
    let b = Step::begin(&table, &plain, 1, &["i0"]).unwrap();
    assert!(a.flags.start && a.flags.end, "it starts and ends with its one request");
    assert_ne!(a.flags.id, b.flags.id, "each gets an id of its own");
    assert!(matches!(a.flags.id, SequenceId::Int(id) if id >= 1 << 63));
    // A request that names its sequence is taken as it is; other models still need an id.
    let named = request(vec![
        ("sequence_id", Param::Int(5)),
        ("sequence_start", Param::Bool(true)),
    ]);
    assert_eq!(
        Step::begin(&table, &named, 1, &["i0"]).unwrap().flags,
        flags(5, true, false)
    );
    let other = Arc::new(std::sync::Mutex::new(Sequences::new(setup(1000))));
    assert!(Step::begin(&other, &plain, 1, &["i0"]).is_err());
}

#[test]
fn the_direct_strategy_waits_only_for_its_minimum_slot_utilization() {
    use mesh::proto::model_sequence_batching::{StrategyChoice, StrategyDirect};
    use mesh::proto::ModelSequenceBatching;
    let direct = |u: f32| ModelSequenceBatching {
        strategy_choice: Some(StrategyChoice::Direct(StrategyDirect {
            max_queue_delay_microseconds: 3_000_000,
            minimum_slot_utilization: u,
        })),
        ..Default::default()
    };
    // Triton: at the default 0 a batch goes as soon as one slot has a request; the delay is moot.
    assert_eq!(super::setup::strategy(&direct(0.0), 4), (Duration::ZERO, vec![]));
    // Half of 4 slots: a batch of 2 or more goes at once, fewer wait up to the delay.
    assert_eq!(
        super::setup::strategy(&direct(0.5), 4),
        (Duration::from_secs(3), vec![2, 3, 4])
    );
    assert_eq!(
        super::setup::strategy(&direct(1.0), 4),
        (Duration::from_secs(3), vec![4])
    );
}

#[test]
fn an_instance_holds_at_most_its_slots_and_a_start_waits_for_one() {
    // Triton's direct strategy with max_batch_size 0: one sequence per instance at a time, so a
    // model that keeps its state in the instance never sees two sequences interleaved.
    let t0 = Instant::now();
    let one_slot = Arc::new(SequenceSetup {
        slots: 1,
        ..(*setup(1000)).clone()
    });
    let mut s = Sequences::new(one_slot);
    let a = s
        .try_begin("m", &flags(1, true, false), &["i0", "i1"], t0)
        .unwrap()
        .unwrap();
    let b = s
        .try_begin("m", &flags(2, true, false), &["i0", "i1"], t0)
        .unwrap()
        .unwrap();
    assert_ne!(a.instance, b.instance, "a free instance first");
    assert!(
        s.try_begin("m", &flags(3, true, false), &["i0", "i1"], t0)
            .unwrap()
            .is_none(),
        "every slot taken"
    );
    assert!(s.begin("m", &flags(3, true, false), &["i0", "i1"], t0).is_err());
    // A new START of a held sequence restarts it in its slot.
    let again = s
        .try_begin("m", &flags(1, true, false), &["i0", "i1"], t0)
        .unwrap()
        .unwrap();
    assert_eq!(again.instance, a.instance);
    s.finish(&SequenceId::Int(1), &a, Some(v(1.0)), false, t0);
    s.finish(&SequenceId::Int(1), &again, Some(v(1.0)), true, t0);
    let c = s
        .try_begin("m", &flags(3, true, false), &["i0", "i1"], t0)
        .unwrap()
        .unwrap();
    assert_eq!(c.instance, a.instance, "the ended sequence's slot");
    // An idle sequence frees its slot too.
    let later = t0 + Duration::from_secs(2);
    s.finish(&SequenceId::Int(3), &c, Some(v(1.0)), false, t0);
    s.finish(&SequenceId::Int(2), &b, Some(v(1.0)), false, t0);
    assert!(s
        .try_begin("m", &flags(4, true, false), &["i0", "i1"], later)
        .unwrap()
        .is_some());
}

#[tokio::test]
async fn a_waiting_start_is_admitted_when_a_sequence_ends() {
    let one_slot = Arc::new(SequenceSetup {
        slots: 1,
        ..(*setup(60_000)).clone()
    });
    let table = Arc::new(std::sync::Mutex::new(Sequences::new(one_slot)));
    let seq = |id: u64, start: bool, end: bool| {
        let mut params = vec![("sequence_id", Param::Uint(id))];
        if start {
            params.push(("sequence_start", Param::Bool(true)));
        }
        if end {
            params.push(("sequence_end", Param::Bool(true)));
        }
        request(params)
    };
    async fn admit(table: &Arc<std::sync::Mutex<Sequences>>, request: mesh::InferRequest) -> Result<Step> {
        let controls = mesh::params::Controls::parse(&request.parameters)?;
        Step::admit(table, "m", &controls.sequence, 1, &["i0"]).await
    }
    let first = admit(&table, seq(1, true, false)).await.unwrap();
    let waiting = tokio::spawn({
        let table = table.clone();
        async move {
            admit(&table, seq(2, true, false))
                .await
                .map(|s| s.ticket.instance.clone())
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiting.is_finished(), "the only slot is held");
    drop(first);
    let end = admit(&table, seq(1, false, true)).await.unwrap();
    let mut outputs = vec![];
    end.finish(false, &mut outputs).ok();
    let admitted = tokio::time::timeout(Duration::from_secs(10), waiting).await;
    assert_eq!(
        admitted.expect("admitted once the sequence ended").unwrap().unwrap(),
        "i0"
    );
}

/// The table's indexes agree with its entries: the idle index holds exactly the idle ones, at
/// their `last`, and the counts per instance are those of a plain count.
fn check(s: &Sequences) {
    let mut held: HashMap<String, usize> = HashMap::new();
    for (id, a) in &s.active {
        *held.entry(a.instance.clone()).or_default() += 1;
        match a.idle {
            Some(key) => {
                assert_eq!(a.running, 0, "{id} is filed idle while running");
                assert_eq!(key.0, a.last, "{id} is filed at another instant");
                assert_eq!(s.idle.by_last.get(&key), Some(id));
            }
            None => assert_ne!(a.running, 0, "{id} is idle but not filed"),
        }
    }
    let idle = s.active.values().filter(|a| a.running == 0).count();
    assert_eq!(s.idle.by_last.len(), idle, "stale idle keys");
    assert_eq!(s.held.0, held);
}

fn held(s: &Sequences, instance: &str) -> usize {
    s.held.of(instance)
}

#[test]
fn a_sequence_busy_again_idles_out_only_its_idle_time_after_its_last_request() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let mut s = Sequences::new(setup(100));
    let a = s.begin("m", &flags(1, true, false), &["i0"], t0).unwrap();
    s.finish(&SequenceId::Int(1), &a, None, false, t0);
    // Busy again before its idle time is up, and running long after it.
    let b = s.begin("m", &flags(1, false, false), &["i0"], t0 + ms(50)).unwrap();
    let c = s.begin("m", &flags(2, true, false), &["i0"], t0 + ms(300)).unwrap();
    s.finish(&SequenceId::Int(2), &c, None, false, t0 + ms(300));
    assert!(s.active.contains_key(&SequenceId::Int(1)), "running: not expired");
    check(&s);
    s.finish(&SequenceId::Int(1), &b, None, false, t0 + ms(400));
    // Idle exactly its idle time: still there (2, idle 200 ms, is not).
    let d = s.begin("m", &flags(3, true, false), &["i0"], t0 + ms(500)).unwrap();
    s.finish(&SequenceId::Int(3), &d, None, false, t0 + ms(500));
    assert!(s.active.contains_key(&SequenceId::Int(1)));
    assert!(!s.active.contains_key(&SequenceId::Int(2)));
    assert_eq!((held(&s, "i0"), s.len(t0 + ms(500))), (2, 2));
    check(&s);
    // A nanosecond longer: gone.
    let later = t0 + ms(500) + Duration::from_nanos(1);
    assert_eq!(s.len(later), 1);
    let e = s.begin("m", &flags(1, false, false), &["i0"], later).unwrap_err();
    assert!(e.message.contains("must specify the START flag"), "{e}");
    assert_eq!(held(&s, "i0"), 1);
    check(&s);
}

#[test]
fn a_hundred_thousand_sequences_idling_out_at_once_free_every_slot() {
    // Two slots an instance, 50 000 instances, all full; sequence 7 (on i3) keeps running.
    let t0 = Instant::now();
    let two_slots = Arc::new(SequenceSetup {
        slots: 2,
        ..(*setup(1000)).clone()
    });
    let mut s = Sequences::new(two_slots);
    let names: Vec<String> = (0..50_000).map(|i| format!("i{i}")).collect();
    for id in 0..100_000u64 {
        let on = [names[id as usize / 2].as_str()];
        let t = s.begin("m", &flags(id, true, false), &on, t0).unwrap();
        if id != 7 {
            s.finish(&SequenceId::Int(id), &t, None, false, t0);
        }
    }
    assert_eq!((held(&s, "i0"), held(&s, "i49999"), s.len(t0)), (2, 2, 100_000));
    assert!(s
        .try_begin("m", &flags(100_000, true, false), &["i3", "i7"], t0)
        .unwrap()
        .is_none());
    let later = t0 + Duration::from_millis(1001);
    let a = s
        .begin("m", &flags(100_001, true, false), &["i3", "i7"], later)
        .unwrap();
    assert_eq!(a.instance, "i7", "i3 still holds the running sequence");
    assert_eq!(s.held.0.len(), 2, "every other count is gone");
    assert_eq!((held(&s, "i3"), held(&s, "i7"), s.len(later)), (1, 1, 2));
    let b = s
        .begin("m", &flags(100_002, true, false), &["i3", "i7"], later)
        .unwrap();
    assert_eq!(b.instance, "i3", "a tie goes to the first");
    assert!(s
        .try_begin("m", &flags(100_003, true, false), &["i3"], later)
        .unwrap()
        .is_none());
    check(&s);
}

#[test]
fn the_counts_follow_restarts_replacements_ends_and_expiry() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let both = ["i0", "i1"];
    let mut s = Sequences::new(setup(100));
    let counts = |s: &Sequences| (held(s, "i0"), held(s, "i1"));
    let a = s.begin("m", &flags(1, true, false), &both, t0).unwrap();
    let b = s.begin("m", &flags(2, true, false), &both, t0).unwrap();
    assert_eq!(
        (a.instance.as_str(), b.instance.as_str(), counts(&s)),
        ("i0", "i1", (1, 1))
    );
    // A restart stays where it is and counts once.
    let again = s.begin("m", &flags(1, true, false), &both, t0).unwrap();
    assert_eq!((again.instance.as_str(), counts(&s)), ("i0", (1, 1)));
    s.finish(&SequenceId::Int(1), &a, None, false, t0);
    s.finish(&SequenceId::Int(1), &again, None, false, t0);
    check(&s);
    // Replaced on the other instance (i0 is gone), which tells waiting STARTs.
    let freed = s.freed.clone();
    let mut told = std::pin::pin!(freed.notified());
    told.as_mut().enable();
    let moved = s.begin("m", &flags(1, true, false), &["i1"], t0 + ms(10)).unwrap();
    assert_eq!((moved.instance.as_str(), counts(&s)), ("i1", (0, 2)));
    assert!(told.as_mut().enable(), "told");
    check(&s);
    // END.
    s.finish(&SequenceId::Int(2), &b, None, false, t0 + ms(10));
    let end = s.begin("m", &flags(2, false, true), &both, t0 + ms(20)).unwrap();
    assert_eq!(counts(&s), (0, 2), "held until its END is done");
    s.finish(&SequenceId::Int(2), &end, None, true, t0 + ms(30));
    assert_eq!(counts(&s), (0, 1));
    check(&s);
    // Expiry, which tells waiting STARTs too.
    s.finish(&SequenceId::Int(1), &moved, None, false, t0 + ms(30));
    let mut told = std::pin::pin!(freed.notified());
    told.as_mut().enable();
    let c = s
        .begin("m", &flags(3, true, false), &["i1", "i0"], t0 + ms(130))
        .unwrap();
    assert_eq!(
        (c.instance.as_str(), counts(&s)),
        ("i0", (1, 1)),
        "1, idle exactly 100 ms, still counts"
    );
    assert!(!told.as_mut().enable(), "nothing freed");
    let d = s
        .begin("m", &flags(4, true, false), &["i0", "i1"], t0 + ms(131))
        .unwrap();
    assert!(told.as_mut().enable(), "told");
    assert_eq!((d.instance.as_str(), counts(&s)), ("i1", (1, 1)), "1 no longer counts");
    check(&s);
}

#[test]
fn the_table_decides_as_a_plain_scan_of_every_sequence_would() {
    reference::compare(0x5eed_0052, 20_000);
}

mod reference;
