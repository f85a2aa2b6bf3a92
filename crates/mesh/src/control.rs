//! Model control as tritonserver names it (`--model-control-mode`, `--load-model`,
//! `--repository-poll-secs`): one clap definition flattened into mesh-node and mesh-router.

/// Which models of the repositories are served (on a node) or placed (by a router).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ControlMode {
    /// Every model, read once at start.
    None,
    /// Only `--load-model` ones and what the repository extension loads.
    Explicit,
    /// Every model; the repositories are read again every `--repository-poll-secs`.
    Poll,
}

#[derive(Debug, Clone, clap::Args)]
pub struct ControlArgs {
    /// none: every model at start; explicit: only --load-model ones and the repository extension's
    /// loads; poll: every model, reading the repositories again every --repository-poll-secs.
    #[arg(long, value_enum, default_value = "none")]
    pub model_control_mode: ControlMode,
    /// Models to load at start in explicit mode (repeatable; `*` for all).
    #[arg(long)]
    pub load_model: Vec<String>,
    #[arg(long, default_value_t = 15)]
    pub repository_poll_secs: u64,
}

impl ControlMode {
    /// Refuses repository load/unload unless the mode is explicit, as tritonserver does (UNAVAILABLE,
    /// with its message, before the model's name is looked at). Nodes and routers both ask it, so a
    /// client cannot place a model (or run its code) where the operator chose what is served.
    pub fn check_explicit(self, what: &str, name: &str) -> crate::Result<()> {
        if self == ControlMode::Explicit {
            return Ok(());
        }
        tracing::debug!(
            "refused to {what} '{}': the model control mode is not explicit",
            name.escape_debug()
        );
        Err(crate::Error::unavailable(
            "explicit model load / unload is not allowed if polling is enabled",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::ControlMode;

    #[test]
    fn only_explicit_mode_loads_on_request() {
        assert!(ControlMode::Explicit.check_explicit("load", "m").is_ok());
        for mode in [ControlMode::None, ControlMode::Poll] {
            let e = mode.check_explicit("load", "../x").unwrap_err();
            assert_eq!(e.code, crate::Code::Unavailable);
            assert_eq!(
                e.message,
                "explicit model load / unload is not allowed if polling is enabled"
            );
        }
    }
}
