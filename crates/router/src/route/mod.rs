//! The route stage (sans-IO): choosing the node for each attempt of a request, and whether a failed attempt
//! may be retried.
pub mod attempt;
pub mod balance;
pub mod retry;

pub use attempt::{Attempts, Step, View};
pub use balance::{score, BalanceSettings, Balancer, Pick};
pub use retry::{Decision, Failure, RequestState, RetryPolicy, RetrySettings};
