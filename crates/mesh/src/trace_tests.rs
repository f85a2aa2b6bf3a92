//! Tests of trace settings (defaults, refusals, rate and count, log frequency, flags) and the trace clock.
use super::*;

fn set(key: &str, value: &str) -> Change {
    (key.to_string(), Some(vec![value.to_string()]))
}

fn clear(key: &str) -> Change {
    (key.to_string(), None)
}

#[test]
fn defaults_are_tritons_and_models_follow_the_global_settings() {
    let mut t = Tracer::default();
    let s = t.settings(None);
    assert_eq!(
        (s.level.clone(), s.rate, s.count, s.log_frequency),
        (vec!["OFF".to_string()], 1000, -1, 0)
    );
    assert_eq!(s.to_json()["trace_rate"], "1000");
    t.update(None, &[set("trace_level", "TIMESTAMPS")]).unwrap();
    assert_eq!(t.settings(Some("m")).level, vec!["TIMESTAMPS"]);
    t.update(Some("m"), &[set("trace_rate", "2")]).unwrap();
    assert_eq!(t.settings(Some("m")).rate, 2);
    assert_eq!(t.settings(Some("other")).rate, 1000, "only m changed");
    t.update(Some("m"), &[clear("trace_rate")]).unwrap();
    assert_eq!(t.settings(Some("m")).rate, 1000, "cleared: the global one again");
    assert!(t.models.is_empty());
}

#[test]
fn bad_settings_are_refused_with_tritons_words_and_change_nothing() {
    let mut t = Tracer::default();
    let before = t.settings(None);
    for (change, words) in [
        (set("trace_rate", "x"), "Unable to parse 'trace_rate', got: x"),
        (set("trace_rate", "0"), "sample rate must be non-zero"),
        (set("trace_count", "-5"), "Expecting value >= -1, got:-5"),
        (set("trace_level", "LOUD"), "got 'LOUD'"),
        (
            set("trace_file", "/tmp/x"),
            "can not be updated through network protocol",
        ),
    ] {
        let e = t.update(None, &[set("trace_level", "TIMESTAMPS"), change]).unwrap_err();
        assert!(e.message.contains(words), "{}", e.message);
        assert_eq!(e.code, crate::Code::InvalidArgument);
    }
    assert_eq!(t.settings(None), before, "all or nothing");
    t.update(None, &[set("no_such_setting", "1")]).unwrap();
}

#[test]
fn one_request_in_each_rate_is_traced_until_the_count_is_used_up() {
    let mut t = Tracer::default();
    assert_eq!(t.sample("m"), None, "OFF traces nothing");
    t.update(
        None,
        &[
            set("trace_level", "TIMESTAMPS"),
            set("trace_rate", "2"),
            set("trace_count", "2"),
        ],
    )
    .unwrap();
    let traced: Vec<bool> = (0..8).map(|_| t.sample("m").is_some()).collect();
    assert_eq!(traced, [true, false, true, false, false, false, false, false]);
    assert_eq!(t.settings(None).count, 0, "the count shows what is left");
    t.update(Some("n"), &[set("trace_count", "1"), set("trace_rate", "1")])
        .unwrap();
    assert!(t.sample("n").is_some() && t.sample("n").is_none());
    assert_eq!(t.settings(Some("n")).count, 0);
}

#[test]
fn traces_are_written_every_log_frequency_traces_or_at_the_end() {
    let mut t = Tracer::default();
    t.configure(
        "/tmp/trace.json".into(),
        &[set("trace_level", "TIMESTAMPS"), set("log_frequency", "2")],
    )
    .unwrap();
    let trace = |id| Trace {
        id,
        model: "m".into(),
        version: 1,
        request_id: "r".into(),
        stamps: vec![("REQUEST_START", 5), ("REQUEST_END", 9)],
    };
    assert!(t.finish(&trace(1)).is_none());
    let (path, entries) = t.finish(&trace(2)).unwrap();
    assert_eq!(path, "/tmp/trace.json.0");
    assert_eq!(entries.len(), 6, "per trace: who it is, then one entry per timestamp");
    assert_eq!(entries[0]["model_name"], "m");
    assert_eq!(entries[1]["timestamps"][0]["name"], "REQUEST_START");
    assert!(t.finish(&trace(3)).is_none());
    assert_eq!(t.drain().unwrap().0, "/tmp/trace.json");
    assert!(t.drain().is_none());
}

#[test]
fn trace_config_flags_read_as_tritonserver_s() {
    let flags = [
        "triton,file=/tmp/t.json",
        "level=TIMESTAMPS",
        "rate=1",
        "log-frequency=3",
    ]
    .map(String::from);
    let (file, changes) = from_flags(&flags).unwrap();
    assert_eq!(file, "/tmp/t.json");
    let mut t = Tracer::default();
    t.configure(file, &changes).unwrap();
    let s = t.settings(None);
    assert_eq!((s.rate, s.log_frequency, s.file.as_str()), (1, 3, "/tmp/t.json"));
    assert!(from_flags(&["bogus=1".into()])
        .unwrap_err()
        .contains("unknown setting 'bogus'"));
}

#[test]
fn the_monotonic_clock_orders_instants() {
    let a = Instant::now();
    let b = a + std::time::Duration::from_micros(5);
    assert_eq!(ns(b) - ns(a), 5_000);
}

#[test]
fn held_traces_are_bounded() {
    let trace = |id| Trace {
        id,
        model: "m".into(),
        version: 1,
        request_id: String::new(),
        stamps: vec![("REQUEST_START", 5)],
    };
    // No trace file: nothing is kept.
    let mut t = Tracer::default();
    t.configure(String::new(), &[set("trace_level", "TIMESTAMPS")]).unwrap();
    for id in 0..100 {
        assert!(t.finish(&trace(id)).is_none());
    }
    assert!(t.drain().is_none());
    // log_frequency 0 (write at exit): written once MAX_HELD_TRACES are held.
    let mut t = Tracer::default();
    t.configure(
        "/tmp/t.json".into(),
        &[set("trace_level", "TIMESTAMPS"), set("log_frequency", "0")],
    )
    .unwrap();
    for id in 1..MAX_HELD_TRACES {
        assert!(t.finish(&trace(id)).is_none());
    }
    let (path, entries) = t.finish(&trace(MAX_HELD_TRACES)).unwrap();
    assert_eq!(path, "/tmp/t.json.0");
    assert_eq!(entries.len() as u64, 2 * MAX_HELD_TRACES);
    assert!(t.drain().is_none());
}
