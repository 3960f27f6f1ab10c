//! The `request` span of every request (REST, SSE, gRPC, gRPC-web, Connect), made a child of the W3C `traceparent` the request carries (OpenTelemetry's TraceContextPropagator reads it), so what the request starts (a run) nests under the caller's trace.

use super::protocol::Protocol;
use axum::extract::{MatchedPath, Request};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The middleware, inside the access log (below the routing, so a REST
/// route's template is known). Without `--otlp-endpoint` nothing listens to
/// the span: it is disabled, and the headers are not read.
pub(crate) async fn request_span(req: Request, next: Next) -> Response {
    let span = tracing::info_span!(
        target: vak_core::trace::TARGET,
        "request",
        otel.kind = "server",
        http.method = %req.method(),
        route = tracing::field::Empty,
        rpc.system = tracing::field::Empty,
        rpc.service = tracing::field::Empty,
        rpc.method = tracing::field::Empty,
    );
    if span.is_disabled() {
        return next.run(req).await;
    }
    let path = req.uri().path();
    let system = match Protocol::of(req.method(), req.uri(), req.headers()) {
        Protocol::Grpc { .. } => Some("grpc"),
        Protocol::Connect(_) => Some("connect_rpc"),
        Protocol::Rest => None,
    };
    match req.extensions().get::<MatchedPath>() {
        Some(p) if system.is_none() => span.record("route", p.as_str()),
        _ => span.record("route", path),
    };
    if let Some(system) = system {
        // `/<package.Service>/<Method>`
        if let Some((service, method)) = path.trim_start_matches('/').split_once('/') {
            span.record("rpc.system", system);
            span.record("rpc.service", service);
            span.record("rpc.method", method);
        }
    }
    let parent = TraceContextPropagator::new().extract(&Headers(req.headers()));
    // Only fails when no OpenTelemetry layer is installed, and then the span is disabled.
    let _ = span.set_parent(parent);
    next.run(req).instrument(span).await
}

/// A request's headers (or gRPC metadata, which travels as headers) as the propagator reads them.
struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}
