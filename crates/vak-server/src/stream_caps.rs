//! The stream caps for the long-lived streams that need no credentials (grpc.health Watch, reflection): each holds a `StreamPermit` for as long as its response body lives, like every AgentService stream does.

use super::body::{watched, Watch};
use super::errors::refuse;
use super::limits::{StreamLimits, StreamPermit};
use super::listener::PeerAddr;
use super::protocol::Protocol;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use std::sync::Arc;

/// RPCs whose answer is a stream and that anyone may open.
fn is_open_stream(path: &str) -> bool {
    path == "/grpc.health.v1.Health/Watch"
        || path.starts_with("/grpc.reflection.v1.ServerReflection/")
        || path.starts_with("/grpc.reflection.v1alpha.ServerReflection/")
}

/// Middleware on the gRPC services: refuses with RESOURCE_EXHAUSTED past the
/// caps, else ties a permit to the response body.
pub(crate) async fn cap(State(limits): State<Arc<StreamLimits>>, req: Request, next: Next) -> Response {
    if !is_open_stream(req.uri().path()) {
        return next.run(req).await;
    }
    let client = req.extensions().get::<PeerAddr>().map(|p| p.0.ip());
    let permit = match limits.acquire(client) {
        Ok(p) => p.counted(
            crate::metrics::Transport::Grpc,
            crate::metrics::StreamSurface::Service,
        ),
        Err(status) => return refuse(&Protocol::of(req.method(), req.uri(), req.headers()), status),
    };
    let (parts, body) = next.run(req).await.into_parts();
    Response::from_parts(parts, watched(body, permit))
}

/// A permit rides along its stream's body, released when the body goes.
impl Watch for StreamPermit {}
