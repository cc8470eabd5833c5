//! OpenTelemetry traces: one trace per reconciliation, exported with OTLP (HTTP/protobuf) when
//! the standard `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) variable is set, and
//! off otherwise. The spans themselves are ordinary `tracing` spans; this module turns export
//! on and carries a trace across the hand-off from the controller to the pod drivers.

use std::fmt;

use opentelemetry::trace::{SpanContext, TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The identity of a trace (16 bytes, shown as 32 hex digits as OTLP and tracing UIs do).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TraceId(pub [u8; 16]);

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|byte| write!(f, "{byte:02x}"))
    }
}

/// Where a reconciliation's trace continues: the span a pod's work hangs under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceParent(SpanContext);

impl TraceParent {
    /// The trace of `span`, when it is being traced (export on and sampled in).
    pub fn of(span: &tracing::Span) -> Option<Self> {
        let context = span.context();
        let span_context = context.span().span_context().clone();
        span_context.is_valid().then_some(Self(span_context))
    }

    /// Makes `span` a child of this parent (before it is first entered).
    pub fn adopt(&self, span: &tracing::Span) {
        let parent = opentelemetry::Context::new().with_remote_span_context(self.0.clone());
        // Fails only when no OpenTelemetry layer is installed: then nothing is traced anyway.
        let _ = span.set_parent(parent);
    }

    /// The trace it belongs to.
    pub fn trace_id(&self) -> TraceId {
        TraceId(self.0.trace_id().to_bytes())
    }
}

/// The trace id of `span`, when it is being traced.
pub fn trace_id_of(span: &tracing::Span) -> Option<TraceId> {
    TraceParent::of(span).map(|parent| parent.trace_id())
}

/// Why traces are not exported although asked for.
#[derive(Debug, thiserror::Error)]
pub enum TraceExportError {
    /// A protocol this build does not speak.
    #[error(
        "{variable}={value}: haptic exports OTLP over http/protobuf only (point it at the collector's HTTP port, 4318 by default)"
    )]
    Protocol {
        /// The variable that asked for it.
        variable: &'static str,
        /// Its value.
        value: String,
    },
    /// The exporter could not be built (a malformed endpoint, say).
    #[error("OTLP trace exporter: {0}")]
    Build(String),
}

/// Whether the environment asks for traces: an OTLP endpoint is set and the traces exporter
/// is not turned off.
pub fn export_requested() -> bool {
    let set = |name: &str| std::env::var(name).is_ok_and(|value| !value.trim().is_empty());
    let disabled = std::env::var("OTEL_TRACES_EXPORTER").is_ok_and(|value| value.trim() == "none")
        || std::env::var("OTEL_SDK_DISABLED").is_ok_and(|value| value.trim().eq_ignore_ascii_case("true"));
    (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) && !disabled
}

/// Builds the exporting tracer provider from the standard variables (endpoint, headers,
/// timeout, sampler, batch settings, service name and resource attributes).
pub fn provider() -> Result<SdkTracerProvider, TraceExportError> {
    for variable in ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"] {
        if let Ok(value) = std::env::var(variable) {
            if value.trim() != "http/protobuf" {
                return Err(TraceExportError::Protocol { variable, value });
            }
            break;
        }
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|error| TraceExportError::Build(error.to_string()))?;
    let mut resource = opentelemetry_sdk::Resource::builder();
    if std::env::var("OTEL_SERVICE_NAME").is_err() {
        resource = resource.with_service_name("haptic");
    }
    let resource =
        resource.with_attribute(opentelemetry::KeyValue::new("service.version", env!("CARGO_PKG_VERSION"))).build();
    Ok(SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build())
}

/// The `tracing` layer that turns spans into OpenTelemetry spans of `provider`.
pub fn layer<S>(provider: &SdkTracerProvider) -> impl tracing_subscriber::Layer<S> + use<S>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    // Thread names and busy/idle times would be noise on every span.
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("haptic"))
        .with_threads(false)
        .with_tracked_inactivity(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_ids_print_as_32_hex_digits() {
        let id =
            TraceId([0x5b, 0x8e, 0xff, 0xf7, 0x98, 0x03, 0x81, 0x03, 0xd2, 0x69, 0xb6, 0x33, 0x81, 0x3f, 0xc6, 0x0c]);
        assert_eq!(id.to_string(), "5b8efff798038103d269b633813fc60c");
    }

    #[test]
    fn untraced_spans_have_no_parent_to_give() {
        assert_eq!(TraceParent::of(&tracing::Span::none()), None);
        assert_eq!(trace_id_of(&tracing::info_span!("untraced")), None);
    }
}
