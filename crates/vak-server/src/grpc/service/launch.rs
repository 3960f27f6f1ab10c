//! The dev-server RPCs: a session workspace's launch configs, started and stopped in their own process groups, and their output.

use super::AgentApi;
use tonic::Status;
use vak_proto::v1 as pb;

impl AgentApi {
    pub(super) async fn launch_list(
        &self,
        _r: pb::ListLaunchRequest,
    ) -> Result<pb::ListLaunchResponse, Status> {
        Err(Status::unimplemented("list_launch: not built yet"))
    }
    pub(super) async fn launch_start(&self, _r: pb::StartLaunchRequest) -> Result<pb::LaunchStarted, Status> {
        Err(Status::unimplemented("start_launch: not built yet"))
    }
    pub(super) async fn launch_stop(&self, _r: pb::StopLaunchRequest) -> Result<pb::LaunchStopped, Status> {
        Err(Status::unimplemented("stop_launch: not built yet"))
    }
    pub(super) async fn launch_logs(&self, _r: pb::GetLaunchLogsRequest) -> Result<pb::LaunchLogs, Status> {
        Err(Status::unimplemented("get_launch_logs: not built yet"))
    }
}
