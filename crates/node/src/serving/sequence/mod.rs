//! Sequence batching (stateful models): which requests belong to which sequence, the instance a
//! sequence is pinned to, its order (one request at a time, in arrival order), its implicit state,
//! and its end by END, by idleness or by a new START. The table is sans-IO (time is passed in).
pub mod inputs;
pub mod setup;

use mesh::sync::Locked;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh::params::SequenceControls;
use mesh::{Error, Result, Tensor};

pub use setup::SequenceSetup;

pub use mesh::params::SequenceId;

/// The sequence parameters of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Flags {
    pub id: SequenceId,
    pub start: bool,
    pub end: bool,
}

impl Flags {
    /// The flags of a request's sequence controls (parsed once, [`mesh::params::Controls`]); a
    /// sequence model needs a non-zero, non-empty id.
    pub fn of(model: &str, controls: &SequenceControls) -> Result<Flags> {
        let id = controls.id.clone().ok_or_else(|| {
            Error::invalid(format!(
                "inference request to model '{model}' must specify a non-zero or non-empty correlation ID (sequence_id)"
            ))
        })?;
        Ok(Flags {
            id,
            start: controls.start,
            end: controls.end,
        })
    }
}

struct Active {
    instance: String,
    /// One tensor per implicit state, for one row.
    state: Vec<Tensor>,
    last: Instant,
    /// Requests admitted and not yet finished; a busy sequence never idles out.
    running: u32,
    /// Held by the request of the sequence that runs; later ones wait their turn in order.
    turn: Arc<tokio::sync::Mutex<()>>,
    /// Bumped by each START, so an answer of the previous sequence cannot overwrite the new state.
    generation: u64,
    /// Its END has run; requests admitted behind it fail as not active, and the entry goes once
    /// they are done.
    ended: bool,
    /// Its key in [`IdleIndex`] while it is idle (`running == 0`).
    idle: Option<IdleKey>,
}

/// When a sequence went idle (its `last`), and a stamp that tells apart those idle since the same
/// instant.
type IdleKey = (Instant, u64);

/// The idle sequences (`running == 0`), the longest idle first, so that expiry looks only at those
/// it removes.
#[derive(Default)]
struct IdleIndex {
    by_last: BTreeMap<IdleKey, SequenceId>,
    stamps: u64,
}

impl IdleIndex {
    /// Files a sequence as its `running` and `last` now say: out while busy, at `last` while idle.
    fn file(&mut self, id: &SequenceId, a: &mut Active) {
        self.forget(a);
        if a.running == 0 {
            self.stamps += 1;
            let key = (a.last, self.stamps);
            self.by_last.insert(key, id.clone());
            a.idle = Some(key);
        }
    }

    /// Takes out a sequence that leaves the table (or becomes busy).
    fn forget(&mut self, a: &mut Active) {
        if let Some(key) = a.idle.take() {
            self.by_last.remove(&key);
        }
    }

    /// Takes out the longest idle sequence if at `now` it has been idle longer than `idle`.
    fn pop_expired(&mut self, now: Instant, idle: Duration) -> Option<SequenceId> {
        let oldest = self.by_last.first_entry()?;
        (now.saturating_duration_since(oldest.key().0) > idle).then(|| oldest.remove())
    }

    /// How many sequences have been idle longer than `idle` at `now`.
    fn expired(&self, now: Instant, idle: Duration) -> usize {
        self.by_last
            .keys()
            .take_while(|(last, _)| now.saturating_duration_since(*last) > idle)
            .count()
    }
}

/// How many sequences each instance holds: every entry of the table, those ended but still running
/// and those idle but not yet expired included.
#[derive(Default)]
struct Held(HashMap<String, usize>);

impl Held {
    fn of(&self, instance: &str) -> usize {
        self.0.get(instance).copied().unwrap_or(0)
    }

    fn hold(&mut self, instance: &str) {
        match self.0.get_mut(instance) {
            Some(n) => *n += 1,
            None => {
                self.0.insert(instance.to_string(), 1);
            }
        }
    }

    fn release(&mut self, instance: &str) {
        if let Some(n) = self.0.get_mut(instance) {
            *n -= 1;
            if *n == 0 {
                self.0.remove(instance);
            }
        }
    }
}

fn not_active(model: &str, id: &SequenceId) -> Error {
    Error::invalid(format!(
        "inference request for sequence {id} to model '{model}' must specify the START flag on the first request of the sequence \
         (the sequence is not active here: it never started, it ended, it was idle longer than max_sequence_idle_microseconds, \
         or the node that held it was lost)"
    ))
}

/// A request's place in its sequence, from [`Sequences::try_begin`].
#[derive(Debug, Clone)]
pub struct Ticket {
    pub instance: String,
    pub turn: Arc<tokio::sync::Mutex<()>>,
    generation: u64,
}

/// The active sequences of one model version.
pub struct Sequences {
    setup: Arc<SequenceSetup>,
    active: HashMap<SequenceId, Active>,
    /// The entries of `active` that are idle, by how long.
    idle: IdleIndex,
    /// The entries of `active` per instance.
    held: Held,
    generations: u64,
    /// Told when a sequence ends or idles out, for STARTs waiting for a slot.
    freed: Arc<tokio::sync::Notify>,
}

/// How often a START waiting for a slot looks again without being told (idle sequences expire
/// only when a request comes, so with none coming nothing tells the waiter).
const BACKLOG_RECHECK: std::time::Duration = std::time::Duration::from_millis(100);

impl Sequences {
    pub fn new(setup: Arc<SequenceSetup>) -> Self {
        Sequences {
            setup,
            active: HashMap::new(),
            idle: IdleIndex::default(),
            held: Held::default(),
            generations: 0,
            freed: Arc::new(tokio::sync::Notify::new()),
        }
    }

    pub fn setup(&self) -> &Arc<SequenceSetup> {
        &self.setup
    }

    /// Removes the sequences idle longer than the setup's idle time at `now` (a running one never
    /// idles out), freeing their slots.
    fn expire(&mut self, now: Instant) {
        let mut freed = false;
        while let Some(id) = self.idle.pop_expired(now, self.setup.idle) {
            if let Some(a) = self.active.remove(&id) {
                self.held.release(&a.instance);
                freed = true;
            }
        }
        if freed {
            self.freed.notify_waiters();
        }
    }

    /// Admits a request of a sequence. START begins (or restarts) the sequence on the instance
    /// holding the fewest sequences among `instances`; any other request needs the sequence active.
    /// (Tests' shorthand: serving waits for a slot through [`Step::admit`].)
    #[cfg(test)]
    pub fn begin(&mut self, model: &str, flags: &Flags, instances: &[&str], now: Instant) -> Result<Ticket> {
        self.try_begin(model, flags, instances, now)?.ok_or_else(|| {
            Error::unavailable(format!(
                "model '{model}': every instance holds {} sequences, its most",
                self.setup.slots
            ))
        })
    }

    /// Admits a request of a sequence (START: on the instance holding the fewest sequences among
    /// `instances`; others need the sequence active), or None for a START that finds every
    /// instance's slots taken (it may wait).
    pub fn try_begin(
        &mut self,
        model: &str,
        flags: &Flags,
        instances: &[&str],
        now: Instant,
    ) -> Result<Option<Ticket>> {
        self.expire(now);
        if flags.start {
            self.generations += 1;
            let generation = self.generations;
            if let Some(a) = self.active.get_mut(&flags.id) {
                if !a.ended && instances.contains(&a.instance.as_str()) {
                    // A new START for an active sequence restarts it where it is, after what is
                    // running; the initial state is taken when its turn comes.
                    a.generation = generation;
                    a.running += 1;
                    a.last = now;
                    self.idle.forget(a);
                    return Ok(Some(Ticket {
                        instance: a.instance.clone(),
                        turn: a.turn.clone(),
                        generation,
                    }));
                }
            }
            // New, or replacing one that ended or whose instance is gone (its waiters fail).
            if instances.is_empty() {
                return Err(Error::unavailable(format!("model '{model}' has no ready instance")));
            }
            let Some(instance) = self.least_loaded(instances) else {
                return Ok(None);
            };
            let turn = Arc::new(tokio::sync::Mutex::new(()));
            let active = Active {
                instance: instance.clone(),
                state: Vec::new(),
                last: now,
                running: 1,
                turn: turn.clone(),
                generation,
                ended: false,
                idle: None,
            };
            self.held.hold(&instance);
            if let Some(mut replaced) = self.active.insert(flags.id.clone(), active) {
                self.idle.forget(&mut replaced);
                self.held.release(&replaced.instance);
                if replaced.instance != instance {
                    self.freed.notify_waiters();
                }
            }
            return Ok(Some(Ticket {
                instance,
                turn,
                generation,
            }));
        }
        match self.active.get_mut(&flags.id).filter(|a| !a.ended) {
            Some(a) => {
                a.running += 1;
                a.last = now;
                self.idle.forget(a);
                Ok(Some(Ticket {
                    instance: a.instance.clone(),
                    turn: a.turn.clone(),
                    generation: a.generation,
                }))
            }
            None => Err(not_active(model, &flags.id)),
        }
    }

    /// The state to feed a request whose turn has come: the initial state for a START, else what
    /// the sequence's previous request left. A request admitted behind its sequence's END (or
    /// behind a START that replaced it) finds it not active.
    pub fn state(&self, model: &str, flags: &Flags, ticket: &Ticket) -> Result<Vec<Tensor>> {
        let a = self
            .active
            .get(&flags.id)
            .filter(|a| Arc::ptr_eq(&a.turn, &ticket.turn) && !a.ended)
            .ok_or_else(|| not_active(model, &flags.id))?;
        if flags.start {
            return Ok(self.setup.states.iter().map(|s| s.initial.clone()).collect());
        }
        Ok(a.state.clone())
    }

    /// Ends a request's part: stores the state it produced (None: it failed, the state stays),
    /// and ends the sequence after its END request.
    pub fn finish(&mut self, id: &SequenceId, ticket: &Ticket, state: Option<Vec<Tensor>>, end: bool, now: Instant) {
        let Some(a) = self.active.get_mut(id).filter(|a| Arc::ptr_eq(&a.turn, &ticket.turn)) else {
            return; // the sequence was replaced meanwhile
        };
        a.running = a.running.saturating_sub(1);
        a.last = now;
        if a.generation == ticket.generation {
            if let Some(state) = state {
                a.state = state;
            }
            a.ended |= end;
        }
        if a.ended && a.running == 0 {
            if let Some(mut a) = self.active.remove(id) {
                self.idle.forget(&mut a);
                self.held.release(&a.instance);
            }
            self.freed.notify_waiters();
        } else {
            self.idle.file(id, a);
        }
    }

    /// The instance among `instances` holding the fewest sequences (the first of those on a tie),
    /// if one has a free slot.
    fn least_loaded(&self, instances: &[&str]) -> Option<String> {
        let slots = self.setup.slots;
        instances
            .iter()
            .map(|i| (self.held.of(i), i))
            .filter(|&(held, _)| slots == 0 || held < slots)
            .min_by_key(|&(held, _)| held)
            .map(|(_, i)| i.to_string())
    }

    /// How many sequences are active (for tests and metrics).
    pub fn len(&self, now: Instant) -> usize {
        self.active.len() - self.idle.expired(now, self.setup.idle)
    }
}

/// One request's passage through its sequence: admitted by [`Step::admit`], its controls and
/// state added when its turn comes, its next state stored by [`Step::finish`]. Dropped unfinished
/// (it failed, or its client went away), it leaves the state as it was.
pub struct Step {
    table: Arc<std::sync::Mutex<Sequences>>,
    /// The model's setup (fixed at load).
    setup: Arc<SequenceSetup>,
    pub flags: Flags,
    pub ticket: Ticket,
    finished: bool,
}

/// Ids the node gives requests without one to `iterative_sequence` models: from 2^63 up, away from
/// the small numbers clients pick.
static ITERATIVE_IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1 << 63);

fn lock(table: &std::sync::Mutex<Sequences>) -> std::sync::MutexGuard<'_, Sequences> {
    table.locked()
}

impl Step {
    /// Admits a request of `rows` rows to its sequence among the model's ready `instances`, or
    /// fails where [`Step::admit`] would wait (tests' shorthand, from the request's parameters).
    #[cfg(test)]
    pub fn begin(
        table: &Arc<std::sync::Mutex<Sequences>>,
        request: &mesh::InferRequest,
        rows: usize,
        instances: &[&str],
    ) -> Result<Step> {
        let model = &request.model_name;
        let controls = mesh::params::Controls::parse(&request.parameters)?;
        let flags = Self::flags(table, model, &controls.sequence, rows)?;
        let (ticket, setup) = {
            let mut t = lock(table);
            (t.begin(model, &flags, instances, Instant::now())?, t.setup().clone())
        };
        Ok(Step {
            table: table.clone(),
            setup,
            flags,
            ticket,
            finished: false,
        })
    }

    /// The request's sequence flags (an iterative sequence's own id when it has none).
    fn flags(
        table: &Arc<std::sync::Mutex<Sequences>>,
        model: &str,
        controls: &SequenceControls,
        rows: usize,
    ) -> Result<Flags> {
        let iterative = lock(table).setup().iterative;
        let flags = match controls.id {
            None if iterative => Flags {
                id: SequenceId::Int(ITERATIVE_IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)),
                start: true,
                end: true,
            },
            _ => Flags::of(model, controls)?,
        };
        if rows != 1 {
            return Err(Error::invalid(format!(
                "inference request to model '{model}' must specify batch-size 1 due to requirements of sequence batcher"
            )));
        }
        Ok(flags)
    }

    /// Admits a request of `model` with these sequence `controls` (its parameters, parsed once when
    /// it was admitted) and `rows` rows to its sequence among the model's ready `instances`; a START
    /// that finds every instance's slots taken waits for one to free (a sequence ending, or idling
    /// out), as in Triton's backlog; the request was admitted to the budget before, so waiting holds it.
    pub async fn admit(
        table: &Arc<std::sync::Mutex<Sequences>>,
        model: &str,
        controls: &SequenceControls,
        rows: usize,
        instances: &[&str],
    ) -> Result<Step> {
        let flags = Self::flags(table, model, controls, rows)?;
        loop {
            let freed = {
                let mut t = lock(table);
                if let Some(ticket) = t.try_begin(model, &flags, instances, Instant::now())? {
                    return Ok(Step {
                        table: table.clone(),
                        setup: t.setup().clone(),
                        flags,
                        ticket,
                        finished: false,
                    });
                }
                t.freed.clone()
            };
            let _ = tokio::time::timeout(BACKLOG_RECHECK, freed.notified()).await;
        }
    }

    /// Adds the controls and the sequence's current state (call once the turn is held).
    pub fn add_inputs(&self, model: &str, batched: bool, inputs: &mut Vec<mesh::NamedTensor>) -> Result<()> {
        let state = lock(&self.table).state(model, &self.flags, &self.ticket)?;
        inputs::add(model, &self.setup, &self.flags, state, batched, inputs)
    }

    /// The outputs to ask the backend for (see [`inputs::outputs`]).
    pub fn outputs(&self, requested: Vec<String>, config_outputs: &[String]) -> Vec<String> {
        inputs::outputs(&self.setup, requested, config_outputs)
    }

    /// Takes the next state out of the answer and stores it; ends the sequence after END.
    pub fn finish(mut self, batched: bool, outputs: &mut Vec<mesh::NamedTensor>) -> Result<()> {
        let (state, result) = match inputs::take_states(&self.setup, outputs, batched) {
            Ok(state) => (Some(state), Ok(())),
            Err(e) => (None, Err(e)),
        };
        lock(&self.table).finish(&self.flags.id, &self.ticket, state, self.flags.end, Instant::now());
        self.finished = true;
        result
    }
}

impl Drop for Step {
    fn drop(&mut self) {
        if !self.finished {
            lock(&self.table).finish(&self.flags.id, &self.ticket, None, self.flags.end, Instant::now());
        }
    }
}

#[cfg(test)]
mod tests;
