//! The memory RPCs that change notes: add, update, delete.

use super::AgentApi;
use crate::errors::to_status;
use crate::grpc::convert;
use tonic::Status;
use vak_core::host::memory;
use vak_proto::v1 as pb;

impl AgentApi {
    pub(super) async fn memory_add(&self, r: pb::AddMemoryRequest) -> Result<pb::MemoryNote, Status> {
        let new = memory::NewNote {
            text: r.text,
            kind: r.kind,
            tag: r.tag,
            scope: convert::memory_scope_in(r.scope).map_err(to_status)?,
            session_id: r.session_id,
        };
        let note = self.control().memory().add(new).await.map_err(to_status)?;
        Ok(convert::memory_note(note))
    }

    pub(super) async fn memory_update(&self, r: pb::UpdateMemoryRequest) -> Result<pb::MemoryNote, Status> {
        let scope = convert::memory_scope_in(r.scope).map_err(to_status)?;
        let note = self
            .control()
            .memory()
            .update(&r.note_id, &r.text, scope)
            .await
            .map_err(to_status)?;
        Ok(convert::memory_note(note))
    }

    pub(super) async fn memory_delete(
        &self,
        r: pb::DeleteMemoryRequest,
    ) -> Result<pb::DeleteMemoryResponse, Status> {
        let scope = convert::memory_scope_in(r.scope).map_err(to_status)?;
        let note = self
            .control()
            .memory()
            .delete(&r.note_id, scope)
            .await
            .map_err(to_status)?;
        Ok(pb::DeleteMemoryResponse {
            note: Some(convert::memory_note(note)),
        })
    }
}
