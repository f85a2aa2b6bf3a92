//! Tests of the membership table and its routing snapshot, on a fake clock.
use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh::config::ModelConfig;
use mesh::Code;

use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn status(name: &str, version: i64, ready: bool) -> ModelStatus {
    ModelStatus {
        name: name.into(),
        version,
        ready,
        reason: if ready { String::new() } else { "loading".into() },
        config: Arc::new(ModelConfig {
            name: name.into(),
            max_batch_size: version as i32,
            ..ModelConfig::default()
        }),
        placed: false,
    }
}

fn hello(name: &str, incarnation: u64, models: Vec<ModelStatus>) -> NodeHello {
    NodeHello {
        name: name.into(),
        incarnation,
        address: format!("10.0.0.{}:7000", name.len()),
        devices: vec!["cpu".into()],
        models,
        memory: 1 << 30,
        key: None,
    }
}

/// Joins a hello that must be admitted.
fn join(m: &mut Membership, link: LinkId, hello: NodeHello, now: Instant) -> Joined {
    m.join(link, hello, now).expect("admitted")
}

fn keyed(name: &str, incarnation: u64, key: u8) -> NodeHello {
    NodeHello {
        key: Some([key; 32]),
        ..hello(name, incarnation, vec![status("m", 1, true)])
    }
}

#[test]
fn a_live_members_name_is_not_taken_over_by_another_key() {
    let t0 = Instant::now();
    let mut m = Membership::new(MembershipSettings::default());
    assert_eq!(m.join(1, keyed("a", 100, 7), t0), Ok(Joined::New));
    let g = m.generation();
    let refused = m
        .join(2, keyed("a", 200, 8), t0 + ms(10))
        .expect_err("another key is refused");
    assert!(refused.contains("held by a live member"), "{refused}");
    assert_eq!(m.generation(), g, "a refused hello changes nothing");
    assert_eq!(m.node_of(1), Some("a"));
    assert_eq!(m.node_of(2), None);
    // The same key is the same node restarting: it replaces the member.
    assert_eq!(
        m.join(3, keyed("a", 300, 7), t0 + ms(20)),
        Ok(Joined::Replaced {
            old_incarnation: 100,
            old_link: Some(1)
        })
    );
    // Once the member is lost (or left), another key may take the name.
    assert!(m.link_lost(3, t0 + ms(30)));
    assert!(m.admits("a", Some(&[8; 32])).is_ok());
    assert!(matches!(
        m.join(4, keyed("a", 400, 8), t0 + ms(40)),
        Ok(Joined::Replaced { .. })
    ));
    assert_eq!(m.node_of(4), Some("a"));
}

fn load(name: &str, version: i64, inflight: u32, queued: u32) -> ModelLoad {
    ModelLoad {
        name: name.into(),
        version,
        inflight,
        queued,
        exec_us: 100,
    }
}

fn links(m: &Membership, model: &str, version: &str) -> Vec<LinkId> {
    let table = m.routing_table();
    let mut l: Vec<LinkId> = table
        .resolve(model, version)
        .map(|r| r.replicas.iter().map(|r| r.link).collect())
        .unwrap_or_default();
    l.sort();
    l
}

fn two_nodes(t0: Instant) -> Membership {
    let mut m = Membership::new(MembershipSettings::default());
    assert_eq!(
        join(&mut m, 1, hello("a", 100, vec![status("m", 1, true)]), t0),
        Joined::New
    );
    assert_eq!(
        join(&mut m, 2, hello("b", 200, vec![status("m", 1, true)]), t0),
        Joined::New
    );
    m
}

#[test]
fn joined_nodes_are_routable_with_their_reported_load() {
    let t0 = Instant::now();
    let mut m = two_nodes(t0);
    assert_eq!(links(&m, "m", "1"), vec![1, 2]);
    assert!(m.report(2, vec![load("m", 1, 3, 7)], t0 + ms(250)));
    let table = m.routing_table();
    let r = table.resolve("m", "").unwrap();
    let b = r.replicas.iter().find(|r| r.link == 2).unwrap();
    assert_eq!((b.node.as_str(), b.inflight, b.queued, b.exec_us), ("b", 3, 7, 100));
    // The same report again changes nothing; a report that omits the version zeroes its load.
    assert!(!m.report(2, vec![load("m", 1, 3, 7)], t0 + ms(500)));
    assert!(m.report(2, vec![], t0 + ms(750)));
    assert_eq!(m.routing_table().resolve("m", "").unwrap().replicas[1].queued, 0);
}

#[test]
fn rejoin_with_the_same_incarnation_closes_the_old_link() {
    let t0 = Instant::now();
    let mut m = two_nodes(t0);
    let g = m.generation();
    let joined = join(&mut m, 3, hello("a", 100, vec![status("m", 1, true)]), t0 + ms(10));
    assert_eq!(joined, Joined::Rejoined { old_link: Some(1) });
    assert_eq!(joined.link_to_close(), Some(1));
    assert!(m.generation() > g);
    assert_eq!(links(&m, "m", "1"), vec![2, 3]);
    // Late events of the old link are ignored, including its loss.
    assert!(!m.link_lost(1, t0 + ms(20)));
    assert!(!m.draining(1, t0 + ms(20)));
    assert_eq!(m.state("a"), Some(NodeState::Up));
    assert_eq!(m.node_of(3), Some("a"));
    assert_eq!(m.node_of(1), None);
}

#[test]
fn restart_with_a_new_incarnation_replaces_the_member() {
    let t0 = Instant::now();
    let mut m = two_nodes(t0);
    let joined = join(&mut m, 3, hello("a", 101, vec![status("m", 2, true)]), t0);
    assert_eq!(
        joined,
        Joined::Replaced {
            old_incarnation: 100,
            old_link: Some(1)
        }
    );
    // The new process's models replace the old ones.
    assert_eq!(links(&m, "m", "1"), vec![2]);
    assert_eq!(links(&m, "m", "2"), vec![3]);
    let a = m.nodes(t0).into_iter().find(|n| n.name == "a").unwrap();
    assert_eq!((a.incarnation, a.link), (101, Some(3)));
}

#[test]
fn rejoin_after_loss_has_no_link_to_close() {
    let t0 = Instant::now();
    let mut m = two_nodes(t0);
    assert!(m.link_lost(1, t0));
    assert_eq!(m.state("a"), Some(NodeState::Lost));
    let joined = join(&mut m, 3, hello("a", 100, vec![status("m", 1, true)]), t0 + ms(10));
    assert_eq!(joined, Joined::Rejoined { old_link: None });
    assert_eq!(m.state("a"), Some(NodeState::Up));
    let joined = join(&mut m, 3, hello("a", 100, vec![status("m", 1, true)]), t0 + ms(20));
    assert_eq!(
        joined,
        Joined::Rejoined { old_link: None },
        "a second hello on the same link"
    );
}

#[test]
fn a_hello_for_another_name_on_a_used_link_drops_the_first_node() {
    let t0 = Instant::now();
    let mut m = two_nodes(t0);
    assert_eq!(
        join(&mut m, 1, hello("c", 300, vec![status("m", 1, true)]), t0),
        Joined::New
    );
    assert_eq!(m.state("a"), None);
    assert_eq!(m.node_of(1), Some("c"));
}

#[test]
fn silence_makes_a_node_unroutable_until_it_reports() {
    let t0 = Instant::now();
    let mut m = two_nodes(t0);
    m.report(1, vec![], t0 + ms(500));
    assert!(!m.tick(t0 + ms(2000) - ms(1)));
    // b was last heard at its join (t0), a at t0 + 500 ms.
    assert!(m.tick(t0 + ms(2000)));
    assert_eq!(m.state("b"), Some(NodeState::Silent));
    assert_eq!(m.state("a"), Some(NodeState::Up));
    assert_eq!(links(&m, "m", "1"), vec![1]);
    assert!(!m.tick(t0 + ms(2100)), "already silent: no change");
    assert!(m.report(2, vec![], t0 + ms(2200)));
    assert_eq!(m.state("b"), Some(NodeState::Up));
    assert_eq!(links(&m, "m", "1"), vec![1, 2]);
    let b = m.nodes(t0 + ms(2300)).into_iter().find(|n| n.name == "b").unwrap();
    assert_eq!(b.last_report_age, Some(ms(100)));
}

#[test]
fn draining_nodes_are_not_routable_and_goodbye_leaves_them_known_but_unroutable() {
    let t0 = Instant::now();
    let mut m = two_nodes(t0);
    assert!(m.draining(1, t0));
    assert!(!m.draining(1, t0), "draining twice changes nothing");
    assert_eq!(m.state("a"), Some(NodeState::Draining));
    assert_eq!(links(&m, "m", "1"), vec![2]);
    // Draining stays through reports.
    m.report(1, vec![], t0 + ms(10));
    assert_eq!(m.state("a"), Some(NodeState::Draining));
    assert!(m.goodbye(1, t0 + ms(20)));
    assert_eq!(m.state("a"), Some(NodeState::Left));
    let a = m.nodes(t0 + ms(20)).into_iter().find(|n| n.name == "a").unwrap();
    assert_eq!((a.state.as_str(), a.link), ("left", None));
    assert_eq!(links(&m, "m", "1"), vec![2]);
    assert!(
        !m.goodbye(1, t0 + ms(30)),
        "a second goodbye on the gone link changes nothing"
    );
    // A node that left is forgotten like a lost one.
    m.tick(t0 + ms(20) + MembershipSettings::default().forget_lost_after + ms(1));
    assert_eq!(m.state("a"), None);
}

#[test]
fn lost_nodes_are_kept_for_status_then_forgotten() {
    let t0 = Instant::now();
    let mut m = two_nodes(t0);
    assert!(m.link_lost(1, t0));
    assert_eq!(links(&m, "m", "1"), vec![2]);
    let a = m.nodes(t0).into_iter().find(|n| n.name == "a").unwrap();
    assert_eq!((a.state, a.link), (NodeState::Lost, None));
    m.report(2, vec![], t0 + ms(59_000));
    m.tick(t0 + ms(59_999));
    assert_eq!(m.state("a"), Some(NodeState::Lost));
    assert!(m.tick(t0 + ms(60_000)));
    assert_eq!(m.state("a"), None);
}

#[test]
fn events_for_unknown_links_are_ignored() {
    let t0 = Instant::now();
    let mut m = two_nodes(t0);
    let g = m.generation();
    assert!(!m.model_event(9, ModelEvent::Update(status("x", 1, true)), t0));
    assert!(!m.model_event(
        9,
        ModelEvent::Removed {
            name: "m".into(),
            version: 1
        },
        t0
    ));
    assert!(!m.report(9, vec![load("m", 1, 1, 1)], t0));
    assert!(!m.draining(9, t0));
    assert!(!m.goodbye(9, t0));
    assert!(!m.link_lost(9, t0));
    assert_eq!(m.generation(), g);
    assert_eq!(links(&m, "m", "1"), vec![1, 2]);
}

#[test]
fn model_events_add_ready_and_remove_versions() {
    let t0 = Instant::now();
    let mut m = two_nodes(t0);
    assert!(m.model_event(1, ModelEvent::Update(status("m", 2, false)), t0));
    // Version 2 is known but not ready: the empty version stays at 1, version 2 must wait.
    assert_eq!(m.routing_table().resolve("m", "").unwrap().version, 1);
    match m.routing_table().resolve("m", "2") {
        Err(ResolveError::NoReplica { reason }) => assert_eq!(
            reason,
            "version 2 of model 'm' has no available replica (node 'a': loading)"
        ),
        other => panic!("expected no replica, got {other:?}"),
    }
    assert!(m.model_event(1, ModelEvent::Update(status("m", 2, true)), t0));
    let table = m.routing_table();
    let r = table.resolve("m", "").unwrap();
    assert_eq!((r.version, r.replicas.len(), r.replicas[0].link), (2, 1, 1));
    assert!(m.model_event(
        1,
        ModelEvent::Removed {
            name: "m".into(),
            version: 2
        },
        t0
    ));
    assert!(!m.model_event(
        1,
        ModelEvent::Removed {
            name: "m".into(),
            version: 2
        },
        t0
    ));
    assert!(matches!(
        m.routing_table().resolve("m", "2"),
        Err(ResolveError::NotFound(_))
    ));
}

#[test]
fn resolve_errors_distinguish_unknown_invalid_and_waiting() {
    let t0 = Instant::now();
    let mut m = two_nodes(t0);
    let table = m.routing_table();
    let e: mesh::Error = table.resolve("nope", "").unwrap_err().into();
    assert_eq!(
        (e.code, e.message.as_str()),
        (Code::NotFound, "unknown model: 'nope' is not found")
    );
    let e: mesh::Error = table.resolve("m", "x").unwrap_err().into();
    assert_eq!(
        (e.code, e.message.as_str()),
        (Code::InvalidArgument, "model version 'x' is not a number")
    );
    let e: mesh::Error = table.resolve("m", "7").unwrap_err().into();
    assert_eq!(
        (e.code, e.message.as_str()),
        (Code::NotFound, "version 7 of model 'm' is not available")
    );
    m.draining(1, t0);
    m.link_lost(2, t0);
    match m.routing_table().resolve("m", "") {
        Err(ResolveError::NoReplica { reason }) => assert_eq!(
            reason,
            "model 'm' has no available replica (version 1: node 'a' is draining, node 'b' was lost)"
        ),
        other => panic!("expected no replica, got {other:?}"),
    }
    let e: mesh::Error = m.routing_table().resolve("m", "1").unwrap_err().into();
    assert_eq!(e.code, Code::Unavailable);
}

#[test]
fn model_view_prefers_ready_versions_and_routable_configs() {
    let t0 = Instant::now();
    let mut m = Membership::new(MembershipSettings::default());
    join(
        &mut m,
        1,
        hello("a", 1, vec![status("m", 1, true), status("m", 3, false)]),
        t0,
    );
    join(&mut m, 2, hello("b", 2, vec![status("m", 2, true)]), t0);
    let table = m.routing_table();
    let v = table.model_view("m", "").unwrap();
    assert_eq!((v.version, v.ready, v.ready_versions.clone()), (2, true, vec![1, 2]));
    assert_eq!(v.config.max_batch_size, 2);
    let v3 = table.model_view("m", "3").unwrap();
    assert_eq!((v3.version, v3.ready), (3, false));
    assert_eq!(table.model_view("x", "").unwrap_err().code, Code::NotFound);
    assert_eq!(table.model_view("m", "9").unwrap_err().code, Code::NotFound);
    assert_eq!(table.model_view("m", "v").unwrap_err().code, Code::InvalidArgument);
    // Nothing routable: the view still answers (not ready), from the highest known version.
    m.draining(1, t0);
    m.draining(2, t0);
    let v = m.routing_table().model_view("m", "").unwrap();
    assert_eq!((v.version, v.ready, v.ready_versions.is_empty()), (3, false, true));
}

#[test]
fn index_rows_carry_state_reasons_and_nodes() {
    let t0 = Instant::now();
    let mut m = two_nodes(t0);
    m.model_event(2, ModelEvent::Update(status("n", 4, false)), t0);
    m.draining(2, t0);
    let rows = m.routing_table().index();
    assert_eq!(rows.len(), 2);
    assert_eq!(
        (rows[0].name.as_str(), rows[0].version, rows[0].state),
        ("m", 1, "READY")
    );
    assert_eq!(rows[0].nodes, vec!["a", "b"]);
    assert_eq!(rows[0].reason, "");
    assert_eq!((rows[1].name.as_str(), rows[1].state), ("n", "UNAVAILABLE"));
    assert_eq!(rows[1].reason, "node 'b' is draining");
    let entry = rows[1].entry();
    assert_eq!((entry.version.as_str(), entry.state.as_str()), ("4", "UNAVAILABLE"));
}

#[test]
fn readiness_needs_an_up_node_with_a_ready_model() {
    let t0 = Instant::now();
    let mut m = Membership::new(MembershipSettings::default());
    assert!(!m.ready() && !m.routing_table().ready());
    join(&mut m, 1, hello("a", 1, vec![status("m", 1, false)]), t0);
    assert!(!m.ready() && !m.routing_table().ready());
    m.model_event(1, ModelEvent::Update(status("m", 1, true)), t0);
    assert!(m.ready() && m.routing_table().ready());
    m.tick(t0 + ms(5000));
    assert!(!m.ready() && !m.routing_table().ready(), "a silent node does not count");
}

#[test]
fn node_summaries_describe_each_node() {
    let t0 = Instant::now();
    let m = two_nodes(t0);
    let nodes = m.nodes(t0 + ms(5));
    assert_eq!(nodes.len(), 2);
    let a = &nodes[0];
    assert_eq!(
        (a.name.as_str(), a.incarnation, a.address.as_str(), a.state, a.link),
        ("a", 100, "10.0.0.1:7000", NodeState::Up, Some(1))
    );
    assert_eq!(a.devices, vec!["cpu"]);
    assert_eq!(a.memory, 1 << 30);
    assert_eq!(a.last_report_age, None);
    assert_eq!(
        a.models,
        vec![NodeModel {
            name: "m".into(),
            version: 1,
            ready: true,
            reason: String::new(),
            placed: false,
            inflight: 0,
        }]
    );
    assert_eq!(NodeState::Silent.as_str(), "silent");
}
