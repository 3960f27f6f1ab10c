//! The network edge: the one listener, the auth guard, and the gRPC and REST/SSE adapters over the core. The only code that imports tonic or axum.

// What another crate may use is `pub`; everything else is `pub(crate)`, and the
// compiler checks it (a `pub` item no other crate can reach is a warning).
#![warn(unreachable_pub)]

pub(crate) mod access_log;
pub mod auth;
pub(crate) mod body;
pub(crate) mod connect;
pub(crate) mod errors;
pub mod fdlimit;
pub(crate) mod forward;
pub(crate) mod forward_answer;
pub(crate) mod grpc;
pub(crate) mod handoff;
pub mod http;
pub(crate) mod limits;
pub mod listener;
pub(crate) mod logins;
pub mod metrics;
pub(crate) mod protocol;
pub(crate) mod reaper;
pub(crate) mod recent_errors;
pub mod server;
pub(crate) mod stream_caps;
pub mod tickets;
pub mod tls;
pub(crate) mod trace;
