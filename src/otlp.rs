//! Where log lines and spans go: the log lines' subscriber, and with `--otlp-endpoint` (or OTEL_EXPORTER_OTLP_ENDPOINT) the OpenTelemetry layer that exports vak's spans (target `vak::trace`) over OTLP/gRPC in batches from the tokio runtime, flushed when the server has stopped.

use crate::cli::LogFormat;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::runtime;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use std::io::IsTerminal;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};
use vak_core::trace::TARGET;

/// What `init` set up; `shutdown` exports the spans still queued.
pub struct Tracing {
    provider: Option<SdkTracerProvider>,
}

/// Log lines go to stderr, filtered by RUST_LOG (default `vak=info`, and
/// the OpenTelemetry SDK's warnings); colour
/// only when stderr is a terminal, so files and pipes get plain text. The
/// spans meant for OTLP never reach the log lines: their filter turns their
/// target off, and only the exporter's layer (there only with `otlp`, a URL
/// such as `http://127.0.0.1:4317`) listens to it. Call it inside the tokio
/// runtime: the exporter's channel and batch task live there.
pub fn init(format: LogFormat, otlp: Option<&str>) -> Result<Tracing, String> {
    let filter = EnvFilter::try_from_default_env()
        // The SDK's warnings (a failed export, spans dropped) too.
        .unwrap_or_else(|_| "vak=info,opentelemetry_sdk=warn".into())
        .add_directive(format!("{TARGET}=off").parse().map_err(|e| format!("{e}"))?);
    let ansi = std::io::stderr().is_terminal();
    let lines = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(ansi)
            .with_filter(filter)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_writer(std::io::stderr)
            .with_ansi(ansi)
            .with_filter(filter)
            .boxed(),
    };
    let provider = otlp.map(provider).transpose()?;
    let spans = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("vak"))
            .with_threads(false)
            .with_filter(Targets::new().with_target(TARGET, LevelFilter::INFO))
            .boxed()
    });
    let layers: Vec<Box<dyn Layer<Registry> + Send + Sync>> = std::iter::once(lines).chain(spans).collect();
    tracing_subscriber::registry().with(layers).init();
    if let Some(endpoint) = otlp {
        tracing::info!(endpoint, "exporting traces over OTLP");
    }
    Ok(Tracing { provider })
}

/// The OTLP/gRPC exporter to `endpoint` behind a batch processor on tokio;
/// the service is `vak` unless OTEL_SERVICE_NAME names another.
fn provider(endpoint: &str) -> Result<SdkTracerProvider, String> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|e| format!("--otlp-endpoint {endpoint}: {e}"))?;
    let mut resource = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name("vak");
    }
    Ok(SdkTracerProvider::builder()
        .with_span_processor(BatchSpanProcessor::builder(exporter, runtime::Tokio).build())
        .with_resource(resource.build())
        .build())
}

impl Tracing {
    /// Exports what is still queued and stops the exporter. Call it from
    /// outside the runtime's tasks (it blocks until the batch task answers)
    /// while the runtime still runs.
    pub fn shutdown(self) {
        if let Some(p) = self.provider {
            if let Err(e) = p.shutdown() {
                eprintln!("vak: warning: the last traces were not exported: {e}");
            }
        }
    }
}
