//! The REST/SSE adapter: axum handlers that translate HTTP into calls on the gRPC service implementation and its results back into JSON and SSE.

pub mod assets;
pub mod pty;
pub mod query;
pub mod routes;
pub mod sse;
pub mod sse_encode;
pub mod state;
pub mod stream;
