//! Tests of trace settings (defaults, refusals, rate and count, log frequency, flags), which file
//! each setting's traces go to, and the trace clock.
use super::*;

/// The one file due.
fn one(mut due: Vec<tracer::Write>) -> tracer::Write {
    assert_eq!(due.len(), 1, "one file due: {due:?}");
    due.pop().unwrap()
}

fn set(key: &str, value: &str) -> Change {
    (key.to_string(), Some(vec![value.to_string()]))
}

fn clear(key: &str) -> Change {
    (key.to_string(), None)
}

/// A tracer started with a trace file and `changes` (as `--trace-config`).
fn started(changes: &[Change]) -> Tracer {
    let mut t = Tracer::default();
    t.configure("/tmp/trace.json".into(), changes).unwrap();
    t
}

fn trace(id: u64, model: &str) -> Trace {
    Trace {
        id,
        model: model.into(),
        version: 1,
        request_id: "r".into(),
        parent_id: None,
        stamps: vec![("REQUEST_START", 5), ("REQUEST_END", 9)],
    }
}

#[test]
fn defaults_are_tritons_and_models_follow_the_global_settings() {
    let mut t = started(&[]);
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
    let mut t = started(&[]);
    let before = t.settings(None);
    for (change, words) in [
        (set("trace_rate", "x"), "Unable to parse 'trace_rate', got: x"),
        (set("trace_rate", "0"), "sample rate must be non-zero"),
        (set("trace_count", "-5"), "Expecting value >= -1, got:-5"),
        (set("trace_level", "LOUD"), "got 'LOUD'"),
        (
            set("trace_rate", "10000000000"),
            "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ], got: 10000000000",
        ),
        (
            set("trace_count", "10000000000"),
            "Unable to parse 'trace_count', value is out of range [ -1, 2147483647 ], got: 10000000000",
        ),
        (
            set("log_frequency", "10000000000"),
            "Unable to parse 'log_frequency', value is out of range [ 0, 4294967295 ], got: 10000000000",
        ),
        (set("trace_rate", "99999999999999999999999"), "value is out of range"),
        (
            ("trace_level".to_string(), Some(vec!["OFF".into(), "TIMESTAMPS".into()])),
            "Expect only one trace level 'OFF' is specified",
        ),
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
fn the_rate_th_request_is_traced_until_the_count_is_used_up() {
    let mut t = started(&[]);
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
    assert_eq!(traced, [false, true, false, true, false, false, false, false]);
    assert_eq!(t.settings(None).count, 0, "the count shows what is left");
    t.update(Some("n"), &[set("trace_count", "1"), set("trace_rate", "1")])
        .unwrap();
    assert!(t.sample("n").is_some() && t.sample("n").is_none());
    assert_eq!(t.settings(Some("n")).count, 0);
}

#[test]
fn models_on_the_server_setting_share_its_rate_and_a_change_starts_counting_again() {
    let mut t = started(&[set("trace_level", "TIMESTAMPS"), set("trace_rate", "3")]);
    // m and n both follow the server's setting: every third request of the two together.
    let traced: Vec<bool> = ["m", "n", "m", "n", "m", "n"]
        .iter()
        .map(|m| t.sample(m).is_some())
        .collect();
    assert_eq!(traced, [false, false, true, false, false, true]);
    t.sample("m");
    t.update(None, &[set("trace_rate", "2")]).unwrap();
    assert_eq!(
        (0..4).map(|_| t.sample("m").is_some()).collect::<Vec<_>>(),
        [false, true, false, true],
        "a new setting counts from zero"
    );
    // A model's own setting has its own counters; a server change remakes it over the new one.
    t.update(Some("m"), &[set("trace_count", "5")]).unwrap();
    assert!(t.sample("m").is_none() && t.sample("m").is_some());
    assert_eq!(t.settings(Some("m")).count, 4);
    assert_eq!(t.settings(None).count, -1, "the server's count is not the model's");
    t.update(None, &[set("trace_rate", "1")]).unwrap();
    let m = t.settings(Some("m"));
    assert_eq!((m.rate, m.count), (1, 4), "the model's given count keeps what is left");
}

#[test]
fn clearing_a_server_setting_returns_it_to_the_start_up_value() {
    let mut t = started(&[set("trace_level", "TIMESTAMPS"), set("trace_rate", "7")]);
    t.update(None, &[set("trace_rate", "2"), set("trace_level", "OFF")])
        .unwrap();
    let s = t.update(None, &[clear("trace_rate"), clear("trace_level")]).unwrap();
    assert_eq!((s.rate, s.level), (7, vec!["TIMESTAMPS".to_string()]));
    t.update(Some("m"), &[set("trace_rate", "4")]).unwrap();
    assert_eq!(t.update(Some("m"), &[clear("trace_rate")]).unwrap().rate, 7);
}

#[test]
fn tracing_without_a_trace_file_is_refused_but_a_start_up_setting_is_kept() {
    let mut t = Tracer::default();
    let e = t.update(None, &[set("trace_level", "TIMESTAMPS")]).unwrap_err();
    assert!(e.message.contains("trace file name is not given"), "{}", e.message);
    assert_eq!(t.settings(None).level, vec!["OFF"]);
    t.configure(String::new(), &[set("trace_level", "TIMESTAMPS")]).unwrap();
    assert_eq!(t.settings(None).level, vec!["TIMESTAMPS"]);
    assert_eq!(t.sample("m"), None, "nothing to write to: nothing traced");
}

#[test]
fn traces_are_written_at_once_when_the_count_is_used_up() {
    let mut t = started(&[set("trace_level", "TIMESTAMPS"), set("trace_rate", "1")]);
    t.update(Some("m"), &[set("trace_count", "2")]).unwrap();
    let (a, b) = (t.sample("m").unwrap(), t.sample("m").unwrap());
    assert!(t.sample("m").is_none());
    assert!(t.finish(&trace(a, "m")).is_empty(), "one trace still running");
    let (path, entries) = one(t.finish(&trace(b, "m")));
    assert_eq!(path, "/tmp/trace.json.0");
    assert_eq!(entries.len(), 6);
    assert!(t.drain().is_empty());
}

#[test]
fn traces_are_written_every_log_frequency_traces_or_at_the_end() {
    let mut t = started(&[set("trace_level", "TIMESTAMPS"), set("log_frequency", "2")]);
    let trace = |id| trace(id, "m");
    assert!(t.finish(&trace(1)).is_empty());
    let (path, entries) = one(t.finish(&trace(2)));
    assert_eq!(path, "/tmp/trace.json.0");
    assert_eq!(entries.len(), 6, "per trace: who it is, then one entry per timestamp");
    assert_eq!(entries[0]["model_name"], "m");
    assert_eq!(entries[1]["timestamps"][0]["name"], "REQUEST_START");
    assert!(t.finish(&trace(3)).is_empty());
    // At exit a setting with a log_frequency writes what it holds to the next .<n> (Triton's rule).
    assert_eq!(one(t.drain()).0, "/tmp/trace.json.1");
    assert!(t.drain().is_empty());
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
        parent_id: None,
        stamps: vec![("REQUEST_START", 5)],
    };
    // No trace file: nothing is kept.
    let mut t = Tracer::default();
    t.configure(String::new(), &[set("trace_level", "TIMESTAMPS")]).unwrap();
    for id in 0..100 {
        assert!(t.finish(&trace(id)).is_empty());
    }
    assert!(t.drain().is_empty());
    // log_frequency 0 (write at exit): written once MAX_HELD_TRACES are held.
    let mut t = Tracer::default();
    t.configure(
        "/tmp/t.json".into(),
        &[set("trace_level", "TIMESTAMPS"), set("log_frequency", "0")],
    )
    .unwrap();
    for id in 1..MAX_HELD_TRACES {
        assert!(t.finish(&trace(id)).is_empty());
    }
    let (path, entries) = one(t.finish(&trace(MAX_HELD_TRACES)));
    assert_eq!(path, "/tmp/t.json.0");
    assert_eq!(entries.len() as u64, 2 * MAX_HELD_TRACES);
    assert!(t.drain().is_empty());
}

#[test]
fn a_child_trace_is_made_whatever_the_settings_and_goes_with_its_parent() {
    assert_eq!(Tracer::default().child(1), None, "no trace file: nothing to write to");
    let mut t = started(&[set("log_frequency", "1")]);
    assert_eq!(t.sample("m"), None, "OFF: the model's own requests are not traced");
    t.update(
        Some("outer"),
        &[set("trace_level", "TIMESTAMPS"), set("trace_rate", "1")],
    )
    .unwrap();
    let parent = t.sample("outer").unwrap();
    let id = t.child(parent).unwrap();
    let mut child = trace(id, "m");
    child.parent_id = Some(parent);
    assert!(
        t.finish(&child).is_empty(),
        "a child is written with its parent, not counted on its own"
    );
    let (_, entries) = one(t.finish(&trace(parent, "outer")));
    assert_eq!(
        (entries[0]["id"].as_u64(), entries[0]["parent_id"].as_u64()),
        (Some(id), Some(parent))
    );
    assert!(
        entries[3].get("parent_id").is_none(),
        "a trace of its own has no parent_id"
    );
    assert_eq!(entries[3]["model_name"], "outer");
}

#[test]
fn each_setting_writes_its_own_traces() {
    // Triton's L0_trace (count): 4 traces held by the first setting (no count, no frequency); a
    // change of count makes a new setting, which writes its 2 to trace_file.0 once its count is
    // used up; the first setting's go to trace_file at exit.
    let mut t = started(&[set("trace_level", "TIMESTAMPS"), set("trace_rate", "1")]);
    for _ in 0..4 {
        let id = t.sample("m").unwrap();
        assert!(t.finish(&trace(id, "m")).is_empty());
    }
    t.update(None, &[set("trace_count", "2")]).unwrap();
    assert!(
        t.take_due().is_empty(),
        "the replaced setting holds its traces until exit"
    );
    let (a, b) = (t.sample("m").unwrap(), t.sample("m").unwrap());
    assert_eq!(t.sample("m"), None, "the count is used up");
    assert!(t.finish(&trace(a, "m")).is_empty());
    let (path, entries) = one(t.finish(&trace(b, "m")));
    assert_eq!((path.as_str(), entries.len()), ("/tmp/trace.json.0", 2 * 3));
    let (path, entries) = one(t.drain());
    assert_eq!((path.as_str(), entries.len()), ("/tmp/trace.json", 4 * 3));
}

#[test]
fn a_replaced_setting_writes_once_its_last_trace_is_in() {
    let mut t = started(&[
        set("trace_level", "TIMESTAMPS"),
        set("trace_rate", "1"),
        set("log_frequency", "3"),
    ]);
    let done = t.sample("m").unwrap();
    assert!(t.finish(&trace(done, "m")).is_empty());
    let running = t.sample("m").unwrap();
    t.update(None, &[set("trace_rate", "5")]).unwrap();
    assert!(t.take_due().is_empty(), "one of its traces still runs");
    // The old setting's last trace: it holds two, and with a log_frequency they go to a .<n> file.
    let (path, entries) = one(t.finish(&trace(running, "m")));
    assert_eq!((path.as_str(), entries.len()), ("/tmp/trace.json.0", 2 * 3));
    // A setting replaced with nothing running writes at once.
    let id = (0..5).find_map(|_| t.sample("m")).unwrap();
    assert!(t.finish(&trace(id, "m")).is_empty());
    t.update(None, &[clear("trace_rate")]).unwrap();
    let (path, entries) = one(t.take_due());
    assert_eq!((path.as_str(), entries.len()), ("/tmp/trace.json.1", 3));
    assert!(t.drain().is_empty());
}

/// A tracer in OpenTelemetry mode, started with `changes`.
fn otel(changes: &[Change]) -> Tracer {
    let mut t = Tracer::default();
    let config = vec![
        ("url".to_string(), "localhost:10000/v1/traces".to_string()),
        ("resource".to_string(), "a=1".to_string()),
        ("resource".to_string(), "b=2".to_string()),
        ("bsp_max_queue_size".to_string(), "2048".to_string()),
    ];
    t.configure_mode(Mode::OpenTelemetry, config, String::new(), changes)
        .unwrap();
    t
}

#[test]
fn opentelemetry_settings_show_the_mode_and_its_settings_in_tritons_order() {
    let mut t = otel(&[set("trace_level", "TIMESTAMPS"), set("trace_rate", "0")]);
    let s = t.settings(Some("m"));
    assert_eq!(
        s.to_text(),
        r#"{"trace_level":["TIMESTAMPS"],"trace_rate":"0","trace_count":"-1","trace_mode":"opentelemetry","url":"localhost:10000/v1/traces","resource":"a=1","resource":"b=2","bsp_max_queue_size":"2048"}"#
    );
    let pairs = s.pairs();
    let names: Vec<&str> = pairs.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names,
        [
            "trace_level",
            "trace_rate",
            "trace_count",
            "trace_mode",
            "url",
            "resource",
            "bsp_max_queue_size"
        ]
    );
    assert_eq!(pairs[5].1, ["a=1", "b=2"], "a repeated setting: one name, its values");
    // The trace file is refused as Triton refuses it (UNSUPPORTED); the mode and the
    // OpenTelemetry settings are not settings here (ignored); log_frequency is taken, unseen.
    let e = t.update(None, &[set("trace_file", "/tmp/x")]).unwrap_err();
    assert_eq!(e.code, crate::error::Code::Unsupported);
    let s = t
        .update(
            None,
            &[
                set("trace_mode", "triton"),
                set("url", "x"),
                set("log_frequency", "3"),
                set("trace_rate", "5"),
            ],
        )
        .unwrap();
    assert_eq!((s.mode, s.rate), (Mode::OpenTelemetry, 5));
    assert!(!s.to_text().contains("log_frequency") && !s.to_text().contains("trace_file"));
    assert!(t.update(None, &[set("trace_rate", "0")]).is_err(), "0 only at start-up");
}

#[test]
fn a_context_forces_sampling_while_the_level_traces() {
    // rate 0: only requests with a context.
    let mut t = otel(&[set("trace_level", "TIMESTAMPS"), set("trace_rate", "0")]);
    assert_eq!(t.sample_otel("m", false), None);
    assert!(t.sample_otel("m", true).is_some());
    // count 1, rate 5: the fifth request takes the count; then only requests with a context,
    // which are still counted towards the rate.
    let mut t = otel(&[
        set("trace_level", "TIMESTAMPS"),
        set("trace_rate", "5"),
        set("trace_count", "1"),
    ]);
    let traced: Vec<bool> = (0..10).map(|_| t.sample_otel("m", false).is_some()).collect();
    assert_eq!(
        traced,
        [false, false, false, false, true, false, false, false, false, false]
    );
    assert_eq!(t.settings(None).count, 0);
    assert!(t.sample_otel("m", true).is_some(), "with a context: traced");
    assert_eq!(
        t.sample("m"),
        None,
        "trace file mode's entry point is OpenTelemetry's here"
    );
    // A context on a rate hit takes one from the count.
    let mut t = otel(&[
        set("trace_level", "TIMESTAMPS"),
        set("trace_rate", "2"),
        set("trace_count", "3"),
    ]);
    assert!(t.sample_otel("m", false).is_none());
    assert!(t.sample_otel("m", true).is_some());
    assert_eq!(t.settings(None).count, 2);
    // Level OFF: nothing, context or not.
    let mut t = otel(&[]);
    assert_eq!(t.sample_otel("m", true), None);
    // Children need no trace file in this mode.
    assert!(t.child(1).is_some());
}
