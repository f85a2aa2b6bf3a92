//! The two sessions as an in-memory pair on virtual time: frames travel with a fixed latency, the
//! router's handshake welcomes the hello, and each side's timeouts fire when due.
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::node::{self, NodeSession};
use super::router::{self, RouterSession};
use super::End;
use crate::cluster::fence::Fencing;
use crate::cluster::msg::{self, Message};

const LATENCY: Duration = Duration::from_millis(1);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn hello() -> msg::Hello {
    msg::Hello {
        name: "n".into(),
        incarnation: 7,
        devices: vec!["cpu".into()],
        http: String::new(),
        grpc: String::new(),
        models: vec![],
        memory: 0,
        arena: None,
    }
}

/// A router and a node with a control stream between them.
struct Pair {
    t0: Instant,
    t: Instant,
    router: RouterSession,
    node: NodeSession,
    welcomed: bool,
    to_router: VecDeque<(Instant, Message)>,
    to_node: VecDeque<(Instant, Message)>,
    fencing: Fencing,
    /// The router's in-flight count on the link.
    inflight: u32,
    at_router: Vec<(Duration, router::Effect)>,
    at_node: Vec<(Duration, node::Effect)>,
}

impl Pair {
    fn new() -> Self {
        let t0 = Instant::now();
        let (node, first) = NodeSession::start(hello(), t0);
        let mut pair = Pair {
            t0,
            t: t0,
            router: RouterSession::default(),
            node,
            welcomed: false,
            to_router: VecDeque::new(),
            to_node: VecDeque::new(),
            fencing: Fencing::default(),
            inflight: 0,
            at_router: vec![],
            at_node: vec![],
        };
        pair.node_effects(vec![first]);
        pair
    }

    fn node_effects(&mut self, effects: Vec<node::Effect>) {
        for e in effects {
            if let node::Effect::Send(m) = &e {
                self.to_router.push_back((self.t + LATENCY, m.clone()));
            }
            self.at_node.push((self.t - self.t0, e));
        }
    }

    fn router_effects(&mut self, effects: Vec<router::Effect>) {
        for e in effects {
            if let router::Effect::Send(m) = &e {
                self.to_node.push_back((self.t + LATENCY, m.clone()));
            }
            self.at_router.push((self.t - self.t0, e));
        }
    }

    /// The router (its placement, say) sends a command to the node.
    fn command(&mut self, m: Message) {
        self.to_node.push_back((self.t + LATENCY, m));
    }

    /// Steps every delivery and timeout due up to `end` (from the start), in time order.
    fn run_until(&mut self, end: Duration) {
        let end = self.t0 + end;
        loop {
            let next = [
                self.to_router.front().map(|f| f.0),
                self.to_node.front().map(|f| f.0),
                self.router.poll_timeout(),
                self.node.poll_timeout(),
            ]
            .into_iter()
            .flatten()
            .min();
            let Some(at) = next.filter(|&at| at <= end) else { break };
            self.t = self.t.max(at);
            if self.to_router.front().is_some_and(|f| f.0 <= at) {
                let (_, m) = self.to_router.pop_front().unwrap();
                if let (Message::Hello(_), false) = (&m, self.welcomed) {
                    // The router's handshake reads the hello and welcomes the node.
                    self.welcomed = true;
                    let welcome = msg::Welcome {
                        router: "r".into(),
                        link: 1,
                        arena: None,
                    };
                    self.to_node.push_back((self.t + LATENCY, Message::Welcome(welcome)));
                } else {
                    let effects = self.router.on_message(m, self.t);
                    self.router_effects(effects);
                }
            } else if self.to_node.front().is_some_and(|f| f.0 <= at) {
                let (_, m) = self.to_node.pop_front().unwrap();
                let effects = self.node.on_message(m, &self.fencing);
                self.node_effects(effects);
            } else if self.router.poll_timeout().is_some_and(|t| t <= at) {
                let effects = self.router.on_timeout(self.inflight, self.t);
                self.router_effects(effects);
            } else {
                let effects = self.node.on_timeout(self.t);
                self.node_effects(effects);
            }
        }
        self.t = self.t.max(end);
    }

    fn node_saw(&self, f: impl Fn(&node::Effect) -> bool) -> Option<Duration> {
        self.at_node.iter().find(|(_, e)| f(e)).map(|(t, _)| *t)
    }

    fn router_saw(&self, f: impl Fn(&router::Effect) -> bool) -> Option<Duration> {
        self.at_router.iter().find(|(_, e)| f(e)).map(|(t, _)| *t)
    }
}

#[test]
fn a_node_joins_drains_is_released_once_quiet_and_leaves() {
    let mut p = Pair::new();
    p.run_until(ms(10));
    assert_eq!(p.node_saw(|e| matches!(e, node::Effect::Joined(_))), Some(ms(2)));
    assert!(p.node.joined());
    assert_eq!(p.node.poll_timeout(), None, "no deadline once welcomed");

    // The node drains while the router still has a request on it.
    p.inflight = 1;
    let effects = p.node.on_drain();
    p.node_effects(effects);
    assert!(p.node.on_drain().is_empty(), "the drain is said once");
    p.run_until(ms(100));
    assert_eq!(p.router_saw(|e| matches!(e, router::Effect::Draining)), Some(ms(11)));
    assert_eq!(
        p.node_saw(|e| *e == node::Effect::Released),
        None,
        "not while a request is in flight"
    );

    // The request ends: two quiet checks 20 ms apart, then the release.
    p.inflight = 0;
    p.run_until(ms(200));
    let released = p.node_saw(|e| *e == node::Effect::Released).expect("released");
    assert!(
        released > ms(100) && released <= ms(100) + ms(41) + LATENCY,
        "released at {released:?}"
    );
    assert_eq!(p.router.poll_timeout(), None, "no checks after the release");

    let effects = p.node.on_leave();
    assert_eq!(effects.last(), Some(&node::Effect::End(End::Left)));
    p.node_effects(effects);
    p.run_until(ms(300));
    assert!(p.router_saw(|e| matches!(e, router::Effect::Goodbye)).is_some());
    assert!(p.router_saw(|e| matches!(e, router::Effect::End(End::Left))).is_some());
    assert!(p.node.on_leave().is_empty(), "the session is over");
}

#[test]
fn a_deposed_leaders_commands_are_refused_and_a_refused_place_is_answered() {
    let mut p = Pair::new();
    p.run_until(ms(10));
    let place = |epoch| {
        Message::Place(msg::Place {
            model: "m".into(),
            key: "k".into(),
            files: vec![],
            config: String::new(),
            epoch,
        })
    };
    p.command(Message::Fence(msg::Fence { epoch: 5 }));
    p.command(place(3));
    p.command(place(5));
    p.command(Message::Evict(msg::Evict {
        model: "m".into(),
        epoch: 4,
    }));
    p.command(Message::MayStop(msg::Fence { epoch: 6 }));
    p.run_until(ms(50));
    let kinds: Vec<String> = p.at_node.iter().skip(2).map(|(_, e)| format!("{e:?}")).collect();
    assert!(matches!(p.at_node[2].1, node::Effect::Leads(5)), "{kinds:?}");
    assert!(
        matches!(&p.at_node[3].1, node::Effect::Fenced { command: "place", why } if why.contains("epoch 5")),
        "{kinds:?}"
    );
    assert!(
        matches!(&p.at_node[5].1, node::Effect::Place(pl) if pl.epoch == 5),
        "{kinds:?}"
    );
    assert!(
        matches!(&p.at_node[6].1, node::Effect::Fenced { command: "evict", .. }),
        "{kinds:?}"
    );
    assert_eq!(p.at_node[7].1, node::Effect::MayStop, "{kinds:?}");
    // The refused Place reached the router's placement as a failure that says why.
    let refused = p.at_router.iter().find_map(|(_, e)| match e {
        router::Effect::Placed(pl) => Some(pl.clone()),
        _ => None,
    });
    assert!(refused.expect("answered").error.starts_with("fenced"));
    assert_eq!(p.fencing.highest(), 6);
}

#[test]
fn load_reports_closer_than_the_gap_are_dropped() {
    let mut s = RouterSession::default();
    let t0 = Instant::now();
    let report = || Message::LoadReport(msg::LoadReport { models: vec![] });
    let kept = |effects: Vec<router::Effect>| effects.iter().any(|e| matches!(e, router::Effect::Report(_)));
    assert!(kept(s.on_message(report(), t0)));
    assert!(!kept(s.on_message(report(), t0 + ms(5))));
    assert!(!kept(s.on_message(report(), t0 + ms(19))));
    assert!(kept(s.on_message(report(), t0 + ms(20))));
}

#[test]
fn protocol_errors_are_a_typed_end_and_unexpected_frames_at_a_node_are_ignored() {
    let t0 = Instant::now();
    let mut s = RouterSession::default();
    let ended = |effects: Vec<router::Effect>| match effects.as_slice() {
        [router::Effect::End(End::Protocol(why))] => why.clone(),
        other => panic!("expected a protocol error, got {other:?}"),
    };
    assert_eq!(
        ended(s.on_message(Message::Hello(hello()), t0)),
        "a hello on the control stream"
    );
    let bad = msg::ModelStatus {
        name: "m".into(),
        version: 1,
        ready: true,
        reason: String::new(),
        config: vec![0xff, 0xff, 0xff],
        placed: false,
    };
    let why = ended(s.on_message(Message::ModelEvent(msg::ModelEvent::Update(bad)), t0));
    assert!(why.contains("model 'm' version 1 has an unreadable config"), "{why}");

    // A node waiting for its welcome ends on anything else; once joined, it ignores strays.
    let fencing = Fencing::default();
    let (mut n, _) = NodeSession::start(hello(), t0);
    assert!(n.on_drain().is_empty(), "nothing is said before the welcome");
    assert_eq!(
        n.on_message(Message::Released, &fencing),
        vec![node::Effect::End(End::Protocol(
            "expected a welcome, got a released".into()
        ))]
    );
    assert!(
        n.on_message(Message::Released, &fencing).is_empty(),
        "the session is over"
    );
    let (mut n, _) = NodeSession::start(hello(), t0);
    let welcome = msg::Welcome {
        router: "r".into(),
        link: 1,
        arena: None,
    };
    n.on_message(Message::Welcome(welcome), &fencing);
    assert_eq!(
        n.on_message(Message::Hello(hello()), &fencing),
        vec![node::Effect::Ignored("hello")]
    );
}

#[test]
fn a_node_without_a_welcome_gives_up_at_the_hello_deadline() {
    let t0 = Instant::now();
    let (mut n, _) = NodeSession::start(hello(), t0);
    assert_eq!(n.poll_timeout(), Some(t0 + node::HELLO_TIMEOUT));
    assert!(n.on_timeout(t0 + node::HELLO_TIMEOUT - ms(1)).is_empty());
    match n.on_timeout(t0 + node::HELLO_TIMEOUT).as_slice() {
        [node::Effect::End(End::Lost(why))] => assert!(why.contains("no welcome within"), "{why}"),
        other => panic!("{other:?}"),
    }
}
