//! A reference for the sequence table: the plain model it replaced (every request scans every
//! sequence), run side by side with [`Sequences`] over random requests, comparing every decision.
use std::collections::HashMap;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::super::{SequenceId, SequenceSetup, Sequences, Ticket};
use super::{check, flags};

struct Seq {
    instance: String,
    last: Instant,
    running: u32,
    generation: u64,
    ended: bool,
    /// Which entry this is (a replaced sequence's late requests do not touch the new one).
    entry: u64,
}

#[derive(Default)]
struct Plain {
    seqs: HashMap<u64, Seq>,
    entries: u64,
    generations: u64,
}

/// A request's place, as the plain model keeps it: (entry, generation).
type Place = (u64, u64);

impl Plain {
    /// As `Sequences::try_begin`: Err(()) where it fails, None where a START finds no slot.
    fn begin(
        &mut self,
        id: u64,
        start: bool,
        on: &[&str],
        now: Instant,
        setup: &SequenceSetup,
    ) -> Result<Option<(String, Place)>, ()> {
        self.seqs
            .retain(|_, s| s.running > 0 || now.saturating_duration_since(s.last) <= setup.idle);
        if !start {
            let s = self.seqs.get_mut(&id).filter(|s| !s.ended).ok_or(())?;
            s.running += 1;
            s.last = now;
            return Ok(Some((s.instance.clone(), (s.entry, s.generation))));
        }
        self.generations += 1;
        if let Some(s) = self.seqs.get_mut(&id) {
            if !s.ended && on.contains(&s.instance.as_str()) {
                s.generation = self.generations;
                s.running += 1;
                s.last = now;
                return Ok(Some((s.instance.clone(), (s.entry, s.generation))));
            }
        }
        if on.is_empty() {
            return Err(());
        }
        let held = |i: &str| self.seqs.values().filter(|s| s.instance == i).count();
        let Some(instance) = on
            .iter()
            .map(|i| (held(i), i))
            .filter(|&(n, _)| setup.slots == 0 || n < setup.slots)
            .min_by_key(|&(n, _)| n)
            .map(|(_, i)| i.to_string())
        else {
            return Ok(None);
        };
        self.entries += 1;
        let seq = Seq {
            instance: instance.clone(),
            last: now,
            running: 1,
            generation: self.generations,
            ended: false,
            entry: self.entries,
        };
        self.seqs.insert(id, seq);
        Ok(Some((instance, (self.entries, self.generations))))
    }

    fn finish(&mut self, id: u64, (entry, generation): Place, end: bool, now: Instant) {
        let Some(s) = self.seqs.get_mut(&id).filter(|s| s.entry == entry) else {
            return;
        };
        s.running = s.running.saturating_sub(1);
        s.last = now;
        s.ended |= end && s.generation == generation;
        if s.ended && s.running == 0 {
            self.seqs.remove(&id);
        }
    }
}

/// Runs `steps` random requests (STARTs, others, ENDs, finishes, on changing instances, time moving
/// on by up to 30 ms against a 100 ms idle time, 3 slots an instance) through both.
pub(super) fn compare(seed: u64, steps: usize) {
    let setup = SequenceSetup {
        slots: 3,
        ..(*super::setup(100)).clone()
    };
    let mut table = Sequences::new(std::sync::Arc::new(setup.clone()));
    let mut plain = Plain::default();
    let mut rng = StdRng::seed_from_u64(seed);
    let choices: [&[&str]; 6] = [
        &["i0", "i1"],
        &["i1", "i0"],
        &["i0", "i1", "i2"],
        &["i2"],
        &["i1", "i2"],
        &[],
    ];
    let mut now = Instant::now();
    let mut running: Vec<(u64, bool, Ticket, Place)> = Vec::new();
    let (mut admitted, mut refused) = (0, 0);
    for step in 0..steps {
        if rng.random_bool(0.5) {
            now += Duration::from_millis(rng.random_range(0..30));
        }
        let id = rng.random_range(1..=12u64);
        let on = match choices[rng.random_range(0..choices.len())] {
            [] if rng.random_bool(0.8) => choices[0],
            on => on,
        };
        match rng.random_range(0..10) {
            0..=6 => {
                let (start, end) = (rng.random_bool(0.4), rng.random_bool(0.2));
                let got = table.try_begin("m", &flags(id, start, end), on, now);
                let want = plain.begin(id, start, on, now, &setup);
                let seen = got
                    .as_ref()
                    .map(|t| t.as_ref().map(|t| t.instance.clone()))
                    .map_err(|_| ());
                assert_eq!(
                    seen,
                    want.as_ref().map(|w| w.as_ref().map(|w| w.0.clone())).map_err(|_| ()),
                    "step {step}"
                );
                if let (Ok(Some(ticket)), Ok(Some((_, place)))) = (got, want) {
                    running.push((id, end, ticket, place));
                    admitted += 1;
                } else {
                    refused += 1;
                }
            }
            _ if !running.is_empty() => {
                let (id, end, ticket, place) = running.swap_remove(rng.random_range(0..running.len()));
                table.finish(&SequenceId::Int(id), &ticket, None, end, now);
                plain.finish(id, place, end, now);
            }
            _ => {}
        }
        check(&table);
        assert_eq!(
            table.len(now),
            plain
                .seqs
                .values()
                .filter(|s| s.running > 0 || now.saturating_duration_since(s.last) <= setup.idle)
                .count()
        );
        let mut live: Vec<_> = table
            .active
            .iter()
            .map(|(id, a)| (id.clone(), a.instance.clone(), a.running, a.ended))
            .collect();
        let mut want: Vec<_> = plain
            .seqs
            .iter()
            .map(|(id, s)| (SequenceId::Int(*id), s.instance.clone(), s.running, s.ended))
            .collect();
        live.sort_by_key(|l| format!("{:?}", l));
        want.sort_by_key(|l| format!("{:?}", l));
        assert_eq!(live, want, "step {step}");
    }
    assert!(
        admitted > steps / 4 && refused > steps / 20,
        "{admitted} admitted, {refused} refused"
    );
}
