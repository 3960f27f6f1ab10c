//! ExportBackup and ImportBackup: a home copied out to a directory and back.

use super::AgentApi;
use tonic::Status;
use vak_proto::v1 as pb;

impl AgentApi {
    pub(super) async fn backup_export(
        &self,
        _r: pb::ExportBackupRequest,
    ) -> Result<pb::ExportBackupResponse, Status> {
        Err(Status::unimplemented("backup export is not built yet"))
    }
    pub(super) async fn backup_import(
        &self,
        _r: pb::ImportBackupRequest,
    ) -> Result<pb::ImportBackupResponse, Status> {
        Err(Status::unimplemented("backup import is not built yet"))
    }
}
