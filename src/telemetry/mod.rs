//! Telemetry: logging, Prometheus metrics ([`metrics`]) and OpenTelemetry traces ([`traces`]).

pub mod metrics;
pub mod traces;

use clap::ValueEnum;
use tracing::Level;
use tracing_subscriber::{EnvFilter, Layer};

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// Keeps trace export running; dropping it flushes the spans not yet sent.
#[must_use = "dropping the guard stops trace export"]
pub struct TelemetryGuard {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(error) = provider.shutdown()
        {
            eprintln!("haptic: traces not all exported at exit: {error}");
        }
    }
}

/// The log filter in force, replaceable while running.
static LOG_FILTER: std::sync::OnceLock<tracing_subscriber::reload::Handle<EnvFilter, tracing_subscriber::Registry>> =
    std::sync::OnceLock::new();

/// The filter of `RUST_LOG`, else `info`.
fn default_filter() -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"))
}

/// Whether `directives` is a log filter (`info`, `haptic=debug,kube=warn`); `Err` says why not.
pub fn check_log_filter(directives: &str) -> Result<(), LogFilterError> {
    EnvFilter::builder().parse(directives).map(drop).map_err(LogFilterError::Invalid)
}

/// Why the log filter was not changed.
#[derive(Debug, thiserror::Error)]
pub enum LogFilterError {
    /// The directives do not parse.
    #[error(transparent)]
    Invalid(#[from] tracing_subscriber::filter::ParseError),
    /// The subscriber refused the new filter.
    #[error(transparent)]
    Reload(#[from] tracing_subscriber::reload::Error),
}

/// Replaces the log filter: `directives`, or the default (`RUST_LOG`, else `info`) for `None`.
pub fn set_log_filter(directives: Option<&str>) -> Result<(), LogFilterError> {
    let filter = match directives {
        Some(directives) => EnvFilter::builder().parse(directives)?,
        None => default_filter(),
    };
    match LOG_FILTER.get() {
        Some(handle) => Ok(handle.reload(filter)?),
        None => Ok(()),
    }
}

/// Installs the global tracing subscriber: log lines on stderr, the level from `RUST_LOG`
/// (default `info`), and OTLP trace export when `OTEL_EXPORTER_OTLP_ENDPOINT` asks for it.
pub fn init(format: LogFormat) -> TelemetryGuard {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    // The filter can be replaced while running (`set_log_filter`: the configuration's logLevel).
    let (filter, handle) = tracing_subscriber::reload::Layer::new(default_filter());
    let _ = LOG_FILTER.set(handle);
    // Colour only for people at a terminal: log files and collectors get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs: Box<dyn Layer<tracing_subscriber::Registry> + Send + Sync> = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(ansi).boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer().json().with_writer(std::io::stderr).boxed(),
    };
    let logs = logs.with_filter(filter);
    let (provider, refused) = match traces::export_requested().then(traces::provider) {
        Some(Ok(provider)) => (Some(provider), None),
        Some(Err(error)) => (None, Some(error)),
        None => (None, None),
    };
    // Traces carry haptic's own spans whatever RUST_LOG says of log lines; the HTTP and
    // Kubernetes clients' spans (and the exporter's own requests) stay out of them.
    let spans = provider.as_ref().map(|provider| {
        traces::layer(provider)
            .with_filter(tracing_subscriber::filter::Targets::new().with_target("haptic", Level::INFO))
    });
    // try_init: tests and repeated calls must not panic on an existing subscriber.
    let _ = tracing_subscriber::registry().with(logs).with(spans).try_init();
    if let Some(error) = refused {
        tracing::error!(%error, "traces are not exported");
    } else if provider.is_some() {
        tracing::info!("exporting traces with OTLP");
    }
    TelemetryGuard { provider }
}
