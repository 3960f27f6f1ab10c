//! ListSkillProposals, CreateSkillProposal, PromoteSkillProposal, RejectSkillProposal and ListSkills: learned skills, proposed from repeated runs or on request, promoted to files the model's `skill__<name>` tools come from.

use super::AgentApi;
use crate::errors::to_status;
use tonic::Status;
use vak_core::host::skills::{Proposal, ProposalState, Scope, Skill, SkillKind};
use vak_proto::v1 as pb;

fn kind(k: SkillKind) -> i32 {
    match k {
        SkillKind::Prompt => pb::SkillKind::Prompt,
        SkillKind::Script => pb::SkillKind::Script,
    }
    .into()
}

fn proposal(p: Proposal) -> pb::SkillProposal {
    pb::SkillProposal {
        id: p.id,
        name: p.name,
        description: p.description,
        body: p.body,
        kind: kind(p.kind),
        source: Some(pb::SkillSource {
            session: p.source.session,
            seqs: p.source.seqs,
        }),
        duplicate_of: p.duplicate_of,
        tags: p.tags,
        state: match p.state {
            ProposalState::Pending => pb::ProposalState::Pending,
            ProposalState::Promoted => pb::ProposalState::Promoted,
            ProposalState::Rejected => pb::ProposalState::Rejected,
        }
        .into(),
        created_at: p.created_at,
        workspace: p.workspace,
    }
}

fn skill(s: Skill) -> pb::Skill {
    pb::Skill {
        name: s.name,
        description: s.description,
        kind: kind(s.kind),
        body: s.body,
        scope: match s.scope {
            Scope::Workspace => pb::SkillScope::Workspace,
            Scope::Global => pb::SkillScope::Global,
        }
        .into(),
        path: s.path.display().to_string(),
    }
}

/// A proposal id as we make them: "sp_" and 12 hex digits.
fn proposal_id(id: &str) -> Result<(), Status> {
    let ok = id.len() == 15 && id.starts_with("sp_") && id[3..].bytes().all(|b| b.is_ascii_hexdigit());
    if ok {
        Ok(())
    } else {
        Err(Status::invalid_argument(format!(
            "invalid proposal id {:?}: \"sp_\" and 12 hex digits",
            id.chars().take(40).collect::<String>()
        )))
    }
}

impl AgentApi {
    fn skills(&self) -> std::sync::Arc<vak_core::host::skills::Skills> {
        self.control().skills().clone()
    }

    pub(super) fn skill_proposals(&self) -> pb::SkillProposals {
        pb::SkillProposals {
            proposals: self.skills().proposals().into_iter().map(proposal).collect(),
        }
    }

    pub(super) async fn skill_propose(
        &self,
        r: pb::CreateSkillProposalRequest,
    ) -> Result<pb::SkillProposal, Status> {
        let s = self.session(&r.from_session).await?;
        let range = r.seq_range.map(|x| (x.from, x.to));
        let p = s.propose_skill(range, r.name).await.map_err(to_status)?;
        Ok(proposal(p))
    }

    pub(super) async fn skill_promote(
        &self,
        r: pb::PromoteSkillProposalRequest,
    ) -> Result<pb::Skill, Status> {
        proposal_id(&r.id)?;
        let scope = match pb::SkillScope::try_from(r.scope) {
            Ok(pb::SkillScope::Global) => Scope::Global,
            Ok(_) => Scope::Workspace,
            Err(_) => {
                return Err(Status::invalid_argument(format!(
                    "scope {} is not one this server knows",
                    r.scope
                )))
            }
        };
        let skills = self.skills();
        let done = tokio::task::spawn_blocking(move || skills.promote(&r.id, scope, r.name.as_deref()))
            .await
            .map_err(|e| Status::internal(e.to_string()))?;
        done.map(skill).map_err(to_status)
    }

    pub(super) fn skill_reject(
        &self,
        r: pb::RejectSkillProposalRequest,
    ) -> Result<pb::SkillProposal, Status> {
        proposal_id(&r.id)?;
        self.skills().reject(&r.id).map(proposal).map_err(to_status)
    }

    pub(super) async fn skills_listed(&self, r: pb::ListSkillsRequest) -> Result<pb::SkillList, Status> {
        let skills = self.skills();
        let ws = self.files_root(r.session_id.as_deref()).await?;
        let workspace = ws.display().to_string();
        let list = tokio::task::spawn_blocking(move || skills.list(&ws))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(to_status)?;
        Ok(pb::SkillList {
            skills: list.into_iter().map(skill).collect(),
            workspace,
        })
    }
}
