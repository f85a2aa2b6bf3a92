//! The control stream's protocol as sans-IO state machines, one for each side: the router's
//! session with one node (`router`) and a node's session with one router (`node`). Each takes what
//! arrives and the time, and answers effects (frames to write, what to tell the rest of the
//! process, how the session ends); the link actor and the node's session loop only drive them.
pub mod node;
pub mod router;

#[cfg(test)]
mod tests;

/// Why a session ends; the driver closes the link to match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// The peer broke the protocol: the link closes with the PROTOCOL code and this reason.
    Protocol(String),
    /// The peer left cleanly (a node's goodbye), or this side leaves.
    Left,
    /// The peer did not answer in time.
    Lost(String),
}
