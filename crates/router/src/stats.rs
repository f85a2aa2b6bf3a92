//! The statistics extension across the cluster: each node's statistics of a model, summed per
//! model version (counts and durations add up; the last inference is the latest of all).
use std::collections::BTreeMap;

use mesh::proto::{
    InferBatchStatistics, InferResponseStatistics, InferStatistics, ModelStatistics, ModelStatisticsResponse,
    StatisticDuration,
};

fn add_duration(into: &mut Option<StatisticDuration>, from: Option<StatisticDuration>) {
    if let Some(f) = from {
        let d = into.get_or_insert_with(Default::default);
        // Peer numbers: saturate rather than overflow.
        d.count = d.count.saturating_add(f.count);
        d.ns = d.ns.saturating_add(f.ns);
    }
}

fn add_infer(into: &mut InferStatistics, from: InferStatistics) {
    add_duration(&mut into.success, from.success);
    add_duration(&mut into.fail, from.fail);
    add_duration(&mut into.queue, from.queue);
    add_duration(&mut into.compute_input, from.compute_input);
    add_duration(&mut into.compute_infer, from.compute_infer);
    add_duration(&mut into.compute_output, from.compute_output);
    add_duration(&mut into.cache_hit, from.cache_hit);
    add_duration(&mut into.cache_miss, from.cache_miss);
}

fn add_response(into: &mut InferResponseStatistics, from: InferResponseStatistics) {
    add_duration(&mut into.compute_infer, from.compute_infer);
    add_duration(&mut into.compute_output, from.compute_output);
    add_duration(&mut into.success, from.success);
    add_duration(&mut into.fail, from.fail);
    add_duration(&mut into.empty_response, from.empty_response);
    add_duration(&mut into.cancel, from.cancel);
}

fn add_batches(into: &mut Vec<InferBatchStatistics>, from: Vec<InferBatchStatistics>) {
    for b in from {
        match into.iter_mut().find(|x| x.batch_size == b.batch_size) {
            Some(x) => {
                add_duration(&mut x.compute_input, b.compute_input);
                add_duration(&mut x.compute_infer, b.compute_infer);
                add_duration(&mut x.compute_output, b.compute_output);
            }
            None => into.push(b),
        }
    }
    into.sort_by_key(|b| b.batch_size);
}

/// Adds one node's statistics of a model version into the cluster's.
pub fn add(into: &mut ModelStatistics, from: ModelStatistics) {
    into.last_inference = into.last_inference.max(from.last_inference);
    into.inference_count = into.inference_count.saturating_add(from.inference_count);
    into.execution_count = into.execution_count.saturating_add(from.execution_count);
    if let Some(s) = from.inference_stats {
        add_infer(into.inference_stats.get_or_insert_with(Default::default), s);
    }
    add_batches(&mut into.batch_stats, from.batch_stats);
    into.memory_usage.extend(from.memory_usage);
    for (k, v) in from.response_stats {
        add_response(into.response_stats.entry(k).or_default(), v);
    }
}

/// Sums several nodes' answers into one, one entry per (model, version), in name order.
pub fn merge(answers: impl IntoIterator<Item = ModelStatisticsResponse>) -> ModelStatisticsResponse {
    let mut by_model: BTreeMap<(String, String), ModelStatistics> = BTreeMap::new();
    for answer in answers {
        for s in answer.model_stats {
            let key = (s.name.clone(), s.version.clone());
            match by_model.get_mut(&key) {
                Some(into) => add(into, s),
                None => {
                    by_model.insert(key, s);
                }
            }
        }
    }
    ModelStatisticsResponse {
        model_stats: by_model.into_values().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(count: u64, ns: u64) -> Option<StatisticDuration> {
        Some(StatisticDuration { count, ns })
    }

    fn node_stats(version: &str, n: u64, last: u64) -> ModelStatistics {
        ModelStatistics {
            name: "m".into(),
            version: version.into(),
            last_inference: last,
            inference_count: n,
            execution_count: n,
            inference_stats: Some(InferStatistics {
                success: d(n, 10 * n),
                queue: d(n, n),
                ..Default::default()
            }),
            batch_stats: vec![InferBatchStatistics {
                batch_size: 1,
                compute_infer: d(n, 5 * n),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn nodes_statistics_add_up_per_version() {
        let a = ModelStatisticsResponse {
            model_stats: vec![node_stats("1", 3, 100), node_stats("2", 1, 50)],
        };
        let mut b1 = node_stats("1", 4, 90);
        b1.batch_stats.push(InferBatchStatistics {
            batch_size: 4,
            compute_infer: d(1, 7),
            ..Default::default()
        });
        let b = ModelStatisticsResponse { model_stats: vec![b1] };
        let merged = merge([a, b]);
        assert_eq!(merged.model_stats.len(), 2);
        let v1 = &merged.model_stats[0];
        assert_eq!(
            (v1.version.as_str(), v1.inference_count, v1.last_inference),
            ("1", 7, 100)
        );
        let s = v1.inference_stats.as_ref().unwrap();
        assert_eq!(s.success, d(7, 70));
        assert_eq!(s.queue, d(7, 7));
        assert_eq!(s.fail, None);
        let sizes: Vec<u64> = v1.batch_stats.iter().map(|b| b.batch_size).collect();
        assert_eq!(sizes, [1, 4]);
        assert_eq!(v1.batch_stats[0].compute_infer, d(7, 35));
        assert_eq!(merged.model_stats[1].inference_count, 1);
    }
}
