//! The rate limiter (`--rate-limit execution_count`): an instance runs a batch only while the
//! resources its `instance_group { rate_limiter { ... } }` names are free, and instances waiting for
//! the same resources take turns weighted by their priority. `Pools` decides (sans-IO); `Limiter`
//! blocks an executor thread until `Pools` grants it.
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use mesh::proto::ModelRateLimiter;
use mesh::sync::Locked;

#[cfg(test)]
mod tests;

/// Where a resource's copies live: one set for the whole node, or one per device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    Global,
    Device(i32),
}

/// A resource as an instance needs it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub name: String,
    pub scope: Scope,
}

/// One `--rate-limit-resource <name>:<count>[:<device>]`; without a device it applies to every device
/// (and to a global resource of that name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceFlag {
    pub name: String,
    pub count: u64,
    pub device: Option<i32>,
}

impl ResourceFlag {
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "--rate-limit-resource '{text}' must be <name>:<count> or <name>:<count>:<device>, with whole numbers"
            )
        };
        let parts: Vec<&str> = text.split(':').collect();
        let (name, count, device) = match parts[..] {
            [name, count] => (name, count, None),
            [name, count, device] => (name, count, Some(device)),
            _ => return Err(bad()),
        };
        if name.is_empty() {
            return Err(bad());
        }
        Ok(ResourceFlag {
            name: name.to_string(),
            count: count.parse().map_err(|_| bad())?,
            device: device
                .map(|d| d.parse::<i32>().ok().filter(|d| *d >= 0).ok_or_else(bad))
                .transpose()?,
        })
    }
}

/// What one instance needs to run, and where it stands in the weighted order.
#[derive(Debug)]
struct Member {
    needs: Vec<(Key, u64)>,
    /// Turns cost this much virtual time: priority 2 gets half the turns of priority 1.
    weight: u64,
    /// Virtual time at which this instance's last turn ended.
    finish: u64,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    start: u64,
    seq: u64,
}

/// The node's resources and who holds or waits for them. Sans-IO: callers ask and release, and
/// learn whom a release lets run.
#[derive(Debug, Default)]
pub struct Pools {
    /// From `--rate-limit-resource`; when any is given, a resource not named has no copies.
    explicit: Vec<ResourceFlag>,
    members: HashMap<u64, Member>,
    in_use: HashMap<Key, u64>,
    waiting: Vec<Waiter>,
    /// The start of the last turn given; a waiter that was idle starts no earlier.
    clock: u64,
    seq: u64,
}

impl Pools {
    pub fn new(explicit: Vec<ResourceFlag>) -> Self {
        Pools {
            explicit,
            ..Default::default()
        }
    }

    /// Copies of `key`: as the flags say when any were given, else the most any member needs.
    pub fn capacity(&self, key: &Key) -> u64 {
        if !self.explicit.is_empty() {
            let named = self.explicit.iter().filter(|f| f.name == key.name);
            return match key.scope {
                Scope::Global => named.map(|f| f.count).max(),
                Scope::Device(d) => named
                    .filter(|f| f.device.is_none_or(|fd| fd == d))
                    .map(|f| f.count)
                    .max(),
            }
            .unwrap_or(0);
        }
        self.members
            .values()
            .flat_map(|m| m.needs.iter())
            .filter(|(k, _)| k == key)
            .map(|(_, n)| *n)
            .max()
            .unwrap_or(0)
    }

    /// Adds an instance on `device` (CPU instances count as device 0, as in Triton) with its
    /// group's rate-limiter config. Refused with Triton's words when a resource is both global and
    /// per device, or when the flags leave fewer copies than the instance needs.
    pub fn join(&mut self, id: u64, device: i32, config: &ModelRateLimiter) -> Result<(), String> {
        let mut needs: BTreeMap<Key, u64> = BTreeMap::new();
        for r in &config.resources {
            let scope = if r.global { Scope::Global } else { Scope::Device(device) };
            let need = needs
                .entry(Key {
                    name: r.name.clone(),
                    scope,
                })
                .or_default();
            *need = (*need).max(u64::from(r.count));
        }
        for key in needs.keys() {
            let clash = self
                .members
                .values()
                .flat_map(|m| m.needs.iter())
                .any(|(k, _)| k.name == key.name && ((k.scope == Scope::Global) != (key.scope == Scope::Global)));
            if clash {
                return Err(format!(
                    "Resource \"{}\" is present as both global and device-specific resource in the model configuration.",
                    key.name
                ));
            }
        }
        if !self.explicit.is_empty() {
            for (key, need) in &needs {
                let limit = self.capacity(key);
                if limit < *need {
                    return Err(format!(
                        "Resource count for \"{}\" is limited to {limit} which will prevent scheduling of one or more model instances, the minimum required count is {need}",
                        key.name
                    ));
                }
            }
        }
        self.members.insert(
            id,
            Member {
                needs: needs.into_iter().collect(),
                weight: u64::from(config.priority.max(1)),
                finish: self.clock,
            },
        );
        Ok(())
    }

    /// Removes an instance (it holds nothing and waits for nothing by then); returns whom its
    /// departure lets run (default copies may shrink, never below what a waiter needs alone).
    pub fn leave(&mut self, id: u64) -> Vec<u64> {
        self.members.remove(&id);
        self.waiting.retain(|w| w.id != id);
        self.schedule()
    }

    fn fits(&self, id: u64) -> bool {
        self.members.get(&id).is_some_and(|m| {
            m.needs
                .iter()
                .all(|(k, n)| self.in_use.get(k).copied().unwrap_or(0) + n <= self.capacity(k))
        })
    }

    /// Asks for a turn; returns the instances granted now (this one, if its turn came at once;
    /// else it waits for a `release` to grant it). An instance that never joined is granted.
    pub fn request(&mut self, id: u64) -> Vec<u64> {
        let Some(m) = self.members.get(&id) else {
            return vec![id];
        };
        let start = m.finish.max(self.clock);
        self.seq += 1;
        self.waiting.push(Waiter {
            id,
            start,
            seq: self.seq,
        });
        self.schedule()
    }

    /// Gives back what a turn held; `again`: the instance has its next batch in hand, so it joins
    /// the line at the same moment, and the next turn goes by priority between it and the others
    /// (else whoever waits alone would take every other turn). Returns the instances now granted.
    pub fn release(&mut self, id: u64, again: bool) -> Vec<u64> {
        if let Some(m) = self.members.get(&id) {
            for (k, n) in &m.needs {
                if let Some(used) = self.in_use.get_mut(k) {
                    *used = used.saturating_sub(*n);
                }
            }
        }
        if again {
            return self.request(id);
        }
        self.schedule()
    }

    /// Takes the instance out of line, or gives back a turn it was granted and never took (its
    /// next batch was not run after all); returns the instances now granted.
    pub fn withdraw(&mut self, id: u64, granted: bool) -> Vec<u64> {
        if granted {
            return self.release(id, false);
        }
        self.waiting.retain(|w| w.id != id);
        self.schedule()
    }

    /// Whether the instance is in line for a turn.
    pub fn is_waiting(&self, id: u64) -> bool {
        self.waiting.iter().any(|w| w.id == id)
    }

    /// Grants turns in order of virtual start time while the first in line fits; it is never
    /// overtaken, so an instance that needs many copies is not starved by ones that need few.
    fn schedule(&mut self) -> Vec<u64> {
        let mut granted = Vec::new();
        while let Some(pos) = (0..self.waiting.len()).min_by_key(|&i| (self.waiting[i].start, self.waiting[i].seq)) {
            let id = self.waiting[pos].id;
            if !self.fits(id) {
                break;
            }
            let w = self.waiting.swap_remove(pos);
            self.clock = self.clock.max(w.start);
            if let Some(m) = self.members.get_mut(&id) {
                m.finish = w.start + m.weight;
                for (k, n) in &m.needs {
                    *self.in_use.entry(k.clone()).or_default() += n;
                }
            }
            granted.push(id);
        }
        granted
    }

    /// Copies in use of `key`, for tests and logs.
    pub fn in_use(&self, key: &Key) -> u64 {
        self.in_use.get(key).copied().unwrap_or(0)
    }
}

/// The node's rate limiter: `None` inside when `--rate-limit off` (the default), so every config's
/// `rate_limiter` is ignored as Triton ignores it.
pub struct Limiter {
    pools: Option<Mutex<(Pools, Vec<u64>)>>,
    turn: Condvar,
    next_id: AtomicU64,
}

impl Limiter {
    /// From `--rate-limit` (`off` or `execution_count`) and `--rate-limit-resource`.
    pub fn from_flags(mode: Option<&str>, resources: &[String]) -> Result<Arc<Self>, String> {
        let on = match mode.unwrap_or("off") {
            "off" => false,
            "execution_count" => true,
            other => return Err(format!("--rate-limit '{other}' is not one of off, execution_count")),
        };
        let flags = resources
            .iter()
            .map(|r| ResourceFlag::parse(r))
            .collect::<Result<Vec<_>, _>>()?;
        if on {
            tracing::info!(
                resources = flags.len(),
                "rate limiter on: instances run while their resources are free"
            );
        } else if !flags.is_empty() {
            tracing::warn!("--rate-limit-resource has no effect while --rate-limit is off");
        }
        Ok(Arc::new(Limiter {
            pools: on.then(|| Mutex::new((Pools::new(flags), Vec::new()))),
            turn: Condvar::new(),
            next_id: AtomicU64::new(0),
        }))
    }

    /// Enrols an instance: `None` when nothing limits it (limiter off, or a group without resources).
    pub fn join(
        self: &Arc<Self>,
        device: i32,
        config: Option<&ModelRateLimiter>,
    ) -> Result<Option<Arc<Enrolled>>, String> {
        let (Some(pools), Some(config)) = (&self.pools, config) else {
            return Ok(None);
        };
        if config.resources.is_empty() {
            return Ok(None);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        pools.locked().0.join(id, device, config)?;
        Ok(Some(Arc::new(Enrolled {
            limiter: self.clone(),
            id,
        })))
    }

    /// The pools and the turns granted but not yet taken, locked.
    fn pools(&self) -> std::sync::MutexGuard<'_, (Pools, Vec<u64>)> {
        self.pools
            .as_ref()
            .expect("members exist only while the limiter is on")
            .locked()
    }

    fn with<T>(&self, f: impl FnOnce(&mut Pools, &mut Vec<u64>) -> T) -> T {
        let mut guard = self.pools();
        let (p, granted) = &mut *guard;
        let out = f(p, granted);
        drop(guard);
        self.turn.notify_all();
        out
    }
}

/// An enrolled instance; dropping it leaves the pools.
pub struct Enrolled {
    limiter: Arc<Limiter>,
    id: u64,
}

/// A granted turn; dropping it gives the resources back (as `end(false)`).
pub struct Turn<'a> {
    member: &'a Enrolled,
    /// Set once `end` gave the resources back, so dropping does nothing more.
    ended: bool,
}

impl Turn<'_> {
    /// Ends the turn; `again` when the instance has its next batch in hand (see `Pools::release`).
    pub fn end(mut self, again: bool) {
        let id = self.member.id;
        self.member
            .limiter
            .with(|p, granted| granted.extend(p.release(id, again)));
        self.ended = true;
    }
}

impl Enrolled {
    /// Waits (blocking the executor thread) until the instance's resources are free.
    pub fn wait_turn(&self) -> Turn<'_> {
        let mut guard = self.limiter.pools();
        let (p, granted) = &mut *guard;
        // A turn asked for when the last one ended may be granted or in line already.
        if !granted.contains(&self.id) && !p.is_waiting(self.id) {
            granted.extend(p.request(self.id));
            if granted.iter().any(|g| *g != self.id) {
                self.limiter.turn.notify_all();
            }
        }
        loop {
            let granted = &mut guard.1;
            if let Some(pos) = granted.iter().position(|g| *g == self.id) {
                granted.swap_remove(pos);
                return Turn {
                    member: self,
                    ended: false,
                };
            }
            guard = self.limiter.turn.wait(guard).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Gives up a turn asked for when the last one ended (`Turn::end(true)`), when the batch it
    /// was for is not run after all, so its place or its resources go to others.
    pub fn withdraw(&self) {
        let id = self.id;
        self.limiter.with(|p, granted| withdraw(p, granted, id));
    }

    /// A turn if one is free now with nobody waiting ahead (for the inline path, which must not block).
    pub fn try_turn(&self) -> Option<Turn<'_>> {
        let mut guard = self.limiter.pools();
        let p = &mut guard.0;
        if !p.waiting.is_empty() || !p.fits(self.id) {
            return None;
        }
        let granted = p.request(self.id);
        debug_assert_eq!(granted, [self.id], "nobody waited, so only this instance is granted");
        Some(Turn {
            member: self,
            ended: false,
        })
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if !self.ended {
            let id = self.member.id;
            self.member
                .limiter
                .with(|p, granted| granted.extend(p.release(id, false)));
        }
    }
}

/// Takes `id` out of line, or back from `granted` with its resources, and records whom that lets run.
fn withdraw(p: &mut Pools, granted: &mut Vec<u64>, id: u64) {
    let held = granted.contains(&id);
    granted.retain(|g| *g != id);
    let next = p.withdraw(id, held);
    granted.extend(next);
}

impl Drop for Enrolled {
    fn drop(&mut self) {
        let id = self.id;
        self.limiter.with(|p, granted| {
            withdraw(p, granted, id);
            granted.extend(p.leave(id));
        });
    }
}
