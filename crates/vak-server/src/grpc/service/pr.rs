//! The PR view RPCs: the workspace branch's pull request through gh, and merging it.

use super::AgentApi;
use tonic::Status;
use vak_proto::v1 as pb;

impl AgentApi {
    pub(super) async fn pr_view(&self, _r: pb::GetPrRequest) -> Result<pb::PrView, Status> {
        Err(Status::unimplemented("get_pr: not built yet"))
    }
    pub(super) async fn pr_merge(&self, _r: pb::MergePrRequest) -> Result<pb::MergePrResponse, Status> {
        Err(Status::unimplemented("merge_pr: not built yet"))
    }
}
