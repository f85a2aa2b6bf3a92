//! A simulated cluster on a fake clock: nodes, links and requests wired through membership and the routing rules.
//!
//! Each request runs the router's own [`Attempts`] (resolve on the published routing table, pin a sequence
//! or pick, wait for a replica, record each outcome in the balancer and the retry rules), so what is
//! simulated is the code the dispatcher runs. Everything is stepped from one ordered event queue with a
//! seeded RNG, so a run is a pure function of its seed and script; a failing run names its seed.
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh::Error;
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::membership::{Joined, LinkId, Membership, MembershipSettings, ModelLoad, NodeHello, RoutingTable};
use crate::route::{Attempts, Balancer, Decision, Failure, RetryPolicy, Step, View};

mod node;
mod route_tests;
mod tests;

use node::NodeAnswer;
pub use node::SimNode;

/// Fixed timings of the simulated network.
const LATENCY: Duration = Duration::from_millis(1);
const TICK: Duration = Duration::from_millis(10);
const REPORT_EVERY: Duration = Duration::from_millis(250);
/// The link's idle timeout by default: a frozen or killed node's link is declared lost this long after it went quiet.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(1);
/// The router's `--route-wait-ms` by default.
pub const ROUTE_WAIT: Duration = Duration::from_secs(5);

enum Up {
    Hello(NodeHello),
    Report(Vec<ModelLoad>),
    Draining,
    Goodbye,
}

enum Ev {
    Arrive(usize),
    Deliver {
        link: LinkId,
        req: usize,
        attempt: u32,
    },
    Finish {
        node: usize,
        req: usize,
        attempt: u32,
    },
    Answer {
        link: LinkId,
        req: usize,
        attempt: u32,
        answer: NodeAnswer,
    },
    Up {
        link: LinkId,
        msg: Up,
    },
    ReportTimer {
        node: usize,
        incarnation: u64,
    },
    LinkDown {
        link: LinkId,
    },
    Tick,
    Script(Box<dyn FnOnce(&mut Sim)>),
}

/// The router's view of one link.
struct Link {
    node: usize,
    open: bool,
    partitioned: bool,
    attempts: BTreeSet<(usize, u32)>,
}

/// One client request and everything that happened to it.
pub struct Req {
    pub attempts: Attempts,
    model: String,
    /// The sequence the request belongs to.
    pub sequence: Option<String>,
    current: Option<(LinkId, u32)>,
    /// The node that answered, or the error the client got.
    pub outcome: Option<Result<String, Error>>,
    /// Terminal answers the client got (must end at exactly 1).
    pub terminals: u32,
    /// When the (last) terminal answer came.
    pub finished_at: Option<Duration>,
    /// Times a node accepted the request for execution.
    pub executions: u32,
    /// When each attempt was sent, and to which node.
    pub sends: Vec<(Duration, String)>,
}

/// The simulated cluster: the router's policies plus simulated nodes and links.
pub struct Sim {
    pub seed: u64,
    base: Instant,
    t: Duration,
    seq: u64,
    events: BTreeMap<(Duration, u64), Ev>,
    rng: StdRng,
    pub membership: Membership,
    table: Arc<RoutingTable>,
    pub balancer: Balancer,
    retry: RetryPolicy,
    links: HashMap<LinkId, Link>,
    next_link: LinkId,
    inflight: HashMap<LinkId, u32>,
    pub nodes: Vec<SimNode>,
    pub requests: Vec<Req>,
    waiting: BTreeSet<usize>,
    non_idempotent: BTreeSet<String>,
    /// Models of the cluster repository being placed (a request for one waits instead of failing unknown).
    placing: BTreeSet<String>,
    /// Links the router closed because a node joined again over a new one.
    pub closed_on_join: Vec<LinkId>,
    /// The link's idle timeout.
    pub idle_timeout: Duration,
}

impl Sim {
    /// An empty cluster whose RNG is seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        // Shown with a failing test's output, so its run can be replayed.
        eprintln!("simulated cluster, seed {seed}");
        let mut sim = Sim {
            seed,
            base: Instant::now(),
            t: Duration::ZERO,
            seq: 0,
            events: BTreeMap::new(),
            rng: StdRng::seed_from_u64(seed),
            membership: Membership::new(MembershipSettings::default()),
            table: Arc::new(RoutingTable::default()),
            balancer: Balancer::default(),
            retry: RetryPolicy::default(),
            links: HashMap::new(),
            next_link: 1,
            inflight: HashMap::new(),
            nodes: Vec::new(),
            requests: Vec::new(),
            waiting: BTreeSet::new(),
            non_idempotent: BTreeSet::new(),
            placing: BTreeSet::new(),
            closed_on_join: Vec::new(),
            idle_timeout: IDLE_TIMEOUT,
        };
        sim.schedule(Duration::ZERO, Ev::Tick);
        sim
    }

    /// The fake clock.
    pub fn now(&self) -> Instant {
        self.base + self.t
    }

    fn schedule(&mut self, at: Duration, ev: Ev) {
        self.seq += 1;
        self.events.insert((at, self.seq), ev);
    }

    /// Runs `f` at simulated time `at`.
    pub fn at(&mut self, at: Duration, f: impl FnOnce(&mut Sim) + 'static) {
        self.schedule(at, Ev::Script(Box::new(f)));
    }

    /// Marks a model as non-idempotent (`mesh.idempotent: false` in the config nodes report, so
    /// call it before adding them): its requests must never run twice.
    pub fn non_idempotent(&mut self, model: &str) {
        self.non_idempotent.insert(model.into());
    }

    /// Marks a model as one the cluster is placing: its requests wait for a replica.
    pub fn placing(&mut self, model: &str) {
        self.placing.insert(model.into());
    }

    /// Client requests for `model`, one every `every` from `from` until `until`, each with `timeout`.
    pub fn load(&mut self, model: &str, every: Duration, from: Duration, until: Duration, timeout: Duration) {
        let mut t = from;
        while t < until {
            self.request(model, t, timeout);
            t += every;
        }
    }

    /// One client request for `model` arriving at `at`. Returns its index.
    pub fn request(&mut self, model: &str, at: Duration, timeout: Duration) -> usize {
        self.request_in(model, None, at, timeout)
    }

    /// One client request for `model` in `sequence` (when given) arriving at `at`. Returns its index.
    pub fn request_in(&mut self, model: &str, sequence: Option<&str>, at: Duration, timeout: Duration) -> usize {
        let start = self.base + at;
        let sequence = sequence.map(str::to_string);
        let attempts = Attempts::new(model, "", sequence.clone(), start, start + timeout, ROUTE_WAIT);
        self.requests.push(Req {
            attempts,
            model: model.into(),
            sequence,
            current: None,
            outcome: None,
            terminals: 0,
            finished_at: None,
            executions: 0,
            sends: Vec::new(),
        });
        let id = self.requests.len() - 1;
        self.schedule(at, Ev::Arrive(id));
        id
    }

    /// Steps every event up to and including `end`.
    pub fn run_until(&mut self, end: Duration) {
        while let Some(entry) = self.events.first_entry() {
            if entry.key().0 > end {
                break;
            }
            let ((t, _), ev) = entry.remove_entry();
            self.t = t;
            self.step(ev);
        }
        self.t = end;
    }

    fn step(&mut self, ev: Ev) {
        match ev {
            Ev::Arrive(id) => self.dispatch(id),
            Ev::Deliver { link, req, attempt } => self.node_receive(link, req, attempt),
            Ev::Finish { node, req, attempt } => self.node_finish(node, req, attempt),
            Ev::Answer {
                link,
                req,
                attempt,
                answer,
            } => self.router_answer(link, req, attempt, answer),
            Ev::Up { link, msg } => self.router_message(link, msg),
            Ev::ReportTimer { node, incarnation } => self.node_report(node, incarnation),
            Ev::LinkDown { link } => self.link_down(link),
            Ev::Tick => {
                let now = self.now();
                self.membership.tick(now);
                self.republish();
                for id in self.waiting.clone() {
                    self.dispatch(id);
                }
                self.schedule(self.t + TICK, Ev::Tick);
            }
            Ev::Script(f) => f(self),
        }
    }

    // ---- the router side ----

    /// Republishes the routing table after a membership change and wakes waiting requests.
    fn republish(&mut self) {
        if self.membership.generation() == self.table.generation() {
            return;
        }
        self.table = Arc::new(self.membership.routing_table());
        for id in self.waiting.clone() {
            self.dispatch(id);
        }
    }

    /// One attempt of request `id`: the routing rules say send, wait or give up.
    fn dispatch(&mut self, id: usize) {
        let now = self.now();
        self.waiting.remove(&id);
        let req = &self.requests[id];
        if req.outcome.is_some() || req.current.is_some() {
            return;
        }
        let table = self.table.clone();
        let placing = |m: &str| self.placing.contains(m);
        let view = View {
            table: &table,
            placing: &placing,
            inflight: |l: LinkId| self.inflight.get(&l).copied().unwrap_or(0),
        };
        let step = self.requests[id]
            .attempts
            .next(&view, &self.balancer, now, &mut self.rng);
        match step {
            Step::Send { link, .. } => self.send(id, link),
            Step::Wait { until, .. } => {
                self.waiting.insert(id);
                // Asked again at `until`, on each tick, and when the routing table changes.
                self.schedule(until.duration_since(self.base), Ev::Arrive(id));
            }
            Step::Fail(e) => self.finish(id, Err(e)),
        }
    }

    fn send(&mut self, id: usize, link: LinkId) {
        let l = self.links.get_mut(&link).expect("routed links are known");
        let node = self.nodes[l.node].name.clone();
        let req = &mut self.requests[id];
        req.attempts.sent(link, &node);
        req.sends.push((self.t, node));
        let attempt = req.attempts.state().attempts();
        if !l.open {
            // A stale table named a link the router already closed: the stream cannot even be opened.
            return self.failed(id, link, Failure::NotSent("the link is closed".into()));
        }
        req.current = Some((link, attempt));
        l.attempts.insert((id, attempt));
        *self.inflight.entry(link).or_insert(0) += 1;
        if !l.partitioned {
            self.schedule(self.t + LATENCY, Ev::Deliver { link, req: id, attempt });
        }
    }

    /// Ends the attempt `(id, attempt)` on `link`; false when it had already ended.
    fn end_attempt(&mut self, link: LinkId, id: usize, attempt: u32) -> bool {
        let Some(l) = self.links.get_mut(&link) else {
            return false;
        };
        if !l.open || !l.attempts.remove(&(id, attempt)) {
            return false;
        }
        if let Some(n) = self.inflight.get_mut(&link) {
            *n -= 1;
        }
        self.requests[id].current = None;
        true
    }

    fn router_answer(&mut self, link: LinkId, id: usize, attempt: u32, answer: NodeAnswer) {
        if !self.end_attempt(link, id, attempt) {
            return;
        }
        match answer {
            NodeAnswer::Ok => {
                self.requests[id].attempts.succeeded(link, &mut self.balancer);
                let node = self.nodes[self.links[&link].node].name.clone();
                self.finish(id, Ok(node));
            }
            NodeAnswer::NotStarted(why) => self.failed(id, link, Failure::Refused(Error::unavailable(why))),
            NodeAnswer::Overloaded(why) => self.failed(id, link, Failure::Overloaded(Error::overloaded(why))),
        }
    }

    /// The attempt of request `id` on `link` failed: its routing records the outcome and decides.
    fn failed(&mut self, id: usize, link: LinkId, failure: Failure) {
        let now = self.now();
        let attempts = &mut self.requests[id].attempts;
        match attempts.failed(link, failure, &mut self.balancer, &self.retry, now) {
            Decision::Retry => self.dispatch(id),
            Decision::GiveUp(e) => self.finish(id, Err(e)),
        }
    }

    fn finish(&mut self, id: usize, outcome: Result<String, Error>) {
        let req = &mut self.requests[id];
        req.terminals += 1;
        req.finished_at = Some(self.t);
        req.outcome = Some(outcome);
        self.waiting.remove(&id);
    }

    fn router_message(&mut self, link: LinkId, msg: Up) {
        let now = self.now();
        if !self.links.get(&link).is_some_and(|l| l.open) {
            return;
        }
        match msg {
            Up::Hello(hello) => {
                // Simulated nodes prove no key, so every hello is admitted.
                let Ok(joined) = self.membership.join(link, hello, now) else {
                    return;
                };
                self.republish();
                if let Some(old) = joined.link_to_close() {
                    self.closed_on_join.push(old);
                    let why = match joined {
                        Joined::Replaced { .. } => "the node restarted",
                        _ => "the node joined again over a new link",
                    };
                    self.close(old, |why| Failure::Lost(why.into()), why);
                }
            }
            Up::Report(loads) => {
                self.membership.report(link, loads, now);
            }
            Up::Draining => {
                self.membership.draining(link, now);
            }
            Up::Goodbye => {
                self.membership.goodbye(link, now);
                self.republish();
                // A node says goodbye only after answering all it started: what is left never started.
                self.close(link, |why| Failure::Refused(Error::unavailable(why)), "the node left");
            }
        }
        self.republish();
    }

    /// The transport lost `link` (idle timeout). Lost links the router already closed are still reported,
    /// as a real link layer may do; membership must ignore those.
    fn link_down(&mut self, link: LinkId) {
        let now = self.now();
        self.membership.link_lost(link, now);
        self.republish();
        if self.links.get(&link).is_some_and(|l| l.open) {
            self.close(link, |why| Failure::Lost(why.into()), "the link idled out");
        }
    }

    /// Closes `link` and fails its open attempts with `failure(why)`.
    fn close(&mut self, link: LinkId, failure: fn(&str) -> Failure, why: &str) {
        let Some(l) = self.links.get_mut(&link) else {
            return;
        };
        let attempts = std::mem::take(&mut l.attempts);
        l.open = false;
        self.inflight.remove(&link);
        for (id, _) in attempts {
            self.requests[id].current = None;
            self.failed(id, link, failure(why));
        }
    }

    // ---- what tests read ----

    /// Panics (naming the seed) unless every request got exactly one terminal answer.
    pub fn assert_one_answer_each(&self) {
        for (i, r) in self.requests.iter().enumerate() {
            assert_eq!(
                r.terminals, 1,
                "seed {}: request {i} got {} terminal answers",
                self.seed, r.terminals
            );
        }
    }

    /// The errors clients got, with their request index.
    pub fn errors(&self) -> Vec<(usize, &Error)> {
        self.requests
            .iter()
            .enumerate()
            .filter_map(|(i, r)| match &r.outcome {
                Some(Err(e)) => Some((i, e)),
                _ => None,
            })
            .collect()
    }

    /// Requests whose attempts went to more than one node.
    pub fn retried(&self) -> usize {
        self.requests.iter().filter(|r| r.sends.len() > 1).count()
    }

    /// Attempts sent to node `name` at or after `from`.
    pub fn sends_to(&self, name: &str, from: Duration) -> usize {
        self.requests
            .iter()
            .flat_map(|r| &r.sends)
            .filter(|(t, n)| n == name && *t >= from)
            .count()
    }

    /// Whether the router-side link is open.
    pub fn link_open(&self, link: LinkId) -> bool {
        self.links.get(&link).is_some_and(|l| l.open)
    }
}
