//! ExportBackup and ImportBackup: a home copied out to a directory and back (the core's `host::backup`), converted to the wire.

use super::AgentApi;
use crate::errors::to_status;
use tonic::Status;
use vak_core::host::backup::{self, Action, Conflict};
use vak_proto::v1 as pb;

impl AgentApi {
    pub(super) async fn backup_export(
        &self,
        r: pb::ExportBackupRequest,
    ) -> Result<pb::ExportBackupResponse, Status> {
        let e = backup::export_served(self.hub(), &r.dest_dir, r.include_secrets)
            .await
            .map_err(to_status)?;
        Ok(pb::ExportBackupResponse {
            dest_dir: e.dest_dir.display().to_string(),
            sessions: e.sessions,
            files: e.files,
            bytes: e.bytes,
            manifest: e.manifest.display().to_string(),
        })
    }

    pub(super) async fn backup_import(
        &self,
        r: pb::ImportBackupRequest,
    ) -> Result<pb::ImportBackupResponse, Status> {
        let conflict = conflict_in(r.conflict).map_err(to_status)?;
        let got = backup::import(self.hub(), &r.src_dir, conflict)
            .await
            .map_err(to_status)?;
        Ok(pb::ImportBackupResponse {
            sessions: got
                .sessions
                .into_iter()
                .map(|s| pb::ImportedSession {
                    session_id: s.session_id,
                    imported_as: s.imported_as,
                    action: action(s.action) as i32,
                })
                .collect(),
        })
    }
}

/// ImportBackupRequest.conflict: unspecified is skip; an unknown number is refused.
fn conflict_in(n: i32) -> vak_core::Result<Conflict> {
    match pb::BackupConflict::try_from(n) {
        Ok(pb::BackupConflict::Unspecified | pb::BackupConflict::Skip) => Ok(Conflict::Skip),
        Ok(pb::BackupConflict::Overwrite) => Ok(Conflict::Overwrite),
        Ok(pb::BackupConflict::Rename) => Ok(Conflict::Rename),
        Err(_) => Err(vak_core::Error::invalid(
            "conflict: expected one of skip, overwrite, rename",
        )),
    }
}

fn action(a: Action) -> pb::ImportAction {
    match a {
        Action::Imported => pb::ImportAction::Imported,
        Action::Skipped => pb::ImportAction::Skipped,
        Action::Overwritten => pb::ImportAction::Overwritten,
        Action::Renamed => pb::ImportAction::Renamed,
    }
}
