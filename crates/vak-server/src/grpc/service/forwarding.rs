//! Where a session's writes are served: here, or forwarded to the replica holding its lease (`--bus`).

use super::AgentApi;
use crate::errors::to_status;
use crate::forward::{self, Forwarded, Method};
use std::sync::Arc;
use std::time::Duration;
use tonic::{Request, Response, Status};
use vak_core::cluster::owners::Owner;
use vak_core::host::registry::Located;

impl AgentApi {
    /// Where an admission for session `id` is served: here, or the replica
    /// holding its lease (`--bus`). A forwarded request is never forwarded again.
    pub(super) async fn locate(&self, forwarded: bool, id: &str) -> Result<Located, Status> {
        if forwarded {
            return self.session(id).await.map(Located::Local);
        }
        if id.is_empty() {
            return Err(Status::invalid_argument("session_id is required"));
        }
        self.sessions().find(id).await.map_err(to_status)
    }

    /// Asks `owner` to answer `req` as its `method` (`forward.rs`).
    pub(super) async fn forward<Req: prost::Message, Resp: prost::Message + Default>(
        &self,
        owner: &Owner,
        method: Method,
        req: &Req,
        timeout: Duration,
    ) -> Result<Response<Resp>, Status> {
        let owners = self
            .control()
            .config()
            .owners
            .as_ref()
            .ok_or_else(|| Status::internal("a session served elsewhere on a replica without leases"))?;
        forward::call(owners, owner, method, req, timeout)
            .await
            .map(Response::new)
    }
}

/// A session served here, or the answer its holder gave to a forwarded request.
pub(super) enum Served<Resp> {
    Here(Arc<vak_core::session::live::Session>),
    There(Response<Resp>),
}

impl AgentApi {
    /// The session `id` when this replica writes it; else `req` forwarded
    /// to the holder as `method` (`--bus`), and the holder's answer.
    pub(super) async fn here_or_forward<Req: prost::Message, Resp: prost::Message + Default>(
        &self,
        forwarded: bool,
        id: &str,
        method: Method,
        req: &Req,
        timeout: Duration,
    ) -> Result<Served<Resp>, Status> {
        Ok(match self.locate(forwarded, id).await? {
            Located::Local(s) => Served::Here(s),
            Located::Remote(owner) => Served::There(self.forward(&owner, method, req, timeout).await?),
        })
    }
}

pub(super) fn is_forwarded<T>(req: &Request<T>) -> bool {
    req.extensions().get::<Forwarded>().is_some()
}
