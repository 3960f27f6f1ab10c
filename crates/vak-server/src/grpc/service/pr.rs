//! The PR view RPCs: the workspace branch's pull request through gh, and merging it.

use super::AgentApi;
use crate::errors::to_status;
use tonic::Status;
use vak_core::host::pr::{self, Method, Reason};
use vak_proto::v1 as pb;

fn reason(r: Option<Reason>) -> pb::PrReason {
    match r {
        None => pb::PrReason::Unspecified,
        Some(Reason::NoPr) => pb::PrReason::NoPr,
        Some(Reason::GhUnavailable) => pb::PrReason::GhUnavailable,
        Some(Reason::NotAGitRepo) => pb::PrReason::NotAGitRepo,
    }
}

fn method_in(m: i32) -> Result<Method, Status> {
    match pb::MergeMethod::try_from(m) {
        Ok(pb::MergeMethod::Squash) => Ok(Method::Squash),
        Ok(pb::MergeMethod::Merge) => Ok(Method::Merge),
        Ok(pb::MergeMethod::Rebase) => Ok(Method::Rebase),
        _ => Err(Status::invalid_argument(
            "method is required: squash, merge or rebase",
        )),
    }
}

impl AgentApi {
    pub(super) async fn pr_view(&self, r: pb::GetPrRequest) -> Result<pb::PrView, Status> {
        let s = self.session(&r.session_id).await?;
        s.runtime().check_workspace().await.map_err(to_status)?;
        let cfg = self.control().config();
        let v = pr::view(s.workspace_dir(), &cfg.git, &cfg.gh)
            .await
            .map_err(to_status)?;
        Ok(pb::PrView {
            reason: reason(v.reason) as i32,
            number: v.number,
            title: v.title,
            state: v.state,
            url: v.url,
            head_ref: v.head_ref,
            checks: v.reason.is_none().then_some(pb::PrChecks {
                passing: v.checks.passing,
                failing: v.checks.failing,
                pending: v.checks.pending,
            }),
            message: v.message,
        })
    }

    pub(super) async fn pr_merge(&self, r: pb::MergePrRequest) -> Result<pb::MergePrResponse, Status> {
        let s = self.session(&r.session_id).await?;
        let method = method_in(r.method)?;
        if r.number == 0 {
            return Err(Status::invalid_argument("number is required"));
        }
        s.runtime().check_workspace().await.map_err(to_status)?;
        let gh = self.control().config().gh.clone();
        let output = pr::merge(s.workspace_dir(), &gh, r.number, method)
            .await
            .map_err(to_status)?;
        Ok(pb::MergePrResponse {
            number: r.number,
            method: r.method,
            output,
        })
    }
}
