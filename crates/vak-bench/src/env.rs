//! What a scenario runs against: the transport the bench reaches the server by, and
//! what the bench was told to use (binaries, sizes, extra flags); below the scenarios
//! and the server processes, which both take them.

use std::path::PathBuf;
use std::time::Duration;

/// How the bench reaches the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Transport {
    /// vak, `GET /sessions/:id/events`.
    Sse,
    /// vak, gRPC `Subscribe`.
    Grpc,
    /// The raw tonic baseline, gRPC `Subscribe` (same client code).
    Tonic,
    /// vak with `--tls-self-signed`, `GET /sessions/:id/events` over HTTP/1.1
    /// in TLS (reqwest; idle scenario only).
    SseTls,
    /// vak, `GET /sessions/:id/events` over HTTP/2 without TLS (h2c prior
    /// knowledge, reqwest), one stream per connection (idle scenario only).
    SseH2,
    /// The peer: nginx + nchan, its EventSource subscriber location (same
    /// client code as Sse), fed by HTTP publishes (fan-out and idle only).
    Nchan,
}

impl Transport {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Transport::Sse => "SSE",
            Transport::Grpc => "gRPC",
            Transport::Tonic => "raw tonic",
            Transport::SseTls => "SSE, TLS (HTTP/1.1)",
            Transport::SseH2 => "SSE, HTTP/2 (h2c)",
            Transport::Nchan => "nginx + nchan (SSE)",
        }
    }
}

/// What the bench was told to use.
#[derive(Clone, Debug)]
pub(crate) struct Env {
    /// The `vak` binary to serve with.
    pub vak: PathBuf,
    /// This bench binary (re-executed as the baseline server).
    pub exe: PathBuf,
    /// gRPC streams per HTTP/2 connection.
    pub per_conn: usize,
    /// The baseline's broadcast capacity (must hold a whole burst: it is lossless only then).
    pub capacity: usize,
    /// How long one scenario run may take before it is abandoned.
    pub limit: Duration,
    /// Extra `vak serve` flags (--serve-arg).
    pub serve_args: Vec<String>,
    /// Extra environment of every `vak serve` (--serve-env KEY=VALUE), e.g. an allocator to compare.
    pub serve_env: Vec<(String, String)>,
}
