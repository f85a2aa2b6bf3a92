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
