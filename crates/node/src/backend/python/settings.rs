//! How Python stubs are run: the `python` entries of `--backend-config`, read once at start.
use std::path::PathBuf;
use std::time::Duration;

/// How Python stubs are run, from `--backend-config python,<key>=<value>`.
#[derive(Debug, Clone)]
pub struct PythonSettings {
    /// `interpreter=PATH`; default `python3` from PATH.
    pub interpreter: Option<PathBuf>,
    /// `shm-default-byte-size=N`: each stub's shared memory (sparse; tensors past it travel in the socket).
    pub shm_bytes: usize,
    /// `execute-timeout-seconds=N`: an execute running longer is declared hung and its stub restarted.
    pub execute_timeout: Duration,
    /// `spin-microseconds=N`: how long each side polls for the other's answer before sleeping, while
    /// polls keep catching it (`spin::SpinPolicy`).
    pub spin: Duration,
    /// `inline-limit-microseconds=N`: a request that finds its instance idle runs on the async
    /// worker that decoded it while the model's executions average under this (0: never).
    pub inline_limit: Duration,
}

/// The largest `inline-limit-microseconds` (60 s): an execute that long on an async worker is
/// still answered, as long as another worker stays free.
const MAX_INLINE_LIMIT_US: u64 = 60_000_000;

impl Default for PythonSettings {
    fn default() -> Self {
        PythonSettings {
            interpreter: None,
            shm_bytes: 64 << 20,
            execute_timeout: Duration::from_secs(300),
            spin: Duration::from_micros(100),
            inline_limit: Duration::from_millis(2),
        }
    }
}

impl PythonSettings {
    /// Reads the `python` entries of `--backend-config`.
    pub fn from_backend_config(entries: &[(String, String)]) -> std::result::Result<Self, String> {
        let mut s = PythonSettings::default();
        for (key, value) in entries {
            let number = || {
                value
                    .parse::<u64>()
                    .map_err(|_| format!("--backend-config python,{key} needs a number, got '{value}'"))
            };
            match key.as_str() {
                "interpreter" => s.interpreter = Some(PathBuf::from(value)),
                "shm-default-byte-size" => s.shm_bytes = (number()? as usize).clamp(1 << 12, 1 << 34),
                "execute-timeout-seconds" => s.execute_timeout = Duration::from_secs(number()?.max(1)),
                "spin-microseconds" => s.spin = Duration::from_micros(number()?.min(10_000)),
                "inline-limit-microseconds" => s.inline_limit = Duration::from_micros(number()?.min(MAX_INLINE_LIMIT_US)),
                // Triton's Python-backend settings for its own shared-memory pools and stub
                // management; the mesh sizes its region with shm-default-byte-size alone.
                "shm-growth-byte-size" | "shm-region-prefix-name" | "stub-timeout-seconds" | "shm-message-queue-size"
                | "platform-name" => tracing::info!(
                    "--backend-config python,{key} accepted without effect: the mesh's stub keeps one region per instance"
                ),
                _ => tracing::warn!("ignoring unknown --backend-config python,{key}"),
            }
        }
        Ok(s)
    }
}

/// A model's `FORCE_CPU_ONLY_INPUT_TENSORS` parameter, checked as Triton's Python backend checks it
/// (`yes`, the default, or `no`; anything else fails the load with Triton's words). Either way the
/// mesh hands inputs to `execute()` in CPU memory: mesh-node keeps tensors in host memory, and
/// Triton too gives CPU tensors for inputs that arrive in CPU memory.
pub fn force_cpu_only_inputs(config: &mesh::config::ModelConfig) -> std::result::Result<bool, String> {
    match config
        .parameters
        .get("FORCE_CPU_ONLY_INPUT_TENSORS")
        .map(|p| p.string_value.as_str())
    {
        None | Some("yes") => Ok(true),
        Some("no") => Ok(false),
        Some(other) => Err(format!("Incorrect value for FORCE_CPU_ONLY_INPUT_TENSORS: {other}'")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn force_cpu_only_inputs_takes_yes_or_no_as_triton_does() {
        let config = |value: Option<&str>| {
            let text = value.map_or(String::new(), |v| {
                format!("parameters {{ key: \"FORCE_CPU_ONLY_INPUT_TENSORS\" value {{ string_value: \"{v}\" }} }}")
            });
            mesh::config::parse_pbtxt(&format!("name: \"m\"\nbackend: \"python\"\n{text}")).unwrap()
        };
        assert_eq!(force_cpu_only_inputs(&config(None)), Ok(true));
        assert_eq!(force_cpu_only_inputs(&config(Some("yes"))), Ok(true));
        assert_eq!(force_cpu_only_inputs(&config(Some("no"))), Ok(false));
        assert_eq!(
            force_cpu_only_inputs(&config(Some("maybe"))),
            Err("Incorrect value for FORCE_CPU_ONLY_INPUT_TENSORS: maybe'".to_string())
        );
    }
}
