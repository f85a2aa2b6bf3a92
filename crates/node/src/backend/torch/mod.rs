//! TorchScript backend (`platform: "pytorch_libtorch"`, cargo feature `torch`): serves model.pt
//! through tch, including the dict, nested and List[str] results Triton's PyTorch backend rejects.
pub mod binding;
pub mod signature;

#[cfg(feature = "torch")]
mod archive;
#[cfg(feature = "torch")]
mod run;
#[cfg(feature = "torch")]
mod values;

#[cfg(feature = "torch")]
pub use run::TorchBackend;

use mesh::config::ModelConfig;

/// Model parameters this backend reads, with the names Triton's PyTorch backend gives them.
pub const PARAM_INTRA_OP_THREADS: &str = "INTRA_OP_THREAD_COUNT";
pub const PARAM_INTER_OP_THREADS: &str = "INTER_OP_THREAD_COUNT";
pub const PARAM_DISABLE_OPTIMIZED_EXECUTION: &str = "DISABLE_OPTIMIZED_EXECUTION";

/// Whether torch can run on CUDA here (a CPU build of torch cannot); asked once, and when it
/// cannot, one line says what follows.
#[cfg(feature = "torch")]
pub fn cuda_available() -> bool {
    static CUDA: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CUDA.get_or_init(|| {
        let available = tch::Cuda::is_available();
        if !available {
            tracing::info!(
                "torch cannot use CUDA here: TorchScript models with KIND_AUTO instances (or no instance_group) \
                 run on CPU, and KIND_GPU ones fail to load"
            );
        }
        available
    })
}

/// Without the `torch` feature no TorchScript model loads, so where it would run does not matter.
#[cfg(not(feature = "torch"))]
pub fn cuda_available() -> bool {
    true
}

/// Why a build without the feature cannot load a TorchScript model, and how to get one that can.
pub const NOT_BUILT: &str = "this mesh-node was built without TorchScript support; run scripts/setup-torch.sh \
     (it installs PyTorch 2.13 into .venv and builds with `--features torch`)";

/// The backend's parameters from config, checked at load.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    /// torch's intra-op pool size (process-wide in torch).
    pub intra_op_threads: Option<i32>,
    /// torch's inter-op pool size (process-wide, and settable once).
    pub inter_op_threads: Option<i32>,
    /// Runs the graph executor without its profiling optimizations (Triton's parameter).
    pub disable_optimized_execution: bool,
}

impl Settings {
    pub fn from_config(config: &ModelConfig) -> Result<Settings, String> {
        let get = |key: &str| config.parameters.get(key).map(|p| p.string_value.trim().to_string());
        let count = |key: &str| -> Result<Option<i32>, String> {
            get(key)
                .map(|v| {
                    v.parse::<i32>()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| format!("parameter {key} must be a positive integer, got '{v}'"))
                })
                .transpose()
        };
        let flag = |key: &str| -> Result<bool, String> {
            match get(key).map(|v| v.to_ascii_lowercase()).as_deref() {
                None | Some("false") => Ok(false),
                Some("true") => Ok(true),
                Some(v) => Err(format!("parameter {key} must be true or false, got '{v}'")),
            }
        };
        Ok(Settings {
            intra_op_threads: count(PARAM_INTRA_OP_THREADS)?,
            inter_op_threads: count(PARAM_INTER_OP_THREADS)?,
            disable_optimized_execution: flag(PARAM_DISABLE_OPTIMIZED_EXECUTION)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesh::config::parse_pbtxt;

    #[test]
    fn settings_read_triton_parameter_names() {
        let c = parse_pbtxt(
            r#"parameters { key: "INTRA_OP_THREAD_COUNT" value { string_value: "2" } }
               parameters { key: "DISABLE_OPTIMIZED_EXECUTION" value { string_value: "True" } }"#,
        )
        .unwrap();
        let s = Settings::from_config(&c).unwrap();
        assert_eq!(s.intra_op_threads, Some(2));
        assert_eq!(s.inter_op_threads, None);
        assert!(s.disable_optimized_execution);
        let bad = parse_pbtxt(r#"parameters { key: "INTER_OP_THREAD_COUNT" value { string_value: "0" } }"#).unwrap();
        assert!(Settings::from_config(&bad)
            .unwrap_err()
            .contains("INTER_OP_THREAD_COUNT"));
        let flag =
            parse_pbtxt(r#"parameters { key: "DISABLE_OPTIMIZED_EXECUTION" value { string_value: "yes" } }"#).unwrap();
        assert!(Settings::from_config(&flag).unwrap_err().contains("true or false"));
    }
}
