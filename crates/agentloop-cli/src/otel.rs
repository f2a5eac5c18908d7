//! Traces over OTLP (S42), off unless `serve --otlp-endpoint` (or
//! `OTEL_EXPORTER_OTLP_ENDPOINT`) names a collector: the runtime's spans (turn, step)
//! and the chat agent's (model calls and tool calls, with OpenTelemetry's GenAI
//! attributes) go to it through `tracing-opentelemetry`, batched on the SDK's own
//! thread (OTLP over HTTP, protobuf). This module builds the layer; it must not log
//! anything itself but errors.
//!
//! What the collector gets follows the GenAI semantic conventions (issue 53):
//! - One trace per turn. The session's span lives as long as the session (days), so it
//!   is not exported (it stays in the log): each turn's span is a root, its model and
//!   tool calls its descendants, and a turn links to its session's first turn (in this
//!   process).
//! - Every span under a session carries `gen_ai.conversation.id` (the session id),
//!   inherited from the session's span when it does not say it itself.
//! - Integers are ints: tracing-opentelemetry exports a `u64` field as a string, so the
//!   export sets each as an int again, and the last value of an attribute set twice is
//!   the one exported (as OpenTelemetry's spans overwrite).

use std::sync::OnceLock;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::trace::{SpanContext, TraceContextExt as _};
use opentelemetry::KeyValue;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::trace::{SpanData, SpanProcessor};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::filter::{filter_fn, FilterExt as _, Targets};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// The GenAI conventions' attribute of the conversation: agentloop's session id.
const CONVERSATION: &str = "gen_ai.conversation.id";

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
    let batch = opentelemetry_sdk::trace::BatchSpanProcessor::builder(exporter).build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(LastValueWins(batch))
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
    // The session's span is not exported: a turn's span, its explicit child, then has
    // no parent the exporter sees, and is a root (one trace per turn).
    let exported = targets.clone().and(filter_fn(|m| !is_session(m)));
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(exported)
        .and_then(GenAi::default().with_filter(targets))
        .boxed();
    Ok((layer, provider))
}

/// Whether `meta` is a session's span (it lives as long as the session).
fn is_session(meta: &tracing::Metadata<'_>) -> bool {
    meta.is_span() && meta.name() == "session" && meta.target().starts_with("agentloop::session")
}

/// Whether `meta` is a turn's span (the root of a trace).
fn is_turn(meta: &tracing::Metadata<'_>) -> bool {
    meta.is_span() && meta.name() == "turn" && meta.target().starts_with("agentloop::session")
}

/// A span's conversation: its own `gen_ai.conversation.id`, or its closest ancestor's.
struct Conversation(String);

/// The span context of a session's first turn in this process (on the session's span):
/// the later turns link to it.
struct FirstTurn(SpanContext);

/// What of a span's fields the export corrects: its conversation, and its `u64`s.
#[derive(Default)]
struct Fields {
    conversation: Option<String>,
    ints: Vec<KeyValue>,
}

impl Visit for Fields {
    fn record_u64(&mut self, field: &Field, value: u64) {
        let value = i64::try_from(value).unwrap_or(i64::MAX);
        self.ints.push(KeyValue::new(field.name(), value));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == CONVERSATION {
            self.conversation = Some(value.to_string());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        // `%id` arrives here, its Debug being the Display.
        if field.name() == CONVERSATION {
            self.conversation = Some(format!("{value:?}"));
        }
    }
}

/// The layer after tracing-opentelemetry's that sets, on the OpenTelemetry spans it
/// made, what tracing fields cannot say: the inherited conversation, ints, and a turn's
/// link to its session's first turn.
#[derive(Default)]
struct GenAi {
    /// The subscriber (to reach the OpenTelemetry span of a tracing span).
    dispatch: OnceLock<tracing::dispatcher::WeakDispatch>,
}

impl GenAi {
    /// The OpenTelemetry context of span `id`, when it is exported.
    fn otel(&self, id: &Id) -> Option<opentelemetry::Context> {
        // The subscriber registered (a layer in an `Option` is not told), else the
        // global one, which a callback of the subscriber reaches when no scoped one was
        // ever set (the binary sets the global one alone).
        let dispatch = match self.dispatch.get().and_then(|d| d.upgrade()) {
            Some(d) => d,
            None => tracing::dispatcher::get_default(Clone::clone),
        };
        tracing_opentelemetry::get_otel_context(id, &dispatch)
    }
}

impl<S> Layer<S> for GenAi
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_register_dispatch(&self, subscriber: &tracing::Dispatch) {
        let _ = self.dispatch.set(subscriber.downgrade());
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        let own = fields.conversation.is_some();
        let conversation = fields.conversation.or_else(|| {
            let parent = span.parent()?;
            let ext = parent.extensions();
            ext.get::<Conversation>().map(|c| c.0.clone())
        });
        if let Some(c) = &conversation {
            span.extensions_mut().insert(Conversation(c.clone()));
        }
        if is_session(attrs.metadata()) {
            return;
        }
        let mut set = fields.ints;
        if let (false, Some(c)) = (own, conversation) {
            set.push(KeyValue::new(CONVERSATION, c));
        }
        let session = if is_turn(attrs.metadata()) {
            span.scope().skip(1).find(|s| is_session(s.metadata()))
        } else {
            None
        };
        if set.is_empty() && session.is_none() {
            return;
        }
        let Some(cx) = self.otel(id) else { return };
        let otel = cx.span();
        otel.set_attributes(set);
        if let Some(session) = session {
            let mut ext = session.extensions_mut();
            match ext.get_mut::<FirstTurn>() {
                Some(first) => otel.add_link(first.0.clone(), Vec::new()),
                None => ext.insert(FirstTurn(otel.span_context().clone())),
            }
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        values.record(&mut fields);
        if fields.ints.is_empty() || ctx.span(id).is_none_or(|s| is_session(s.metadata())) {
            return;
        }
        if let Some(cx) = self.otel(id) {
            cx.span().set_attributes(fields.ints);
        }
    }
}

/// The batch processor, with each span's attributes made unique, the last value of a
/// key kept (where the first stood): an attribute set again overwrites, as
/// OpenTelemetry's API says, though the SDK's span keeps both.
#[derive(Debug)]
struct LastValueWins<P>(P);

impl<P: SpanProcessor> SpanProcessor for LastValueWins<P> {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &opentelemetry::Context) {
        self.0.on_start(span, cx);
    }

    fn on_end(&self, mut span: SpanData) {
        last_value_wins(&mut span.attributes);
        self.0.on_end(span);
    }

    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0.force_flush()
    }

    fn shutdown_with_timeout(
        &self,
        timeout: std::time::Duration,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.0.set_resource(resource);
    }
}

/// Each key once, with its last value, where it first stood.
fn last_value_wins(attributes: &mut Vec<KeyValue>) {
    let mut seen = std::collections::HashMap::new();
    let mut out: Vec<KeyValue> = Vec::with_capacity(attributes.len());
    for kv in attributes.drain(..) {
        match seen.get(&kv.key) {
            Some(&i) => out[i] = kv,
            None => {
                seen.insert(kv.key.clone(), out.len());
                out.push(kv);
            }
        }
    }
    *attributes = out;
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

    #[test]
    fn an_attribute_set_twice_is_exported_once_with_its_last_value() {
        let mut a = vec![
            KeyValue::new("index", "1"),
            KeyValue::new("resume", false),
            KeyValue::new("index", 1_i64),
        ];
        last_value_wins(&mut a);
        assert_eq!(
            a,
            [
                KeyValue::new("index", 1_i64),
                KeyValue::new("resume", false)
            ]
        );
    }
}
