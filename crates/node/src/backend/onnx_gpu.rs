//! Triton's ONNX Runtime GPU settings read from a model's config (sans-IO): the CUDA execution
//! provider's options and, with `gpu_execution_accelerator { name: "tensorrt" }`, TensorRT's, each
//! as the option names ONNX Runtime takes, with Triton's errors for values it refuses.
//!
//! As Triton's onnxruntime backend (r24.10) reads them:
//! - `optimization { execution_accelerators { gpu_execution_accelerator [ { name: "cuda",
//!   parameters { ... } } ] } }`: every parameter goes to the CUDA provider as it is (so
//!   `enable_cuda_graph`, `cudnn_conv_use_max_workspace`, `use_tf32` ... all work);
//!   `do_copy_in_default_stream` and `use_ep_level_unified_stream` must be booleans;
//! - `name: "tensorrt"`: Triton's keys, mapped to the TensorRT provider's (`precision_mode` FP16 or
//!   INT8 turns on `trt_fp16_enable` / `trt_int8_enable`, `max_workspace_size_bytes` is
//!   `trt_max_workspace_size`, the `trt_*` keys keep their names), each value checked for its type;
//! - the older model `parameters` `cudnn_conv_algo_search` (0, 1, 2: EXHAUSTIVE, HEURISTIC,
//!   DEFAULT), `gpu_mem_limit`, `arena_extend_strategy` (0, 1: kNextPowerOfTwo, kSameAsRequested)
//!   and `do_copy_in_default_stream`, which win over the accelerator's, as in Triton.
use mesh::config::ModelConfig;

/// The options of the GPU execution providers of one ONNX model, in the order they apply.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuSettings {
    /// CUDA provider options (name, value), sorted by name.
    pub cuda: Vec<(String, String)>,
    /// TensorRT provider options, when the config asks for TensorRT (it runs first; CUDA takes what
    /// TensorRT cannot run).
    pub tensorrt: Option<Vec<(String, String)>>,
}

#[derive(Clone, Copy)]
enum Kind {
    Bool,
    Int,
    Unsigned,
    Text,
}

/// Triton's TensorRT keys: (Triton's key, ONNX Runtime's option, value type).
const TENSORRT: &[(&str, &str, Kind)] = &[
    ("max_workspace_size_bytes", "trt_max_workspace_size", Kind::Unsigned),
    (
        "trt_max_partition_iterations",
        "trt_max_partition_iterations",
        Kind::Int,
    ),
    ("trt_min_subgraph_size", "trt_min_subgraph_size", Kind::Int),
    (
        "int8_calibration_table_name",
        "trt_int8_calibration_table_name",
        Kind::Text,
    ),
    (
        "int8_use_native_calibration_table",
        "trt_int8_use_native_calibration_table",
        Kind::Bool,
    ),
    ("trt_dla_enable", "trt_dla_enable", Kind::Bool),
    ("trt_dla_core", "trt_dla_core", Kind::Int),
    ("trt_engine_cache_enable", "trt_engine_cache_enable", Kind::Bool),
    ("trt_engine_cache_path", "trt_engine_cache_path", Kind::Text),
    ("trt_engine_cache_prefix", "trt_engine_cache_prefix", Kind::Text),
    ("trt_dump_subgraphs", "trt_dump_subgraphs", Kind::Bool),
    (
        "trt_force_sequential_engine_build",
        "trt_force_sequential_engine_build",
        Kind::Bool,
    ),
    (
        "trt_context_memory_sharing_enable",
        "trt_context_memory_sharing_enable",
        Kind::Bool,
    ),
    (
        "trt_layer_norm_fp32_fallback",
        "trt_layer_norm_fp32_fallback",
        Kind::Bool,
    ),
    ("trt_timing_cache_enable", "trt_timing_cache_enable", Kind::Bool),
    ("trt_timing_cache_path", "trt_timing_cache_path", Kind::Text),
    ("trt_force_timing_cache", "trt_force_timing_cache", Kind::Bool),
    ("trt_detailed_build_log", "trt_detailed_build_log", Kind::Bool),
    ("trt_build_heuristics_enable", "trt_build_heuristics_enable", Kind::Bool),
    ("trt_sparsity_enable", "trt_sparsity_enable", Kind::Bool),
    (
        "trt_builder_optimization_level",
        "trt_builder_optimization_level",
        Kind::Int,
    ),
    ("trt_auxiliary_streams", "trt_auxiliary_streams", Kind::Int),
    ("trt_tactic_sources", "trt_tactic_sources", Kind::Text),
    ("trt_extra_plugin_lib_paths", "trt_extra_plugin_lib_paths", Kind::Text),
    ("trt_profile_min_shapes", "trt_profile_min_shapes", Kind::Text),
    ("trt_profile_max_shapes", "trt_profile_max_shapes", Kind::Text),
    ("trt_profile_opt_shapes", "trt_profile_opt_shapes", Kind::Text),
    ("trt_cuda_graph_enable", "trt_cuda_graph_enable", Kind::Bool),
    ("trt_dump_ep_context_model", "trt_dump_ep_context_model", Kind::Bool),
    ("trt_ep_context_file_path", "trt_ep_context_file_path", Kind::Text),
    ("trt_ep_context_embed_mode", "trt_ep_context_embed_mode", Kind::Int),
];

/// Checks a value against its type, in Triton's words when it does not fit.
fn check(key: &str, value: &str, kind: Kind) -> Result<(), String> {
    let ok = match kind {
        Kind::Bool => matches!(value.to_ascii_lowercase().as_str(), "1" | "0" | "true" | "false"),
        Kind::Int => value.trim().parse::<i32>().is_ok(),
        Kind::Unsigned => value.trim().parse::<u64>().is_ok(),
        Kind::Text => true,
    };
    if ok {
        Ok(())
    } else {
        let what = match kind {
            Kind::Bool => "a boolean (1, 0, true or false)",
            Kind::Int => "an integer",
            Kind::Unsigned => "a non-negative integer",
            Kind::Text => unreachable!("text always fits"),
        };
        Err(format!("the value '{value}' of '{key}' is not {what}"))
    }
}

fn sorted(map: &std::collections::HashMap<String, String>) -> Vec<(&String, &String)> {
    let mut pairs: Vec<_> = map.iter().collect();
    pairs.sort();
    pairs
}

fn tensorrt(parameters: &std::collections::HashMap<String, String>) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for (key, value) in sorted(parameters) {
        if key == "precision_mode" {
            match value.as_str() {
                "FP16" => out.push(("trt_fp16_enable".to_string(), "1".to_string())),
                "INT8" => out.push(("trt_int8_enable".to_string(), "1".to_string())),
                "FP32" => {}
                other => return Err(format!("unsupported precision mode '{other}' is requested")),
            }
            continue;
        }
        let Some(&(_, option, kind)) = TENSORRT.iter().find(|(k, _, _)| k == key) else {
            return Err(format!(
                "unknown parameter '{key}' is provided for TensorRT Execution Accelerator"
            ));
        };
        check(key, value, kind)?;
        out.push((option.to_string(), value.clone()));
    }
    Ok(out)
}

/// A model parameter of Triton's older CUDA settings, as a number among `names`' indices.
fn choice(config: &ModelConfig, key: &str, names: &[&str]) -> Result<Option<String>, String> {
    let Some(p) = config.parameters.get(key) else {
        return Ok(None);
    };
    let chosen = p.string_value.trim().parse::<usize>().ok().and_then(|n| names.get(n));
    match chosen {
        Some(name) => Ok(Some(name.to_string())),
        None => Err(format!("unsupported {key} value '{}' is requested", p.string_value)),
    }
}

/// Reads the GPU settings of an ONNX model's config, or why they are wrong (the load fails with it).
pub fn read(config: &ModelConfig) -> Result<GpuSettings, String> {
    let mut settings = GpuSettings::default();
    let mut cuda = std::collections::BTreeMap::new();
    let accelerators = config
        .optimization
        .as_ref()
        .and_then(|o| o.execution_accelerators.as_ref())
        .map(|e| e.gpu_execution_accelerator.as_slice())
        .unwrap_or_default();
    for accelerator in accelerators {
        match accelerator.name.as_str() {
            "tensorrt" => settings.tensorrt = Some(tensorrt(&accelerator.parameters)?),
            "cuda" => {
                for (key, value) in sorted(&accelerator.parameters) {
                    if key == "do_copy_in_default_stream" || key == "use_ep_level_unified_stream" {
                        check(key, value, Kind::Bool)?;
                    }
                    cuda.insert(key.clone(), value.clone());
                }
            }
            other => return Err(format!("unknown Execution Accelerator '{other}' is requested")),
        }
    }
    let search = ["EXHAUSTIVE", "HEURISTIC", "DEFAULT"];
    if let Some(v) = choice(config, "cudnn_conv_algo_search", &search)? {
        cuda.insert("cudnn_conv_algo_search".into(), v);
    }
    let strategies = ["kNextPowerOfTwo", "kSameAsRequested"];
    if let Some(v) = choice(config, "arena_extend_strategy", &strategies)? {
        cuda.insert("arena_extend_strategy".into(), v);
    }
    if let Some(p) = config.parameters.get("gpu_mem_limit") {
        check("gpu_mem_limit", &p.string_value, Kind::Unsigned)?;
        cuda.insert("gpu_mem_limit".into(), p.string_value.trim().to_string());
    }
    if let Some(p) = config.parameters.get("do_copy_in_default_stream") {
        check("do_copy_in_default_stream", &p.string_value, Kind::Bool)?;
        cuda.insert("do_copy_in_default_stream".into(), p.string_value.clone());
    }
    settings.cuda = cuda.into_iter().collect();
    Ok(settings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesh::config::parse_pbtxt;

    fn config(text: &str) -> ModelConfig {
        parse_pbtxt(&format!("name: \"m\" platform: \"onnxruntime_onnx\" {text}")).unwrap()
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn no_settings_leave_every_provider_at_its_defaults() {
        assert_eq!(read(&config("")).unwrap(), GpuSettings::default());
    }

    #[test]
    fn tensorrt_keys_map_to_onnx_runtimes_options() {
        let c = config(
            r#"optimization { execution_accelerators { gpu_execution_accelerator : [ {
                 name : "tensorrt"
                 parameters { key: "precision_mode" value: "FP16" }
                 parameters { key: "max_workspace_size_bytes" value: "1073741824" }
                 parameters { key: "trt_engine_cache_enable" value: "true" }
                 parameters { key: "trt_cuda_graph_enable" value: "1" } } ] } }"#,
        );
        let s = read(&c).unwrap();
        assert_eq!(
            s.tensorrt.unwrap(),
            pairs(&[
                ("trt_max_workspace_size", "1073741824"),
                ("trt_fp16_enable", "1"),
                ("trt_cuda_graph_enable", "1"),
                ("trt_engine_cache_enable", "true"),
            ])
        );
        assert!(s.cuda.is_empty());
    }

    #[test]
    fn cuda_parameters_pass_through_and_the_older_parameters_win() {
        let c = config(
            r#"optimization { execution_accelerators { gpu_execution_accelerator : [ {
                 name : "cuda"
                 parameters { key: "enable_cuda_graph" value: "1" }
                 parameters { key: "cudnn_conv_algo_search" value: "DEFAULT" } } ] } }
               parameters { key: "cudnn_conv_algo_search" value: { string_value: "1" } }
               parameters { key: "gpu_mem_limit" value: { string_value: "4294967200" } }
               parameters { key: "arena_extend_strategy" value: { string_value: "1" } }"#,
        );
        assert_eq!(
            read(&c).unwrap().cuda,
            pairs(&[
                ("arena_extend_strategy", "kSameAsRequested"),
                ("cudnn_conv_algo_search", "HEURISTIC"),
                ("enable_cuda_graph", "1"),
                ("gpu_mem_limit", "4294967200"),
            ])
        );
    }

    #[test]
    fn bad_settings_fail_with_tritons_words() {
        let accel = |name: &str, params: &str| {
            config(&format!(
                "optimization {{ execution_accelerators {{ gpu_execution_accelerator : [ {{ name : \"{name}\" {params} }} ] }} }}"
            ))
        };
        let param = |k: &str, v: &str| format!("parameters {{ key: \"{k}\" value: {{ string_value: \"{v}\" }} }}");
        let cases = [
            (
                accel("openvino", ""),
                "unknown Execution Accelerator 'openvino' is requested",
            ),
            (
                accel("tensorrt", "parameters { key: \"precision_mode\" value: \"FP8\" }"),
                "unsupported precision mode 'FP8' is requested",
            ),
            (
                accel("tensorrt", "parameters { key: \"trt_bogus\" value: \"1\" }"),
                "unknown parameter 'trt_bogus' is provided for TensorRT Execution Accelerator",
            ),
            (
                accel(
                    "tensorrt",
                    "parameters { key: \"trt_min_subgraph_size\" value: \"few\" }",
                ),
                "the value 'few' of 'trt_min_subgraph_size' is not an integer",
            ),
            (
                accel(
                    "cuda",
                    "parameters { key: \"do_copy_in_default_stream\" value: \"maybe\" }",
                ),
                "'do_copy_in_default_stream' is not a boolean",
            ),
            (
                config(&param("cudnn_conv_algo_search", "3")),
                "unsupported cudnn_conv_algo_search value '3' is requested",
            ),
            (
                config(&param("arena_extend_strategy", "x")),
                "unsupported arena_extend_strategy value 'x' is requested",
            ),
            (
                config(&param("gpu_mem_limit", "-1")),
                "the value '-1' of 'gpu_mem_limit' is not a non-negative integer",
            ),
        ];
        for (c, want) in cases {
            let e = read(&c).unwrap_err();
            assert!(e.contains(want), "{e} (wanted {want})");
        }
    }
}
