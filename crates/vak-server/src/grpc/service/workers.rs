//! The worker and best-of-N RPCs: a session's children, steered and stopped through their parent, and best-of-N keep and discard.

use super::AgentApi;
use tonic::Status;
use vak_proto::v1 as pb;

impl AgentApi {
    pub(super) async fn workers_list(
        &self,
        _r: pb::ListWorkersRequest,
    ) -> Result<pb::ListWorkersResponse, Status> {
        Err(Status::unimplemented("list_workers: not built yet"))
    }
    pub(super) async fn workers_steer(&self, _r: pb::SteerWorkerRequest) -> Result<pb::Worker, Status> {
        Err(Status::unimplemented("steer_worker: not built yet"))
    }
    pub(super) async fn workers_stop(&self, _r: pb::StopWorkerRequest) -> Result<pb::Worker, Status> {
        Err(Status::unimplemented("stop_worker: not built yet"))
    }
    pub(super) async fn bestofn_start(
        &self,
        _r: pb::StartBestOfNRequest,
    ) -> Result<pb::StartBestOfNResponse, Status> {
        Err(Status::unimplemented("start_best_of_n: not built yet"))
    }
    pub(super) async fn bestofn_keep(
        &self,
        _r: pb::KeepCandidateRequest,
    ) -> Result<pb::KeepCandidateResponse, Status> {
        Err(Status::unimplemented("keep_candidate: not built yet"))
    }
    pub(super) async fn bestofn_discard(
        &self,
        _r: pb::DiscardCandidateRequest,
    ) -> Result<pb::DraftDiscarded, Status> {
        Err(Status::unimplemented("discard_candidate: not built yet"))
    }
}
