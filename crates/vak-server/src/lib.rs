//! The network edge: the one listener, the auth guard, and the gRPC and REST/SSE adapters over the core. The only code that imports tonic or axum.

pub mod access_log;
pub mod auth;
pub mod body;
pub mod errors;
pub mod fdlimit;
pub mod forward;
pub mod forward_answer;
pub mod grpc;
pub mod handoff;
pub mod http;
pub mod limits;
pub mod listener;
pub mod logins;
pub mod reaper;
pub mod recent_errors;
pub mod server;
pub mod stream_caps;
pub mod tls;
