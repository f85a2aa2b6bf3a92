//! One placement round: timeouts, scale down, scale up (with eviction), moves, reasons, and the actions out.
use std::time::Instant;

use super::report::{bytes, count};
use super::{key, Action, EventKind, Key, Model, NodeState, Placer, Replica, State};

/// Why a node cannot take a replica of a model now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Block {
    /// The model or the node is not (or no longer) known.
    Unknown,
    Draining,
    NoGpu,
    /// The node serves a model of that name of its own.
    Foreign,
    /// The node holds a replica of the model already (in any state).
    Holds,
    /// The pair failed within `retry_after`.
    Failed,
    /// Not enough free memory; the node's free bytes.
    Memory(u64),
}

impl Placer {
    /// Decides what to do now; see the module docs. Calling it again at the same `now` without new
    /// observations returns nothing new.
    pub fn tick(&mut self, now: Instant) -> Vec<Action> {
        self.expire(now);
        self.cancel_on_draining(now);
        self.unlink_moves();
        let names: Vec<String> = self.models.keys().cloned().collect();
        for name in &names {
            self.scale_event(name, now);
            self.step_down(name, now);
        }
        let mut loads = Vec::new();
        self.place_missing(now, &mut loads);
        self.drain_moves(now, &mut loads);
        self.rebalance(now, &mut loads);
        for name in &names {
            self.explain(name, now);
        }
        let mut actions = self.send_unloads(now);
        actions.extend(loads);
        actions.extend(self.drained(now));
        actions
    }

    /// Expired failures, timed-out loads, and unloads never answered.
    fn expire(&mut self, now: Instant) {
        let retry_after = self.settings.retry_after;
        let timeout = self.settings.load_timeout;
        self.failures
            .retain(|_, f| now.saturating_duration_since(f.at) < retry_after);
        let timed_out: Vec<Key> = self
            .replicas
            .iter()
            .filter(
                |(_, r)| matches!(r.state, State::Loading { since } if now.saturating_duration_since(since) >= timeout),
            )
            .map(|(k, _)| k.clone())
            .collect();
        for k in timed_out {
            let why = format!("load timed out after {timeout:?}");
            self.unload(&k, &why, EventKind::Unload, now);
            self.fail(k, why, EventKind::Failed, now);
        }
        self.replicas.retain(|_, r| match r.state {
            State::Unloading { sent: Some(sent), .. } => now.saturating_duration_since(sent) < timeout,
            _ => true,
        });
    }

    /// Loads on a node that started draining are not worth finishing.
    fn cancel_on_draining(&mut self, now: Instant) {
        let cancel: Vec<Key> = self
            .replicas
            .iter()
            .filter(|((_, n), r)| r.is_loading() && self.node_draining(n))
            .map(|(k, _)| k.clone())
            .collect();
        for k in cancel {
            self.unload(&k, "node draining", EventKind::Unload, now);
        }
    }

    /// A load for a move whose old replica is no longer Ready is a plain load.
    fn unlink_moves(&mut self) {
        let ready: Vec<Key> = self
            .replicas
            .iter()
            .filter(|(_, r)| r.is_ready())
            .map(|(k, _)| k.clone())
            .collect();
        for ((m, _), r) in self.replicas.iter_mut() {
            if let Some(from) = &r.move_from {
                if !r.is_loading() || !ready.contains(&key(m, from)) {
                    r.move_from = None;
                }
            }
        }
    }

    fn scale_event(&mut self, name: &str, now: Instant) {
        let Some(m) = self.models.get(name) else { return };
        let wanted = self.wanted_of(m);
        let before = m.wanted_seen;
        self.models.get_mut(name).expect("present").wanted_seen = Some(wanted);
        if let Some(before) = before.filter(|b| *b != wanted) {
            self.event(now, EventKind::Scale, name, "", &format!("{before} → {wanted}"));
        }
    }

    /// One unload for a model with more replicas than wanted: a Ready one beyond `wanted`, else a Loading one
    /// beyond what is planned.
    fn step_down(&mut self, name: &str, now: Instant) {
        let Some(wanted) = self.wanted(name) else { return };
        let ready = self.ready(name);
        let victim = if ready > wanted {
            self.down_victim(name, Replica::is_ready)
        } else if self.planned(name) > wanted {
            self.down_victim(name, |r| r.is_loading() && r.move_from.is_none())
        } else {
            None
        };
        if let Some(node) = victim {
            self.unload(
                &key(name, &node),
                &format!("scale down to {wanted}"),
                EventKind::Unload,
                now,
            );
        }
    }

    /// The replica to drop: on a draining node first, then on the node with the least free memory.
    fn down_victim(&self, name: &str, pick: impl Fn(&Replica) -> bool) -> Option<String> {
        self.replicas
            .iter()
            .filter(|((m, _), r)| m == name && pick(r))
            .map(|((_, n), _)| (!self.node_draining(n), self.free(n), n.clone()))
            .min()
            .map(|(_, _, n)| n)
    }

    /// Loads for every model below `wanted`, one replica per model per round, models with fewest first;
    /// eviction for those no node has room for.
    fn place_missing(&mut self, now: Instant, loads: &mut Vec<Action>) {
        let mut blocked: Vec<String> = Vec::new();
        loop {
            let mut short: Vec<(u32, String)> = self
                .models
                .iter()
                .filter(|(name, m)| self.planned(name) < self.wanted_of(m) && !blocked.contains(name))
                .map(|(name, _)| (self.planned(name), name.clone()))
                .collect();
            if short.is_empty() {
                break;
            }
            short.sort();
            for (_, name) in short {
                match self.pick_node(&name) {
                    Some(node) => self.start_load(&name, &node, None, now, loads),
                    None => blocked.push(name),
                }
            }
        }
        for name in blocked {
            self.evict_for(&name, now);
        }
    }

    /// Replicas that count toward `wanted`: Ready or Loading, not unloading, a move's new copy not counted
    /// (its old one still is).
    pub(super) fn planned(&self, name: &str) -> u32 {
        self.replicas
            .iter()
            .filter(|((m, _), r)| m == name && !r.is_unloading() && r.move_from.is_none())
            .count() as u32
    }

    /// Loads started for moves and not Ready yet.
    pub(super) fn moves_in_progress(&self) -> usize {
        self.replicas
            .values()
            .filter(|r| r.is_loading() && r.move_from.is_some())
            .count()
    }

    pub(super) fn node_draining(&self, node: &str) -> bool {
        self.nodes
            .get(node)
            .is_some_and(|n| n.spec.state == NodeState::Draining)
    }

    /// The node's memory less every replica it holds or is loading or unloading.
    pub(super) fn free(&self, node: &str) -> u64 {
        let Some(n) = self.nodes.get(node) else { return 0 };
        let used: u64 = self
            .replicas
            .iter()
            .filter(|((_, rn), _)| rn == node)
            .map(|(_, r)| r.bytes)
            .sum();
        n.spec.memory.saturating_sub(used)
    }

    /// Replicas on the node in any state.
    pub(super) fn held(&self, node: &str) -> usize {
        self.replicas.keys().filter(|(_, n)| n == node).count()
    }

    /// Whether (and why not) the node can take a new replica of the model now.
    pub(super) fn blocker(&self, name: &str, node: &str) -> Option<Block> {
        let (Some(m), Some(n)) = (self.models.get(name), self.nodes.get(node)) else {
            return Some(Block::Unknown);
        };
        let k = key(name, node);
        if n.spec.state != NodeState::Up {
            Some(Block::Draining)
        } else if m.spec.needs_gpu && n.spec.gpus == 0 {
            Some(Block::NoGpu)
        } else if self.foreign.contains(&k) {
            Some(Block::Foreign)
        } else if self.replicas.contains_key(&k) {
            Some(Block::Holds)
        } else if self.failures.contains_key(&k) {
            Some(Block::Failed)
        } else if self.free(node) < m.footprint() {
            Some(Block::Memory(self.free(node)))
        } else {
            None
        }
    }

    /// The eligible node with the most free memory (ties: fewest replicas, then name).
    pub(super) fn pick_node(&self, name: &str) -> Option<String> {
        self.nodes
            .keys()
            .filter(|n| self.blocker(name, n).is_none())
            .map(|n| (std::cmp::Reverse(self.free(n)), self.held(n), n.clone()))
            .min()
            .map(|(_, _, n)| n)
    }

    /// Sends a Load; `move_from` names the replica this one replaces.
    pub(super) fn start_load(
        &mut self,
        name: &str,
        node: &str,
        move_from: Option<String>,
        now: Instant,
        loads: &mut Vec<Action>,
    ) {
        let Some(m) = self.models.get_mut(name) else { return };
        m.first_placed.get_or_insert(now);
        let bytes = m.footprint();
        let k = key(name, node);
        let (kind, detail) = match &move_from {
            Some(from) => (EventKind::Move, format!("from {from}")),
            None => (EventKind::Place, String::new()),
        };
        self.event(now, kind, name, node, &detail);
        self.asked.insert(k.clone());
        let replica = Replica {
            state: State::Loading { since: now },
            bytes,
            move_from,
        };
        self.replicas.insert(k, replica);
        loads.push(Action::Load {
            model: name.into(),
            node: node.into(),
        });
    }

    /// Unload actions for every unload decided and not sent yet.
    fn send_unloads(&mut self, now: Instant) -> Vec<Action> {
        let mut out = Vec::new();
        for ((m, n), r) in self.replicas.iter_mut() {
            if let State::Unloading { sent: sent @ None, .. } = &mut r.state {
                *sent = Some(now);
                out.push(Action::Unload {
                    model: m.clone(),
                    node: n.clone(),
                });
            }
        }
        out
    }

    /// Drained for each draining node that holds nothing, once per drain.
    fn drained(&mut self, now: Instant) -> Vec<Action> {
        let empty: Vec<String> = self
            .nodes
            .iter()
            .filter(|(name, n)| n.spec.state == NodeState::Draining && !n.drained_sent && self.held(name) == 0)
            .map(|(name, _)| name.clone())
            .collect();
        empty
            .into_iter()
            .map(|node| {
                self.nodes.get_mut(&node).expect("listed").drained_sent = true;
                self.event(now, EventKind::Drained, "", &node, "");
                Action::Drained { node }
            })
            .collect()
    }

    /// Sets the model's reason: why it is short of `wanted`, a replica stuck on a draining node, the last failure.
    fn explain(&mut self, name: &str, now: Instant) {
        let Some(m) = self.models.get(name) else { return };
        let mut parts: Vec<String> = Vec::new();
        let wanted = self.wanted_of(m);
        let planned = self.planned(name);
        if planned < wanted {
            parts.push(self.shortage(name, m, wanted, planned));
        }
        if let Some(stuck) = &m.stuck {
            parts.push(stuck.clone());
        }
        if let Some((at, failure)) = &m.last_failure {
            if now.saturating_duration_since(*at) < self.settings.retry_after {
                parts.push(format!("last failure on {failure}"));
            }
        }
        let reason = parts.join("; ");
        self.models.get_mut(name).expect("present").reason = reason;
    }

    /// Why a model has fewer replicas than wanted.
    fn shortage(&self, name: &str, m: &Model, wanted: u32, planned: u32) -> String {
        let need = m.footprint();
        let up: Vec<&str> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.spec.state == NodeState::Up)
            .map(|(n, _)| n.as_str())
            .collect();
        let able: Vec<&str> = up
            .iter()
            .copied()
            .filter(|n| {
                let spec = &self.nodes[*n].spec;
                (!m.spec.needs_gpu || spec.gpus > 0) && spec.memory >= need && !self.foreign.contains(&key(name, n))
            })
            .collect();
        let wants = format!("wants {}, {planned} placed", count(wanted as usize, "replica"));
        if up.is_empty() {
            return format!("{wants}: no node is up");
        }
        if m.spec.needs_gpu && up.iter().all(|n| self.nodes[*n].spec.gpus == 0) {
            return format!("{wants}: needs a GPU and no node has one");
        }
        if able.is_empty() {
            let largest = up.iter().map(|n| self.nodes[*n].spec.memory).max().unwrap_or(0);
            return format!(
                "{wants}: needs {} and no node has that much (largest: {})",
                bytes(need),
                bytes(largest)
            );
        }
        if (able.len() as u32) < wanted {
            let nodes = count(able.len(), "node");
            return format!("wants {}, only {nodes} can hold it", count(wanted as usize, "replica"));
        }
        let blocks: Vec<Block> = able.iter().filter_map(|n| self.blocker(name, n)).collect();
        let largest = blocks
            .iter()
            .filter_map(|b| match b {
                Block::Memory(free) => Some(*free),
                _ => None,
            })
            .max();
        let failed = blocks.iter().filter(|b| **b == Block::Failed).count();
        let mut why = Vec::new();
        if let Some(largest) = largest {
            why.push(format!(
                "no node has {} free (largest free: {})",
                bytes(need),
                bytes(largest)
            ));
        }
        if failed > 0 {
            why.push(format!(
                "{failed} node(s) failed it lately (retried after {:?})",
                self.settings.retry_after
            ));
        }
        let unloading = able
            .iter()
            .any(|n| self.replicas.get(&key(name, n)).is_some_and(Replica::is_unloading));
        if why.is_empty() && unloading {
            why.push("waiting for an unload of it to finish".into());
        }
        if why.is_empty() {
            why.push("waiting for room".into());
        }
        format!("{wants}: {}", why.join(", "))
    }
}
