//! Triton's response cache (`--cache-config local,size=BYTES`, `response_cache { enable: true }`):
//! a bounded least-recently-used map from a request's model and inputs to the outputs it produced.
//! The key is a SHA-256 digest of the model, version and every input (name, type, shape, bytes),
//! so request ids, parameters and the outputs asked for do not change it, as in Triton.
use mesh::sync::Locked;
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use mesh::{Error, NamedTensor, Result};
use metrics::gauge;
use sha2::{Digest, Sha256};

/// What `--cache-config` configures: the `local` cache and its size in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    pub size: usize,
}

impl CacheConfig {
    /// Reads tritonserver's `--cache-config <cache>,<setting>=<value>` values (the last setting
    /// given wins, as in tritonserver). None when no value was given.
    pub fn parse(values: &[String]) -> std::result::Result<Option<CacheConfig>, String> {
        // Triton's words: one cache at most, whichever they are.
        let mut names: Vec<&str> = values
            .iter()
            .filter_map(|v| v.split_once(',').map(|(c, _)| c))
            .collect();
        names.sort_unstable();
        names.dedup();
        if names.len() > 1 {
            return Err("found multiple cache configurations, but only a single cache is currently supported".into());
        }
        let mut size = None;
        for value in values {
            let Some((cache, setting)) = value.split_once(',') else {
                return Err(format!(
                    "--cache-config '{value}': the format is <cache name>,<setting>=<value>, for example local,size=1048576"
                ));
            };
            if cache != "local" {
                return Err(format!(
                    "--cache-config '{value}': unknown cache '{cache}'; the mesh has the 'local' cache"
                ));
            }
            match setting.split_once('=') {
                Some(("size", n)) => {
                    let n: usize = n
                        .trim()
                        .parse()
                        .map_err(|_| format!("--cache-config '{value}': size must be a number of bytes, got '{n}'"))?;
                    if n == 0 {
                        return Err(format!("--cache-config '{value}': size must be positive"));
                    }
                    size = Some(n);
                }
                _ => {
                    return Err(format!(
                        "--cache-config '{value}': the local cache's one setting is size=<bytes>"
                    ))
                }
            }
        }
        match (values.is_empty(), size) {
            (true, _) => Ok(None),
            (false, Some(size)) => Ok(Some(CacheConfig { size })),
            (false, None) => Err("--cache-config: the local cache needs size=<bytes>".into()),
        }
    }
}

/// Whether a model's config asks for its responses to be cached.
pub fn enabled(config: &mesh::config::ModelConfig) -> bool {
    config.response_cache.as_ref().is_some_and(|c| c.enable)
}

/// A request's identity for the cache.
pub type Key = [u8; 32];

/// The key of a request to `model` version `version` (its load `load`) with these inputs, in any order.
pub fn key(model: &str, version: &str, load: u64, inputs: &[NamedTensor]) -> Key {
    let mut h = Sha256::new();
    h.update(load.to_le_bytes());
    let mut field = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    field(model.as_bytes());
    field(version.as_bytes());
    let mut sorted: Vec<&NamedTensor> = inputs.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    for input in sorted {
        field(input.name.as_bytes());
        field(input.tensor.dtype.wire_name().as_bytes());
        let dims: Vec<u8> = input.tensor.shape.iter().flat_map(|d| d.to_le_bytes()).collect();
        field(&dims);
        field(&input.tensor.data);
    }
    h.finalize().into()
}

struct Entry {
    outputs: Vec<NamedTensor>,
    bytes: usize,
    used: u64,
}

#[derive(Default)]
struct Lru {
    entries: HashMap<Key, Entry>,
    /// Last use → key, oldest first.
    order: BTreeMap<u64, Key>,
    bytes: usize,
    clock: u64,
}

/// What an entry costs: its tensors' bytes, names and shapes, plus bookkeeping.
fn cost(outputs: &[NamedTensor]) -> usize {
    const OVERHEAD: usize = 128;
    outputs
        .iter()
        .map(|o| o.tensor.data.len() + o.name.len() + 8 * o.tensor.shape.len() + OVERHEAD)
        .sum::<usize>()
        + OVERHEAD
}

/// The server's one response cache, shared by every model that enables it.
pub struct ResponseCache {
    capacity: usize,
    lru: Mutex<Lru>,
}

impl ResponseCache {
    pub fn new(config: CacheConfig) -> Self {
        metrics::describe_gauge!("nv_cache_util", "Cache utilization [0.0 - 1.0]");
        for (name, help) in [
            ("nv_cache_num_entries", "Number of responses stored in response cache"),
            ("nv_cache_num_hits", "Number of cache hits in response cache"),
            ("nv_cache_num_misses", "Number of cache misses in response cache"),
            ("nv_cache_num_lookups", "Number of cache lookups in response cache"),
            ("nv_cache_num_evictions", "Number of cache evictions in response cache"),
            (
                "nv_cache_lookup_duration",
                "Total cache lookup duration (hit and miss), in microseconds",
            ),
            (
                "nv_cache_insertion_duration",
                "Total cache insertion duration, in microseconds",
            ),
        ] {
            metrics::describe_gauge!(name, help);
            gauge!(name).set(0.0);
        }
        gauge!("nv_cache_util").set(0.0);
        ResponseCache {
            capacity: config.size,
            lru: Mutex::new(Lru::default()),
        }
    }

    fn lru(&self) -> std::sync::MutexGuard<'_, Lru> {
        self.lru.locked()
    }

    /// The outputs stored for `key`, marking them recently used.
    pub fn lookup(&self, key: &Key) -> Option<Vec<NamedTensor>> {
        let mut lru = self.lru();
        lru.clock += 1;
        let now = lru.clock;
        let found = match lru.entries.get_mut(key) {
            Some(e) => {
                let before = std::mem::replace(&mut e.used, now);
                Some((before, e.outputs.clone()))
            }
            None => None,
        };
        gauge!("nv_cache_num_lookups").increment(1.0);
        match found {
            Some((before, outputs)) => {
                lru.order.remove(&before);
                lru.order.insert(now, *key);
                gauge!("nv_cache_num_hits").increment(1.0);
                Some(outputs)
            }
            None => {
                gauge!("nv_cache_num_misses").increment(1.0);
                None
            }
        }
    }

    /// Stores a response's outputs (copied, so no larger buffer they were cut from stays alive),
    /// evicting the least recently used entries to make room. An entry larger than the whole
    /// cache is not stored.
    pub fn insert(&self, key: Key, outputs: &[NamedTensor]) {
        let bytes = cost(outputs);
        if bytes > self.capacity {
            let key: String = key.iter().map(|b| format!("{b:02x}")).collect();
            tracing::error!(
                "Failed to insert key [{key}] into response cache: Requested byte_size: {bytes} is greater than total cache size: {}",
                self.capacity
            );
            return;
        }
        let owned: Vec<NamedTensor> = outputs
            .iter()
            .map(|o| NamedTensor {
                name: o.name.clone(),
                tensor: mesh::Tensor {
                    data: bytes::Bytes::copy_from_slice(&o.tensor.data),
                    ..o.tensor.clone()
                },
            })
            .collect();
        let mut lru = self.lru();
        if lru.entries.contains_key(&key) {
            return; // another request computed it meanwhile
        }
        while lru.bytes + bytes > self.capacity {
            let Some((_, oldest)) = lru.order.pop_first() else {
                break;
            };
            if let Some(e) = lru.entries.remove(&oldest) {
                lru.bytes -= e.bytes;
                gauge!("nv_cache_num_evictions").increment(1.0);
            }
        }
        lru.clock += 1;
        let used = lru.clock;
        lru.order.insert(used, key);
        lru.entries.insert(
            key,
            Entry {
                outputs: owned,
                bytes,
                used,
            },
        );
        lru.bytes += bytes;
        gauge!("nv_cache_num_entries").set(lru.entries.len() as f64);
        gauge!("nv_cache_util").set(lru.bytes as f64 / self.capacity as f64);
    }

    /// Adds to the cache-wide lookup and insertion durations (µs, Triton's gauges).
    pub fn record(&self, lookup: Duration, insertion: Duration) {
        gauge!("nv_cache_lookup_duration").increment(lookup.as_micros() as f64);
        if !insertion.is_zero() {
            gauge!("nv_cache_insertion_duration").increment(insertion.as_micros() as f64);
        }
    }

    #[cfg(test)]
    fn len_and_bytes(&self) -> (usize, usize) {
        let lru = self.lru();
        (lru.entries.len(), lru.bytes)
    }
}

/// The outputs a request asked for (all of them when it named none), in its order; a cached or
/// computed response holds every output of the model.
pub fn select(outputs: Vec<NamedTensor>, requested: &[mesh::RequestedOutput]) -> Result<Vec<NamedTensor>> {
    if requested.is_empty() {
        return Ok(outputs);
    }
    requested
        .iter()
        .map(|r| {
            outputs
                .iter()
                .find(|o| o.name == r.name)
                .cloned()
                .ok_or_else(|| Error::internal(format!("the model produced no output '{}'", r.name)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesh::Tensor;

    fn t(name: &str, values: &[f32]) -> NamedTensor {
        NamedTensor {
            name: name.into(),
            tensor: Tensor::from_values(vec![values.len() as i64], values),
        }
    }

    #[test]
    fn config_values_as_tritonserver_takes_them() {
        let p = |v: &[&str]| CacheConfig::parse(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(p(&[]), Ok(None));
        assert_eq!(p(&["local,size=1048576"]), Ok(Some(CacheConfig { size: 1048576 })));
        assert_eq!(
            p(&["local,size=1", "local,size=2"]),
            Ok(Some(CacheConfig { size: 2 })),
            "last wins"
        );
        for (bad, want) in [
            ("local", "<cache name>,<setting>=<value>"),
            ("redis,host=x", "unknown cache 'redis'"),
            ("local,bogus=1", "one setting is size"),
            ("local,size=abc", "must be a number of bytes"),
            ("local,size=-1", "must be a number of bytes"),
            ("local,size=0", "must be positive"),
        ] {
            let e = p(&[bad]).unwrap_err();
            assert!(e.contains(want), "{bad}: want '{want}' in '{e}'");
        }
    }

    #[test]
    fn the_key_is_the_model_and_inputs_in_any_order() {
        let (a, b) = (t("a", &[1.0]), t("b", &[2.0]));
        let k = key("m", "1", 0, &[a.clone(), b.clone()]);
        assert_eq!(k, key("m", "1", 0, &[b.clone(), a.clone()]));
        assert_ne!(k, key("m", "2", 0, &[a.clone(), b.clone()]));
        assert_ne!(k, key("n", "1", 0, &[a.clone(), b.clone()]));
        assert_ne!(
            k,
            key("m", "1", 1, &[a.clone(), b.clone()]),
            "another load of the version"
        );
        assert_ne!(k, key("m", "1", 0, &[a.clone(), t("b", &[2.5])]));
        // The same bytes under another shape or type are another request.
        let mut reshaped = b.clone();
        reshaped.tensor.shape = vec![1, 1];
        assert_ne!(k, key("m", "1", 0, &[a.clone(), reshaped]));
        let mut retyped = b.clone();
        retyped.tensor.dtype = mesh::DataType::Int32;
        assert_ne!(k, key("m", "1", 0, &[a, retyped]));
    }

    #[test]
    fn hits_return_the_stored_outputs_and_the_least_recent_is_evicted() {
        let one = cost(&[t("y", &[0.0; 4])]);
        let cache = ResponseCache::new(CacheConfig { size: 2 * one });
        let k = |i: u8| [i; 32];
        assert!(cache.lookup(&k(1)).is_none());
        cache.insert(k(1), &[t("y", &[1.0; 4])]);
        cache.insert(k(2), &[t("y", &[2.0; 4])]);
        assert_eq!(cache.lookup(&k(1)).unwrap(), vec![t("y", &[1.0; 4])]);
        // k2 is now the least recently used: the third entry evicts it, not k1.
        cache.insert(k(3), &[t("y", &[3.0; 4])]);
        assert!(cache.lookup(&k(2)).is_none());
        assert!(cache.lookup(&k(1)).is_some() && cache.lookup(&k(3)).is_some());
        assert_eq!(cache.len_and_bytes(), (2, 2 * one));
        // Larger than the whole cache: not stored, nothing evicted.
        cache.insert(k(4), &[t("y", &[0.0; 256])]);
        assert!(cache.lookup(&k(4)).is_none());
        assert_eq!(cache.len_and_bytes().0, 2);
    }

    #[test]
    fn stored_outputs_do_not_hold_the_buffer_they_were_cut_from() {
        let cache = ResponseCache::new(CacheConfig { size: 1 << 20 });
        let batch = bytes::Bytes::from(vec![7u8; 4096]);
        let row = NamedTensor {
            name: "y".into(),
            tensor: Tensor::new(mesh::DataType::Uint8, vec![4], batch.slice(0..4)).unwrap(),
        };
        cache.insert([9; 32], &[row]);
        assert_eq!(
            cache.len_and_bytes().1,
            cost(&[t("y", &[0.0])]),
            "4 bytes + bookkeeping"
        );
        let got = cache.lookup(&[9; 32]).unwrap();
        assert_eq!(got[0].tensor.data.as_ref(), &[7; 4]);
        assert_ne!(got[0].tensor.data.as_ptr(), batch.as_ptr());
    }

    #[test]
    fn select_keeps_the_requested_outputs_in_order() {
        let all = vec![t("a", &[1.0]), t("b", &[2.0])];
        let names = |v: &[NamedTensor]| v.iter().map(|o| o.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&select(all.clone(), &[]).unwrap()), ["a", "b"]);
        let want = [mesh::RequestedOutput::named("b"), mesh::RequestedOutput::named("a")];
        assert_eq!(names(&select(all.clone(), &want).unwrap()), ["b", "a"]);
        assert!(select(all, &[mesh::RequestedOutput::named("z")]).is_err());
    }
}
