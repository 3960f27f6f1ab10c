//! What a request may use before its call runs (a stream slot for its client, its attachments stored, the folder the files API works in), and the small helpers the calls share: blocking work, a `limit`, the sessions a storage failure stopped.

use super::{AgentApi, Surface};
use crate::errors::to_status;
use crate::limits::StreamPermit;
use crate::listener::PeerAddr;
use crate::metrics::{StreamSurface, Transport};
use tonic::{Request, Status};
use vak_proto::v1 as pb;

impl AgentApi {
    /// Sessions stopped by a storage failure, with the reason (for /health).
    pub fn storage_failures(&self) -> Vec<(String, String)> {
        self.sessions()
            .storage_failures()
            .into_iter()
            .map(|(id, stopped)| (id, stopped.reason()))
            .collect()
    }

    /// A stream slot for the request's client (429 / RESOURCE_EXHAUSTED past the caps).
    pub(super) fn permit<T>(&self, req: &Request<T>, surface: StreamSurface) -> Result<StreamPermit, Status> {
        let client = req.extensions().get::<PeerAddr>().map(|p| p.0.ip());
        let transport = if req.extensions().get::<Surface>() == Some(&Surface::Sse) {
            Transport::Sse
        } else {
            req.extensions()
                .get::<Transport>()
                .copied()
                .unwrap_or(Transport::Grpc)
        };
        Ok(self.limits.acquire(client)?.counted(transport, surface))
    }

    /// Checks and stores an input's attachments (before admission, so a
    /// refused one admits nothing); their references.
    pub(super) async fn attachments(
        &self,
        s: &vak_core::session::live::Session,
        list: Vec<pb::Attachment>,
    ) -> Result<Vec<vak_core::session::attachments::AttachmentRef>, Status> {
        let list = list.into_iter().map(|a| (a.media_type, a.data, a.name)).collect();
        vak_core::session::attachments::accept(&s.runtime().cfg.home, list)
            .await
            .map_err(to_status)
    }

    /// The workspace the files API works in: the session's when one is
    /// named (a session keeps the workspace it was created in), else the server's.
    pub(super) async fn files_root(&self, session_id: Option<&str>) -> Result<std::path::PathBuf, Status> {
        match session_id {
            Some(id) => {
                let s = self.session(id).await?;
                // An opened workspace is re-checked at every use.
                s.runtime().check_workspace().await.map_err(to_status)?;
                Ok(s.workspace_dir().to_path_buf())
            }
            None => Ok(self.control().config().workspace.clone()),
        }
    }
}

/// Runs blocking file work off the runtime's workers.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> vak_core::Result<T> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| to_status(vak_core::Error::internal(e.to_string())))?
        .map_err(to_status)
}

/// A request's `limit`: absent is `default`, else 1 to `max`.
pub(super) fn limit_in(limit: Option<u32>, default: usize, max: usize) -> Result<usize, Status> {
    match limit {
        None => Ok(default),
        Some(n) if n >= 1 && n as usize <= max => Ok(n as usize),
        Some(n) => Err(Status::invalid_argument(format!("limit {n}: give 1 to {max}"))),
    }
}
