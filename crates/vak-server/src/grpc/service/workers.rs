//! The worker and best-of-N RPCs: a session's children, steered and stopped through their parent, and best-of-N keep and discard.

use super::AgentApi;
use crate::errors::to_status;
use crate::grpc::{convert, enums};
use tonic::Status;
use vak_proto::v1 as pb;

impl AgentApi {
    pub(super) async fn workers_list(
        &self,
        r: pb::ListWorkersRequest,
    ) -> Result<pb::ListWorkersResponse, Status> {
        let workers = self
            .hub()
            .children()
            .list(&r.session_id)
            .await
            .map_err(to_status)?;
        Ok(pb::ListWorkersResponse {
            workers: workers.into_iter().map(convert::worker).collect(),
        })
    }

    pub(super) async fn workers_steer(&self, r: pb::SteerWorkerRequest) -> Result<pb::Worker, Status> {
        self.hub()
            .children()
            .steer(&r.session_id, &r.child_id, r.text)
            .await
            .map(convert::worker)
            .map_err(to_status)
    }

    pub(super) async fn workers_stop(&self, r: pb::StopWorkerRequest) -> Result<pb::Worker, Status> {
        self.hub()
            .children()
            .stop(&r.session_id, &r.child_id)
            .await
            .map(convert::worker)
            .map_err(to_status)
    }

    pub(super) async fn bestofn_start(
        &self,
        r: pb::StartBestOfNRequest,
    ) -> Result<pb::StartBestOfNResponse, Status> {
        let (bestofn_id, candidates) = self
            .hub()
            .children()
            .start_bestofn(&r.session_id, r.prompt, r.n)
            .await
            .map_err(to_status)?;
        Ok(pb::StartBestOfNResponse {
            bestofn_id,
            candidates: candidates
                .into_iter()
                .map(|c| pb::Candidate {
                    id: c.id,
                    branch: c.branch,
                    worktree: c.worktree,
                })
                .collect(),
        })
    }

    pub(super) async fn bestofn_keep(
        &self,
        r: pb::KeepCandidateRequest,
    ) -> Result<pb::KeepCandidateResponse, Status> {
        let k = self
            .hub()
            .children()
            .keep(&r.session_id, &r.candidate)
            .await
            .map_err(to_status)?;
        Ok(pb::KeepCandidateResponse {
            candidate: k.candidate,
            branch: k.branch,
            into: k.merged.into,
            fast_forward: k.merged.fast_forward,
            commit: k.merged.commit,
            discarded: k.discarded,
        })
    }

    pub(super) async fn bestofn_discard(
        &self,
        r: pb::DiscardCandidateRequest,
    ) -> Result<pb::DraftDiscarded, Status> {
        let d = self
            .hub()
            .children()
            .discard(&r.session_id, &r.candidate)
            .await
            .map_err(to_status)?;
        Ok(pb::DraftDiscarded {
            candidate: d.candidate,
            branch: d.branch,
            why: enums::discard_reason(d.why) as i32,
        })
    }
}
