//! The REST/SSE adapter: axum handlers that translate HTTP into calls on the gRPC service implementation and its results back into JSON and SSE.

pub mod assets;
pub(crate) mod commitments;
pub(crate) mod pty;
pub(crate) mod query;
pub(crate) mod routes;
pub(crate) mod skills;
pub(crate) mod sse;
pub(crate) mod sse_encode;
pub(crate) mod state;
pub(crate) mod stream;
pub(crate) mod workbench;
