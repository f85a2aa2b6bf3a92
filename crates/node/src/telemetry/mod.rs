//! Telemetry: Prometheus metrics and Triton's per-version statistics, recorded by the actors and serving.
pub mod custom;
pub mod gpu;
pub mod metrics;
pub mod stats;
