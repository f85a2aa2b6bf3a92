//! A cacheable request's way through the response cache: answered from it on a hit, else computed (every output) and kept, with the cache's statistics.
use std::future::Future;
use std::time::{Duration, Instant};

use mesh::{InferResponse, Result};

use crate::serving::admit::Work;
use crate::serving::cache::{self, ResponseCache};

/// Whether an admitted request may be answered from the cache: not a decoupled or sequence
/// model's (their answers depend on more than the inputs), and only where the model's config
/// enables it.
pub(crate) fn cacheable(work: &Work) -> bool {
    !work.decoupled && work.model.sequences.is_none() && cache::enabled(&work.model.config)
}

/// Answers `work` from `cache`, or computes it with `compute` and keeps the answer. A miss computes
/// every output, so the entry answers later requests for any of them; the caller's are then
/// picked out. Ok(None): the answers went to a stream (nothing is kept).
pub(crate) async fn answer<F, Fut>(cache: &ResponseCache, mut work: Work, compute: F) -> Result<Option<InferResponse>>
where
    F: FnOnce(Work) -> Fut,
    Fut: Future<Output = Result<Option<InferResponse>>>,
{
    let lookup = Instant::now();
    let model = work.model.clone();
    let key = cache::key(
        &work.request.model_name,
        &model.version_label,
        model.stats.load,
        &work.request.inputs,
    );
    if let Some(outputs) = cache.lookup(&key) {
        let took = lookup.elapsed();
        cache.record(took, Duration::ZERO);
        model.stats.cache_hit(work.start.elapsed(), took);
        let request = work.request;
        // A traced hit's trace is written as it is dropped here: its start and end.
        return Ok(Some(InferResponse {
            model_name: request.model_name,
            model_version: model.version_label.clone(),
            id: request.id,
            outputs: cache::select(outputs, &request.outputs)?,
            parameters: Vec::new(),
        }));
    }
    let looked = lookup.elapsed();
    let requested = std::mem::take(&mut work.request.outputs);
    let Some(mut response) = compute(work).await? else {
        return Ok(None);
    };
    let insert = Instant::now();
    cache.insert(key, &response.outputs);
    let inserted = insert.elapsed();
    cache.record(looked, inserted);
    model.stats.cache_miss(looked + inserted);
    response.outputs = cache::select(response.outputs, &requested)?;
    Ok(Some(response))
}
