//! The task RPCs: scheduled tasks' CRUD and run-now.

use super::AgentApi;
use tonic::Status;
use vak_proto::v1 as pb;

impl AgentApi {
    pub(super) async fn tasks_list(
        &self,
        _req: pb::ListTasksRequest,
    ) -> Result<pb::ListTasksResponse, Status> {
        Err(Status::unimplemented("tasks: not yet"))
    }
    pub(super) async fn tasks_create(&self, _req: pb::CreateTaskRequest) -> Result<pb::TaskResponse, Status> {
        Err(Status::unimplemented("tasks: not yet"))
    }
    pub(super) async fn tasks_get(&self, _req: pb::GetTaskRequest) -> Result<pb::TaskResponse, Status> {
        Err(Status::unimplemented("tasks: not yet"))
    }
    pub(super) async fn tasks_update(&self, _req: pb::UpdateTaskRequest) -> Result<pb::TaskResponse, Status> {
        Err(Status::unimplemented("tasks: not yet"))
    }
    pub(super) async fn tasks_delete(
        &self,
        _req: pb::DeleteTaskRequest,
    ) -> Result<pb::DeleteTaskResponse, Status> {
        Err(Status::unimplemented("tasks: not yet"))
    }
    pub(super) async fn tasks_run_now(
        &self,
        _req: pb::RunTaskNowRequest,
    ) -> Result<pb::TaskResponse, Status> {
        Err(Status::unimplemented("tasks: not yet"))
    }
}
