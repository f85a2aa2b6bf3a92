//! Making room and moving replicas: LRU eviction for a model no node has room for, drains and rebalancing.
use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::time::Instant;

use super::tick::Block;
use super::{key, Action, EventKind, NodeState, Placer, State};

impl Placer {
    /// When the model is used (a request was routed), else when it was first placed; None: never placed.
    fn recency(&self, name: &str) -> Option<Instant> {
        self.models.get(name).and_then(|m| m.last_used.or(m.first_placed))
    }

    /// A Load for a move away from this replica is in progress.
    fn is_move_source(&self, name: &str, node: &str) -> bool {
        self.replicas
            .iter()
            .any(|((m, _), r)| m == name && r.is_loading() && r.move_from.as_deref() == Some(node))
    }

    /// The node's memory less the replicas it keeps (unloads in progress counted as done).
    fn free_after_unloads(&self, node: &str) -> u64 {
        let Some(n) = self.nodes.get(node) else { return 0 };
        let kept: u64 = self
            .replicas
            .iter()
            .filter(|((_, rn), r)| rn == node && !r.is_unloading())
            .map(|(_, r)| r.bytes)
            .sum();
        n.spec.memory.saturating_sub(kept)
    }

    /// Unloads the least recently used replicas with spare copies from one node, so the model fits there once
    /// they are gone. A model short of its min may evict any such replica; one above its min (autoscaled) only
    /// replicas of models used less recently than itself. Nothing is evicted while some node will have room
    /// once the unloads already under way finish.
    pub(super) fn evict_for(&mut self, name: &str, now: Instant) {
        let Some(m) = self.models.get(name) else { return };
        let need = m.footprint();
        let (min, _) = self.bounds_of(m);
        let urgent = self.planned(name) < min;
        let mine = self.recency(name).unwrap_or(now);
        let room_soon = self
            .nodes
            .keys()
            .any(|n| matches!(self.blocker(name, n), Some(Block::Memory(_))) && self.free_after_unloads(n) >= need);
        if room_soon {
            return;
        }
        let min_age = self.settings.min_age;
        let mut best: Option<(Instant, usize, String, Vec<String>)> = None;
        for (node, n) in &self.nodes {
            if !matches!(self.blocker(name, node), Some(Block::Memory(_))) || n.spec.memory < need {
                continue;
            }
            let mut victims: Vec<(Instant, String)> = self
                .replicas
                .iter()
                .filter(|((vm, vn), r)| {
                    vn == node
                        && vm != name
                        && r.ready_for(min_age, now)
                        && !self.is_move_source(vm, vn)
                        && self
                            .models
                            .get(vm)
                            .is_some_and(|v| self.ready(vm) > self.bounds_of(v).0)
                })
                .filter_map(|((vm, _), _)| Some((self.recency(vm)?, vm.clone())))
                .filter(|(at, _)| urgent || *at < mine)
                .collect();
            victims.sort();
            let mut free = self.free(node);
            let mut taken = Vec::new();
            for (at, vm) in victims {
                if free >= need {
                    break;
                }
                free += self.replicas[&key(&vm, node)].bytes;
                taken.push((at, vm));
            }
            if free < need {
                continue;
            }
            let newest = taken.iter().map(|(at, _)| *at).max().unwrap_or(now);
            let candidate = (
                newest,
                taken.len(),
                node.clone(),
                taken.into_iter().map(|(_, vm)| vm).collect(),
            );
            if best
                .as_ref()
                .is_none_or(|b| (candidate.0, candidate.1, &candidate.2) < (b.0, b.1, &b.2))
            {
                best = Some(candidate);
            }
        }
        if let Some((_, _, node, victims)) = best {
            for vm in victims {
                self.unload(&key(&vm, &node), &format!("evicted for {name}"), EventKind::Evict, now);
            }
        }
    }

    /// Make-before-break moves off draining nodes, within `max_moves`; a replica no other node can hold stays
    /// and its model's reason says so.
    pub(super) fn drain_moves(&mut self, now: Instant, loads: &mut Vec<Action>) {
        for m in self.models.values_mut() {
            m.stuck = None;
        }
        let sources: Vec<(String, String)> = self
            .replicas
            .iter()
            .filter(|((m, n), r)| {
                r.is_ready() && self.node_draining(n) && self.models.contains_key(m) && !self.is_move_source(m, n)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for (model, node) in sources {
            let stuck = if self.moves_in_progress() >= self.settings.max_moves {
                format!(
                    "waiting to move off draining node {node} ({} moves in progress)",
                    self.settings.max_moves
                )
            } else if let Some(target) = self.pick_node(&model) {
                self.start_load(&model, &target, Some(node), now, loads);
                continue;
            } else {
                format!("cannot move off draining node {node}: no other node can hold it")
            };
            if let Some(m) = self.models.get_mut(&model) {
                m.stuck = Some(stuck);
            }
        }
    }

    /// Moves replicas from the nodes holding the most to those holding the fewest, while the counts differ by
    /// more than one, within `max_moves`. Only replicas Ready for `min_age` move.
    pub(super) fn rebalance(&mut self, now: Instant, loads: &mut Vec<Action>) {
        while self.moves_in_progress() < self.settings.max_moves {
            let Some((model, from, to)) = self.next_move(now) else {
                break;
            };
            self.start_load(&model, &to, Some(from), now, loads);
        }
    }

    fn next_move(&self, now: Instant) -> Option<(String, String, String)> {
        // Replicas per Up node as they will be once the moves under way finish.
        let mut counts: BTreeMap<&str, usize> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.spec.state == NodeState::Up)
            .map(|(name, _)| (name.as_str(), 0))
            .collect();
        for ((m, n), r) in &self.replicas {
            if let Some(c) = counts.get_mut(n.as_str()) {
                if !r.is_unloading() && !self.is_move_source(m, n) {
                    *c += 1;
                }
            }
        }
        let mut lows: Vec<(usize, Reverse<u64>, &str)> =
            counts.iter().map(|(n, c)| (*c, Reverse(self.free(n)), *n)).collect();
        lows.sort();
        let mut highs: Vec<(Reverse<usize>, u64, &str)> =
            counts.iter().map(|(n, c)| (Reverse(*c), self.free(n), *n)).collect();
        highs.sort();
        let min_age = self.settings.min_age;
        for (low, _, to) in &lows {
            for (Reverse(high), _, from) in &highs {
                if *high < low + 2 {
                    break;
                }
                let movable = self.replicas.iter().find(|((m, n), r)| {
                    n == from
                        && matches!(r.state, State::Ready { .. })
                        && r.ready_for(min_age, now)
                        && !self.is_move_source(m, n)
                        && self.blocker(m, to).is_none()
                });
                if let Some(((m, _), _)) = movable {
                    return Some((m.clone(), from.to_string(), to.to_string()));
                }
            }
        }
        None
    }
}
