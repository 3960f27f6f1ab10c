//! `GET /metrics`: the process's one Prometheus recorder (metrics-exporter-prometheus, rendered on our own routes), the token-free loopback listener of `--metrics-listen`, and the edge's own counts (streams, connections, rejections).

use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::sync::OnceLock;
use std::time::Duration;
use vak_core::metrics_names as m;

/// The exposition's media type (text format 0.0.4).
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// How often histograms are drained into their buckets between scrapes.
const UPKEEP: Duration = Duration::from_secs(5);

/// The process's recorder, installed by the first server made in it (the
/// `metrics` facade has one global recorder; servers in one process share it).
static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the Prometheus recorder once per process; later calls return
/// the same handle. None when another recorder was installed first.
pub fn install() -> Option<&'static PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let built = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full(m::RUN_DURATION_SECONDS.into()),
                    m::RUN_SECONDS_BUCKETS,
                )
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Suffix("_seconds".into()), m::SECONDS_BUCKETS)
                })
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Full(m::LEDGER_BATCH_RECORDS.into()), m::BATCH_BUCKETS)
                })
                .and_then(|b| b.install_recorder());
            match built {
                Ok(handle) => {
                    m::describe();
                    let upkeep = handle.clone();
                    // A plain thread: installed before (or without) a runtime.
                    let spawned = std::thread::Builder::new()
                        .name("vak-metrics-upkeep".into())
                        .spawn(move || loop {
                            std::thread::sleep(UPKEEP);
                            upkeep.run_upkeep();
                        });
                    if let Err(e) = spawned {
                        tracing::warn!("metrics upkeep thread: {e}");
                    }
                    Some(handle)
                }
                Err(e) => {
                    tracing::warn!("metrics are off: {e}");
                    None
                }
            }
        })
        .as_ref()
}

/// `GET /metrics`: every metric in the Prometheus text format.
pub(crate) async fn scrape() -> Response {
    let Some(handle) = install() else {
        return crate::errors::json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "metrics are off in this process: another recorder was installed",
        );
    };
    let mut resp = handle.render().into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    resp
}

/// Whether a `Host` header names this machine (`localhost`, a loopback IP,
/// with or without a port): the token-free listener answers only those, so a
/// page elsewhere cannot read it through DNS rebinding.
fn loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(h, p)| {
            if p.bytes().all(|b| b.is_ascii_digit()) {
                h
            } else {
                host
            }
        }),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.to_canonical().is_loopback())
}

/// The `--metrics-listen` router (`server::serve_metrics` serves it):
/// `/metrics` only, no token, loopback Host only.
pub(crate) fn plain_router() -> axum::Router {
    axum::Router::new()
        .route("/metrics", axum::routing::get(scrape))
        .fallback(|| async {
            crate::errors::json_error(
                StatusCode::NOT_FOUND,
                "not_found",
                "this listener serves /metrics only",
            )
        })
        .layer(axum::middleware::from_fn(
            |req: Request, next: axum::middleware::Next| async move {
                let host = req
                    .headers()
                    .get(header::HOST)
                    .and_then(|h| h.to_str().ok())
                    .or_else(|| req.uri().authority().map(|a| a.as_str()));
                if !host.is_some_and(loopback_host) {
                    reject(Rejection::Host);
                    return crate::errors::json_error(
                        StatusCode::FORBIDDEN,
                        "forbidden",
                        "the Host header must name a loopback host",
                    );
                }
                next.run(req).await
            },
        ))
}

/// How a stream reached the server (`transport` label of `vak_streams_open`).
/// A gRPC-web or Connect request carries its own as an extension, set before
/// it is turned into gRPC, so its streams are counted as what the client spoke.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Transport {
    Sse,
    Grpc,
    GrpcWeb,
    Connect,
    WebSocket,
}

impl Transport {
    fn as_str(self) -> &'static str {
        match self {
            Transport::Sse => "sse",
            Transport::Grpc => "grpc",
            Transport::GrpcWeb => "grpc_web",
            Transport::Connect => "connect",
            Transport::WebSocket => "websocket",
        }
    }
}

/// What a stream follows (`surface` label of `vak_streams_open`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StreamSurface {
    /// One session's events (Subscribe, `GET /sessions/:id/events`).
    Session,
    /// The multiplexed `/stream`.
    Stream,
    /// A session's presentation timeline.
    Presentation,
    /// grpc.health Watch and reflection.
    Service,
    /// The browser terminal.
    Terminal,
}

impl StreamSurface {
    fn as_str(self) -> &'static str {
        match self {
            StreamSurface::Session => "session",
            StreamSurface::Stream => "stream",
            StreamSurface::Presentation => "presentation",
            StreamSurface::Service => "service",
            StreamSurface::Terminal => "terminal",
        }
    }
}

/// One open stream counted in `vak_streams_open` until dropped.
pub(crate) struct OpenStream(metrics::Gauge);

impl OpenStream {
    pub(crate) fn new(transport: Transport, surface: StreamSurface) -> OpenStream {
        let g = metrics::gauge!(m::STREAMS_OPEN, "transport" => transport.as_str(), "surface" => surface.as_str());
        g.increment(1.0);
        OpenStream(g)
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

/// Why a connection or request was refused (`cause` label of `vak_rejections_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rejection {
    /// Over `--max-connections`.
    ConnectionCap,
    /// Over `--max-streams` or `--max-streams-per-client`.
    StreamCap,
    /// No or a wrong token.
    Auth,
    /// A Host header that names no loopback or trusted host.
    Host,
    /// A cross-origin request from an origin not allowed.
    Origin,
}

impl Rejection {
    fn as_str(self) -> &'static str {
        match self {
            Rejection::ConnectionCap => "connection_cap",
            Rejection::StreamCap => "stream_cap",
            Rejection::Auth => "auth",
            Rejection::Host => "host",
            Rejection::Origin => "origin",
        }
    }
}

pub(crate) fn reject(cause: Rejection) {
    metrics::counter!(m::REJECTIONS, "cause" => cause.as_str()).increment(1);
}

/// The connection counters, registered once.
pub(crate) struct Connections {
    pub(crate) accepted: metrics::Counter,
    pub(crate) open: metrics::Gauge,
}

pub(crate) fn connections() -> &'static Connections {
    static C: OnceLock<Connections> = OnceLock::new();
    C.get_or_init(|| Connections {
        accepted: metrics::counter!(m::CONNECTIONS),
        open: metrics::gauge!(m::CONNECTIONS_OPEN),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_hosts_pass() {
        for ok in [
            "localhost",
            "localhost:9100",
            "127.0.0.1:9100",
            "[::1]:9100",
            "[::1]",
            "LOCALHOST",
        ] {
            assert!(loopback_host(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:9100",
            "10.0.0.1:9100",
            "[fe80::1]:1",
            "localhost.evil:1",
        ] {
            assert!(!loopback_host(bad), "{bad}");
        }
    }
}
