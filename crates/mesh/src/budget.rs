//! The in-flight byte budget, shared fairly: bytes admitted and not yet released against a limit,
//! split between models and, within a model, between its clients, so one that floods gets its
//! share and its refusals while the others keep being served.
//!
//! The rule ([`Shares::admit`]), sans-IO:
//! - Anyone is admitted while the bytes in flight stay under the *pool*, the limit less a
//!   *reserve*: an idle server lets one model, or one client, use all of the pool.
//! - The reserve's first half takes a request whose client holds less than its fair share of its
//!   model's; the second half, one whose model also holds less than its fair share. A model's share
//!   is the limit divided among the models holding bytes, plus one; a client's, its model's share
//!   divided among the model's clients holding bytes, plus one. The "plus one" is room for a
//!   newcomer, so a party alone never counts the whole budget as its share and fills the reserve
//!   kept for others.
//! - Past the limit nobody is admitted.
//!
//! A flood at one model (from one client or a thousand) fills the pool and is refused there; a
//! request for another model finds at least the reserve's second half (and the first, unless the
//! flood's many clients, each under its own share, took it), one from another client of the flooded
//! model the first half, as one more client of that model. The reserve is the only part not given
//! away first-come, which is what keeps the budget work-conserving: nothing is set aside per model
//! or per client.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::request::{Client, InferRequest};
use crate::sync::Locked;

/// One model's bytes in flight, and each of its clients' part.
#[derive(Debug, Default)]
struct Holder {
    used: u64,
    clients: HashMap<Client, u64>,
}

/// The sans-IO state of a fair budget: who holds how many bytes, and the rule that admits more.
#[derive(Debug)]
pub struct Shares {
    limit: u64,
    reserve: u64,
    used: u64,
    /// Models holding bytes, and their clients holding bytes (entries go when they hold none).
    models: HashMap<Arc<str>, Holder>,
    /// The flag that sets the limit, named in refusals.
    flag: &'static str,
}

impl Shares {
    /// A budget of `limit` bytes of which `reserve` (at most the limit) is kept for parties under their share.
    pub fn new(limit: u64, reserve: u64, flag: &'static str) -> Self {
        Shares {
            limit,
            reserve: reserve.min(limit),
            used: 0,
            models: HashMap::new(),
            flag,
        }
    }

    /// The fair shares of `model` and of `client`'s requests to it: the limit divided among the
    /// active models plus one, then among that model's active clients plus one (each count with the asker).
    pub fn shares(&self, model: &str, client: Client) -> (u64, u64) {
        let (models, clients) = match self.models.get(model) {
            Some(h) => (
                self.models.len(),
                h.clients.len() + usize::from(!h.clients.contains_key(&client)),
            ),
            None => (self.models.len() + 1, 1),
        };
        let model_share = self.limit / (models as u64 + 1);
        (model_share, model_share / (clients as u64 + 1))
    }

    /// Bytes `model` holds.
    pub fn held_by_model(&self, model: &str) -> u64 {
        self.models.get(model).map_or(0, |h| h.used)
    }

    /// Bytes `client` holds of `model`'s.
    pub fn held(&self, model: &str, client: Client) -> u64 {
        self.models
            .get(model)
            .and_then(|h| h.clients.get(&client))
            .copied()
            .unwrap_or(0)
    }

    /// Bytes in flight.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Checks `bytes` more for `client`'s request to `model` against the rule, and charges them
    /// if admitted. Refusals: UNAVAILABLE for a request larger than the whole budget, OVERLOADED
    /// (retry later, or elsewhere: it never ran) when the budget or the pool is full.
    pub fn admit(&mut self, model: &str, client: Client, bytes: u64) -> Result<()> {
        if bytes > self.limit {
            return Err(Error::unavailable(format!(
                "request of {bytes} bytes is larger than the in-flight budget of {} bytes ({})",
                self.limit, self.flag
            )));
        }
        let after = self.used.saturating_add(bytes);
        if after > self.limit {
            return Err(Error::overloaded(format!(
                "server overloaded: {} bytes of requests in flight, a {bytes}-byte request would pass {} {}; retry later",
                self.used, self.flag, self.limit
            )));
        }
        if after > self.limit - self.reserve {
            let (model_share, client_share) = self.shares(model, client);
            let held = self.held(model, client);
            if held.saturating_add(bytes) > client_share {
                return Err(self.past_share(format!(
                    "model '{model}' from {client} holds {held} bytes of requests in flight, past its fair share of {client_share} bytes"
                )));
            }
            let model_held = self.held_by_model(model);
            if after > self.limit - self.reserve / 2 && model_held.saturating_add(bytes) > model_share {
                return Err(self.past_share(format!(
                    "model '{model}' holds {model_held} bytes of requests in flight, past its fair share of {model_share} bytes"
                )));
            }
        }
        self.charge(model, client, bytes);
        Ok(())
    }

    fn past_share(&self, who: String) -> Error {
        Error::overloaded(format!(
            "server overloaded: {who}; the last {} bytes of {} {} are kept for models and clients under \
             their share; retry later",
            self.reserve, self.flag, self.limit
        ))
    }

    /// Charges `bytes` whatever the rule says: for what is already made and must be kept (an answer
    /// waiting for its client), which then holds back what is admitted next.
    pub fn charge(&mut self, model: &str, client: Client, bytes: u64) {
        self.used += bytes;
        let holder = match self.models.get_mut(model) {
            Some(h) => h,
            None => self.models.entry(Arc::from(model)).or_default(),
        };
        holder.used += bytes;
        *holder.clients.entry(client).or_default() += bytes;
    }

    /// The key under which `model` is held (for a permit to keep, so releasing allocates nothing).
    fn key(&self, model: &str) -> Option<Arc<str>> {
        self.models.get_key_value(model).map(|(k, _)| k.clone())
    }

    /// Gives back `bytes` that `client`'s request to `model` held.
    pub fn release(&mut self, model: &str, client: Client, bytes: u64) {
        self.used = self.used.saturating_sub(bytes);
        let Some(holder) = self.models.get_mut(model) else {
            return;
        };
        holder.used = holder.used.saturating_sub(bytes);
        if let Some(held) = holder.clients.get_mut(&client) {
            *held = held.saturating_sub(bytes);
            if *held == 0 {
                holder.clients.remove(&client);
            }
        }
        if holder.used == 0 {
            self.models.remove(model);
        }
    }
}

/// A [`Shares`] behind a lock, handing out permits that give their bytes back when dropped.
#[derive(Debug)]
pub struct FairBudget {
    shares: Mutex<Shares>,
}

/// Bytes admitted for one request; released when dropped (answered, failed or cancelled alike).
#[derive(Debug)]
pub struct Permit {
    budget: Arc<FairBudget>,
    model: Arc<str>,
    client: Client,
    bytes: u64,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.budget
            .shares
            .locked()
            .release(&self.model, self.client, self.bytes);
    }
}

impl FairBudget {
    /// A budget of `limit` bytes with `reserve` kept for parties under their share; `flag` names the limit in refusals.
    pub fn new(limit: u64, reserve: u64, flag: &'static str) -> Arc<Self> {
        Arc::new(FairBudget {
            shares: Mutex::new(Shares::new(limit, reserve, flag)),
        })
    }

    /// Admits `bytes` for `client`'s request to `model` ([`Shares::admit`]).
    pub fn admit(self: &Arc<Self>, model: &str, client: Client, bytes: u64) -> Result<Permit> {
        let mut shares = self.shares.locked();
        shares.admit(model, client, bytes)?;
        Ok(self.permit(&shares, model, client, bytes))
    }

    /// Admits `request`: its tensors' bytes and [`REQUEST_BYTES`], for its client and model.
    pub fn admit_request(self: &Arc<Self>, request: &InferRequest) -> Result<Permit> {
        let tensors: u64 = request.inputs.iter().map(|i| i.tensor.data.len() as u64).sum();
        self.admit(
            &request.model_name,
            request.client,
            tensors.saturating_add(REQUEST_BYTES),
        )
    }

    /// Charges `bytes` for `client`'s `model` whatever the rule says ([`Shares::charge`]).
    pub fn force(self: &Arc<Self>, model: &str, client: Client, bytes: u64) -> Permit {
        let mut shares = self.shares.locked();
        shares.charge(model, client, bytes);
        self.permit(&shares, model, client, bytes)
    }

    /// The permit for `bytes` just charged, under the key the shares hold `model` by.
    fn permit(self: &Arc<Self>, shares: &Shares, model: &str, client: Client, bytes: u64) -> Permit {
        Permit {
            budget: self.clone(),
            model: shares.key(model).unwrap_or_else(|| Arc::from(model)),
            client,
            bytes,
        }
    }

    /// Bytes in flight.
    pub fn used(&self) -> u64 {
        self.shares.locked().used()
    }
}

/// What one request costs a server besides its tensors (its message, its place in a queue and a
/// mailbox, its answer's channel, the tasks and buffers that carry it), charged with them: requests
/// without tensors are bounded by the budget too, so a flood of them is refused as overload, never
/// queued without end. Measured on a node: a queued tensor-less gRPC request holds 19 to 20 KiB of
/// resident memory (its HTTP/2 stream and buffers included; benches/results/rounds.md, "Issue 52: fair shares").
pub const REQUEST_BYTES: u64 = 20 << 10;

/// A budget of `limit` bytes keeping `reserve` for parties under their share (None: an eighth of the limit).
pub fn with_reserve(limit: u64, reserve: Option<u64>, flag: &'static str) -> Arc<FairBudget> {
    FairBudget::new(limit, reserve.unwrap_or(limit / 8), flag)
}

#[cfg(test)]
mod tests;
