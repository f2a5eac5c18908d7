//! Traces over OTLP (S42), off unless `serve --otlp-endpoint` (or
//! `OTEL_EXPORTER_OTLP_ENDPOINT`) names a collector: the runtime's spans (session,
//! turn, step) and the chat agent's (model calls and tool calls, with OpenTelemetry's
//! GenAI attributes) go to it through `tracing-opentelemetry`, batched on the SDK's own
//! thread (OTLP over HTTP, protobuf). This module builds the layer; it must not log
//! anything itself but errors.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::Layer;

/// The traces' endpoint for a collector's base URL (`http://collector:4318`): its
/// `/v1/traces`, unless the URL names it already.
pub(crate) fn traces_url(base: &str) -> Result<String, String> {
    let base = base.trim_end_matches('/');
    if !(base.starts_with("http://") || base.starts_with("https://")) {
        return Err(format!(
            "--otlp-endpoint `{base}` is not an http:// or https:// URL; write the collector's OTLP/HTTP address, e.g. http://127.0.0.1:4318"
        ));
    }
    Ok(if base.ends_with("/v1/traces") {
        base.to_string()
    } else {
        format!("{base}/v1/traces")
    })
}

/// The tracing layer that exports spans to `endpoint`, and the provider to shut down
/// (which flushes what is batched) when the process ends. Spans of agentloop's crates
/// at INFO and above are exported, whatever the log filter (`RUST_LOG`) lets through.
pub(crate) fn layer<S>(
    endpoint: &str,
) -> Result<(Box<dyn Layer<S> + Send + Sync>, SdkTracerProvider), String>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
{
    let url = traces_url(endpoint)?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(url)
        .build()
        .map_err(|e| format!("cannot set up the OTLP exporter: {e}"))?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name("agentloop")
                .build(),
        )
        .build();
    let tracer = provider.tracer("agentloop");
    let targets = Targets::new()
        .with_target("agentloop", tracing::Level::INFO)
        .with_target("agentloop_openai", tracing::Level::INFO)
        .with_target("agentloop_http", tracing::Level::INFO);
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(targets)
        .boxed();
    Ok((layer, provider))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_traces_url_is_the_collectors_v1_traces() {
        assert_eq!(
            traces_url("http://c:4318").unwrap(),
            "http://c:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://c:4318/v1/traces/").unwrap(),
            "http://c:4318/v1/traces"
        );
        assert!(traces_url("c:4318").unwrap_err().contains("not an http"));
    }
}
