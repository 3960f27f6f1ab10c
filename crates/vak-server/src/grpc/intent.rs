//! Intent between core and wire: a request's prompt and what its caller already knows, the reading with its signals, the engagement, the baseline diff and the policy.

use super::enums::permission_mode;
use vak_core::commitment::Stakes;
use vak_core::error::{Error, Result};
use vak_core::host::control::Explanation;
use vak_core::intent::{Act, EvidenceKind, Given, Horizon, Policy, PolicySource, Surface};
use vak_proto::v1 as pb;

fn act(a: Act) -> pb::Act {
    match a {
        Act::Ask => pb::Act::Ask,
        Act::Change => pb::Act::Change,
        Act::Run => pb::Act::Run,
        Act::Plan => pb::Act::Plan,
        Act::Review => pb::Act::Review,
    }
}

fn horizon(h: Horizon) -> pb::Horizon {
    match h {
        Horizon::Now => pb::Horizon::Now,
        Horizon::Session => pb::Horizon::Session,
        Horizon::Scheduled => pb::Horizon::Scheduled,
    }
}

fn stakes(s: Stakes) -> pb::Stakes {
    match s {
        Stakes::Low => pb::Stakes::Low,
        Stakes::Medium => pb::Stakes::Medium,
        Stakes::High => pb::Stakes::High,
    }
}

fn evidence(k: EvidenceKind) -> pb::RequirementKind {
    match k {
        EvidenceKind::ToolOk => pb::RequirementKind::ToolOk,
        EvidenceKind::FileChanged => pb::RequirementKind::FileChanged,
        EvidenceKind::Approval => pb::RequirementKind::Approval,
    }
}

fn surface(s: Surface) -> pb::IntentSurface {
    match s {
        Surface::Api => pb::IntentSurface::Api,
        Surface::App => pb::IntentSurface::App,
        Surface::Term => pb::IntentSurface::Term,
        Surface::Ide => pb::IntentSurface::Ide,
        Surface::Task => pb::IntentSurface::Task,
    }
}

/// A number no value of `what` has.
fn unknown(what: &str, n: i32) -> Error {
    Error::invalid(format!("{what} {n} is not one this server knows"))
}

/// The request's surface (UNSPECIFIED: api) and what it already knows.
pub(crate) fn given(r: &pb::ExplainIntentRequest) -> Result<(Surface, Given)> {
    let surface = match pb::IntentSurface::try_from(r.surface).map_err(|_| unknown("surface", r.surface))? {
        pb::IntentSurface::Unspecified | pb::IntentSurface::Api => Surface::Api,
        pb::IntentSurface::App => Surface::App,
        pb::IntentSurface::Term => Surface::Term,
        pb::IntentSurface::Ide => Surface::Ide,
        pb::IntentSurface::Task => Surface::Task,
    };
    let act = match pb::Act::try_from(r.act).map_err(|_| unknown("act", r.act))? {
        pb::Act::Unspecified => None,
        pb::Act::Ask => Some(Act::Ask),
        pb::Act::Change => Some(Act::Change),
        pb::Act::Run => Some(Act::Run),
        pb::Act::Plan => Some(Act::Plan),
        pb::Act::Review => Some(Act::Review),
    };
    let horizon = match pb::Horizon::try_from(r.horizon).map_err(|_| unknown("horizon", r.horizon))? {
        pb::Horizon::Unspecified => None,
        pb::Horizon::Now => Some(Horizon::Now),
        pb::Horizon::Session => Some(Horizon::Session),
        pb::Horizon::Scheduled => Some(Horizon::Scheduled),
    };
    let stakes = match pb::Stakes::try_from(r.stakes).map_err(|_| unknown("stakes", r.stakes))? {
        pb::Stakes::Unspecified => None,
        pb::Stakes::Low => Some(Stakes::Low),
        pb::Stakes::Medium => Some(Stakes::Medium),
        pb::Stakes::High => Some(Stakes::High),
    };
    let evidence = match &r.evidence {
        None => None,
        Some(e) => Some(
            e.kinds
                .iter()
                .map(|&k| match pb::RequirementKind::try_from(k) {
                    Ok(pb::RequirementKind::ToolOk) => Ok(EvidenceKind::ToolOk),
                    Ok(pb::RequirementKind::FileChanged) => Ok(EvidenceKind::FileChanged),
                    Ok(pb::RequirementKind::Approval) => Ok(EvidenceKind::Approval),
                    _ => Err(unknown("evidence kind", k)),
                })
                .collect::<Result<Vec<_>>>()?,
        ),
    };
    Ok((
        surface,
        Given {
            act,
            horizon,
            stakes,
            evidence,
        },
    ))
}

pub(crate) fn explanation(s: Surface, e: Explanation) -> pb::IntentExplanation {
    let r = e.reading;
    pb::IntentExplanation {
        surface: surface(s) as i32,
        reading: Some(pb::IntentReading {
            act: act(r.act) as i32,
            horizon: horizon(r.horizon) as i32,
            stakes: stakes(r.stakes) as i32,
            evidence: r.evidence.into_iter().map(|k| evidence(k) as i32).collect(),
            signals: r
                .signals
                .into_iter()
                .map(|s| pb::IntentSignal {
                    field: s.field.to_string(),
                    value: s.value,
                    because: s.because,
                })
                .collect(),
        }),
        engagement: Some(pb::Engagement {
            mode: permission_mode(e.engagement.mode) as i32,
            tools: e.engagement.tools,
            approvals: e.engagement.approvals,
            route: e.engagement.route,
            plan_first: e.engagement.plan_first,
            read_only: e.engagement.read_only,
        }),
        baseline_diff: Some(pb::BaselineDiff {
            mode: e.diff.mode.map(|m| permission_mode(m) as i32),
            tools_withheld: e.diff.tools_withheld,
            approvals_added: e.diff.approvals_added,
            plan_first: e.diff.plan_first,
        }),
    }
}

pub(crate) fn policy(workspace: &str, p: &Policy) -> pb::IntentPolicy {
    pb::IntentPolicy {
        workspace: workspace.to_string(),
        intent: Some(pb::IntentSection {
            high_stakes_mode: permission_mode(p.high_stakes_mode) as i32,
            read_only_acts: p.read_only_acts.iter().map(|a| act(*a) as i32).collect(),
            plan_first_at: p.plan_first_at.map_or(pb::Stakes::Unspecified, stakes) as i32,
        }),
        commitment: Some(pb::CommitmentSection {
            require_evidence: p.require_evidence,
        }),
        sources: p
            .sources
            .iter()
            .map(|(key, source)| pb::PolicySetting {
                key: key.to_string(),
                source: match source {
                    PolicySource::Default => pb::PolicySource::Default,
                    PolicySource::File => pb::PolicySource::File,
                } as i32,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_core_value_has_the_proto_value_of_its_wire_name() {
        for a in Act::ALL {
            assert_eq!(act(a).json_name(), a.as_str());
        }
        for h in [Horizon::Now, Horizon::Session, Horizon::Scheduled] {
            assert_eq!(horizon(h).json_name(), h.as_str());
        }
        for s in [
            Surface::Api,
            Surface::App,
            Surface::Term,
            Surface::Ide,
            Surface::Task,
        ] {
            assert_eq!(surface(s).json_name(), s.as_str());
        }
        for k in [
            EvidenceKind::ToolOk,
            EvidenceKind::FileChanged,
            EvidenceKind::Approval,
        ] {
            assert_eq!(evidence(k).json_name(), k.as_str());
        }
        // A request's values come back as the core's.
        let r = pb::ExplainIntentRequest {
            act: pb::Act::Review as i32,
            surface: pb::IntentSurface::Task as i32,
            evidence: Some(pb::EvidenceKinds { kinds: vec![] }),
            ..Default::default()
        };
        let (s, g) = given(&r).unwrap();
        assert_eq!(
            (s, g.act, g.evidence),
            (Surface::Task, Some(Act::Review), Some(vec![]))
        );
        assert!(given(&pb::ExplainIntentRequest {
            act: 42,
            ..Default::default()
        })
        .is_err());
    }
}
