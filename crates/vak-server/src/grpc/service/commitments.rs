//! ListCommitments, GetCommitment and CloseCommitment: the plans the sessions' models keep, and their closing by a person; ExplainIntent and GetIntentPolicy: how a prompt reads before it runs.

use super::forwarding::Served;
use super::AgentApi;
use crate::errors::to_status;
use crate::forward::{Method, FORWARD_TIMEOUT};
use crate::grpc::commitments::{commitment, priority, record, verdict_in};
use tonic::{Response, Status};
use vak_core::commitment::{split_id, MAX_NOTE};
use vak_proto::v1 as pb;

/// `<session>.<item>`, or InvalidArgument naming the shape.
fn parts(id: &str) -> Result<(&str, &str), Status> {
    split_id(id).ok_or_else(|| {
        Status::invalid_argument(format!(
            "invalid commitment id {:?}: <session id>.<item id>, each 1 to 64 of A-Z a-z 0-9 - _",
            id.chars().take(140).collect::<String>()
        ))
    })
}

impl AgentApi {
    pub(super) async fn commitments_listed(&self, r: pb::ListCommitmentsRequest) -> pb::CommitmentList {
        let (rows, priorities) = self.control().commitments(r.all).await;
        pb::CommitmentList {
            commitments: rows.into_iter().map(commitment).collect(),
            priorities: priorities.into_iter().map(priority).collect(),
            workspace: if r.all {
                String::new()
            } else {
                self.control().workspace().to_string()
            },
        }
    }

    pub(super) async fn commitment_detail(
        &self,
        r: pb::GetCommitmentRequest,
    ) -> Result<pb::CommitmentDetail, Status> {
        let (session, item) = parts(&r.id)?;
        let s = self.session(session).await?;
        let d = s.commitment(item).map_err(to_status)?;
        Ok(pb::CommitmentDetail {
            commitment: Some(commitment(d.commitment)),
            events: d.events.into_iter().map(record).collect(),
            missing: d.missing,
        })
    }

    pub(super) async fn commitment_close(
        &self,
        forwarded: bool,
        r: pb::CloseCommitmentRequest,
    ) -> Result<Response<pb::Commitment>, Status> {
        let (session, item) = parts(&r.id)?;
        let Some(verdict) = verdict_in(r.verdict) else {
            return Err(Status::invalid_argument(
                "verdict is required: fulfilled, abandoned or superseded",
            ));
        };
        if r.note.len() > MAX_NOTE {
            return Err(Status::invalid_argument(format!(
                "the note is {} bytes; at most {MAX_NOTE}",
                r.note.len()
            )));
        }
        let s = match self
            .here_or_forward(forwarded, session, Method::CloseCommitment, &r, FORWARD_TIMEOUT)
            .await?
        {
            Served::Here(s) => s,
            Served::There(answer) => return Ok(answer),
        };
        let closed = s
            .close_commitment(item, verdict, r.note)
            .await
            .map_err(to_status)?;
        Ok(Response::new(commitment(closed)))
    }
}

impl AgentApi {
    pub(super) fn intent_explained(
        &self,
        r: pb::ExplainIntentRequest,
    ) -> Result<pb::IntentExplanation, Status> {
        let (surface, given) = crate::grpc::intent::given(&r).map_err(to_status)?;
        let e = self
            .control()
            .explain(&r.prompt, surface, &given)
            .map_err(to_status)?;
        Ok(crate::grpc::intent::explanation(surface, e))
    }

    pub(super) fn intent_policy(&self) -> pb::IntentPolicy {
        crate::grpc::intent::policy(self.control().workspace(), self.control().policy())
    }
}
