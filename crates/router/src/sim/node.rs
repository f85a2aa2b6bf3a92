//! The simulated nodes: processes with slots and service times, their faults, and their side of the link.
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use mesh::config::ModelConfig;

use super::{Ev, Link, Sim, Up, LATENCY, REPORT_EVERY};
use crate::membership::{LinkId, ModelLoad, ModelStatus, NodeHello};

/// One model a simulated node serves.
#[derive(Clone)]
pub(super) struct SimModel {
    name: String,
    service: Duration,
}

/// A request the node accepted.
pub(super) struct Job {
    req: usize,
    attempt: u32,
    link: LinkId,
    model: String,
    start: Duration,
}

/// A simulated mesh-node process (replaced in place on restart).
pub struct SimNode {
    pub name: String,
    incarnation: u64,
    /// The link the current process talks on.
    pub link: Option<LinkId>,
    models: Vec<SimModel>,
    alive: bool,
    frozen: bool,
    draining: bool,
    overloaded_until: Duration,
    slot_free: Vec<Duration>,
    jobs: Vec<Job>,
}

/// How the node answered one attempt.
pub(super) enum NodeAnswer {
    Ok,
    NotStarted(String),
    Overloaded(String),
}

impl Sim {
    /// Adds a node process serving `models` (name, service time) and dials the router now. Returns its index.
    pub fn add_node(&mut self, name: &str, models: &[(&str, u64)], slots: usize) -> usize {
        self.nodes.push(SimNode {
            name: name.into(),
            incarnation: 0,
            link: None,
            models: models
                .iter()
                .map(|&(n, ms)| SimModel {
                    name: n.into(),
                    service: Duration::from_millis(ms),
                })
                .collect(),
            alive: false,
            frozen: false,
            draining: false,
            overloaded_until: Duration::ZERO,
            slot_free: vec![Duration::ZERO; slots],
            jobs: Vec::new(),
        });
        let node = self.nodes.len() - 1;
        self.start_process(node, 1);
        node
    }

    /// A fresh process of `node` with `incarnation` starts and dials the router over a new link.
    pub fn start_process(&mut self, node: usize, incarnation: u64) {
        let n = &mut self.nodes[node];
        n.incarnation = incarnation;
        n.alive = true;
        n.frozen = false;
        n.draining = false;
        n.jobs.clear();
        n.slot_free.iter_mut().for_each(|s| *s = Duration::ZERO);
        self.dial(node);
        self.schedule(self.t + REPORT_EVERY, Ev::ReportTimer { node, incarnation });
    }

    /// The running process of `node` dials again (same incarnation) over a new link.
    pub fn dial(&mut self, node: usize) {
        let link = self.next_link;
        self.next_link += 1;
        self.links.insert(
            link,
            Link {
                node,
                open: true,
                partitioned: false,
                attempts: BTreeSet::new(),
            },
        );
        let n = &mut self.nodes[node];
        n.link = Some(link);
        let non_idempotent = &self.non_idempotent;
        let models = n
            .models
            .iter()
            .map(|m| {
                let mut config = ModelConfig {
                    name: m.name.clone(),
                    ..ModelConfig::default()
                };
                if non_idempotent.contains(&m.name) {
                    let flag = mesh::proto::ModelParameter {
                        string_value: "false".into(),
                    };
                    config.parameters.insert("mesh.idempotent".into(), flag);
                }
                ModelStatus {
                    name: m.name.clone(),
                    version: 1,
                    ready: true,
                    reason: String::new(),
                    config: Arc::new(config),
                    placed: false,
                }
            })
            .collect();
        let hello = NodeHello {
            name: n.name.clone(),
            incarnation: n.incarnation,
            address: format!("sim:{node}"),
            devices: vec![],
            models,
            memory: 0,
            key: None,
        };
        self.send_up(link, Up::Hello(hello));
    }

    /// The process of `node` dies; the router notices when the link idles out.
    pub fn kill(&mut self, node: usize) {
        let n = &mut self.nodes[node];
        n.alive = false;
        n.jobs.clear();
        if let Some(link) = n.link {
            self.schedule(self.t + self.idle_timeout, Ev::LinkDown { link });
        }
    }

    /// The process of `node` stops (SIGSTOP): no answers, no reports; its link idles out.
    pub fn freeze(&mut self, node: usize) {
        self.nodes[node].frozen = true;
        if let Some(link) = self.nodes[node].link {
            self.schedule(self.t + self.idle_timeout, Ev::LinkDown { link });
        }
    }

    /// The link of `node` drops every message both ways; it idles out unless the node dials again first.
    pub fn partition(&mut self, node: usize) {
        if let Some(link) = self.nodes[node].link {
            self.links.get_mut(&link).expect("node links are known").partitioned = true;
            self.schedule(self.t + self.idle_timeout, Ev::LinkDown { link });
        }
    }

    /// `node` starts draining: it refuses new work, finishes what it has, then says goodbye.
    pub fn drain(&mut self, node: usize) {
        self.nodes[node].draining = true;
        if let Some(link) = self.nodes[node].link {
            self.send_up(link, Up::Draining);
        }
        self.maybe_leave(node);
    }

    /// `node` refuses work as overloaded until `until` (simulated time).
    pub fn overload(&mut self, node: usize, until: Duration) {
        self.nodes[node].overloaded_until = until;
    }

    pub(super) fn send_up(&mut self, link: LinkId, msg: Up) {
        if !self.links[&link].partitioned {
            self.schedule(self.t + LATENCY, Ev::Up { link, msg });
        }
    }

    pub(super) fn answer(&mut self, link: LinkId, req: usize, attempt: u32, answer: NodeAnswer) {
        if !self.links[&link].partitioned {
            self.schedule(
                self.t + LATENCY,
                Ev::Answer {
                    link,
                    req,
                    attempt,
                    answer,
                },
            );
        }
    }

    pub(super) fn node_receive(&mut self, link: LinkId, req: usize, attempt: u32) {
        let node = self.links[&link].node;
        let t = self.t;
        let n = &mut self.nodes[node];
        if !n.alive || n.frozen || n.link != Some(link) {
            return;
        }
        let model = self.requests[req].model.clone();
        let Some(service) = n.models.iter().find(|m| m.name == model).map(|m| m.service) else {
            return self.answer(link, req, attempt, NodeAnswer::NotStarted("model not served".into()));
        };
        if n.draining {
            return self.answer(link, req, attempt, NodeAnswer::NotStarted("draining".into()));
        }
        if t < n.overloaded_until {
            return self.answer(link, req, attempt, NodeAnswer::Overloaded("queue full".into()));
        }
        let slot = (0..n.slot_free.len())
            .min_by_key(|&i| n.slot_free[i])
            .expect("a node has slots");
        let start = n.slot_free[slot].max(t);
        let finish = start + service;
        n.slot_free[slot] = finish;
        n.jobs.push(Job {
            req,
            attempt,
            link,
            model,
            start,
        });
        self.requests[req].executions += 1;
        self.schedule(finish, Ev::Finish { node, req, attempt });
    }

    pub(super) fn node_finish(&mut self, node: usize, req: usize, attempt: u32) {
        let n = &mut self.nodes[node];
        if !n.alive || n.frozen {
            return;
        }
        let Some(i) = n.jobs.iter().position(|j| j.req == req && j.attempt == attempt) else {
            return;
        };
        let job = n.jobs.remove(i);
        self.answer(job.link, req, attempt, NodeAnswer::Ok);
        self.maybe_leave(node);
    }

    pub(super) fn maybe_leave(&mut self, node: usize) {
        let n = &mut self.nodes[node];
        if n.draining && n.alive && n.jobs.is_empty() {
            n.alive = false;
            if let Some(link) = n.link {
                self.send_up(link, Up::Goodbye);
            }
        }
    }

    pub(super) fn node_report(&mut self, node: usize, incarnation: u64) {
        let t = self.t;
        let n = &self.nodes[node];
        if !n.alive || n.incarnation != incarnation {
            return;
        }
        if !n.frozen {
            if let Some(link) = n.link {
                let loads = n
                    .models
                    .iter()
                    .map(|m| {
                        let jobs = n.jobs.iter().filter(|j| j.model == m.name);
                        let running = jobs.clone().filter(|j| j.start <= t).count() as u32;
                        ModelLoad {
                            name: m.name.clone(),
                            version: 1,
                            inflight: running,
                            queued: jobs.filter(|j| j.start > t).count() as u32,
                            exec_us: m.service.as_micros() as u64,
                        }
                    })
                    .collect();
                self.send_up(link, Up::Report(loads));
            }
        }
        self.schedule(t + REPORT_EVERY, Ev::ReportTimer { node, incarnation });
    }
}
