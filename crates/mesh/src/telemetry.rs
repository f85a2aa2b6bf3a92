//! The Prometheus recorder every mesh binary installs, and the Triton request metrics that node and
//! router both export (with Triton's names, so dashboards built for Triton read them unchanged).
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Installs the global recorder, describes Triton's request metrics and then the binary's own
/// (`describe`); returns the handle that renders `/metrics`.
pub fn install(describe: impl FnOnce(), quantiles: Option<&[f64]>) -> Result<PrometheusHandle, String> {
    let mut builder = PrometheusBuilder::new();
    if let Some(q) = quantiles {
        // Histograms render as summaries with these quantiles (Triton's summary metrics).
        builder = builder
            .set_quantiles(q)
            .map_err(|e| format!("cannot use the summary quantiles: {e}"))?;
    }
    let handle = builder
        .install_recorder()
        .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
    describe_requests();
    describe();
    Ok(handle)
}

fn describe_requests() {
    use metrics::describe_counter as c;
    c!(
        "nv_inference_request_success",
        "Number of successful inference requests, all batch sizes"
    );
    c!(
        "nv_inference_request_failure",
        "Number of failed inference requests, all batch sizes"
    );
    c!(
        "nv_inference_count",
        "Number of inferences performed (does not include cached requests)"
    );
    c!(
        "nv_inference_request_duration_us",
        "Cumulative inference request duration in microseconds"
    );
}
