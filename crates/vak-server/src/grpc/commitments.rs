//! Commitments between core and wire: the commitment, its requirements and closure, its events, and the enums they carry.

use vak_core::commitment::{Change, Closure, Commitment, PlanStatus, Priority, Requirement, Stakes, Verdict};
use vak_core::log::plan::Recorded;
use vak_proto::v1 as pb;

pub(crate) fn commitment(c: Commitment) -> pb::Commitment {
    pb::Commitment {
        id: c.id,
        item: c.item,
        session_id: c.session_id,
        text: c.text,
        status: plan_status(c.status) as i32,
        evidence: c.evidence,
        requires: c.requires.into_iter().map(requirement).collect(),
        stakes: stakes(c.stakes) as i32,
        due: c.due,
        blocked_by: c.blocked_by,
        created_at: c.created_at,
        updated_at: c.updated_at,
        created_seq: c.created_seq,
        closed: c.closed.map(closure),
    }
}

pub(crate) fn event(change: Change, c: Commitment) -> pb::CommitmentEvent {
    pb::CommitmentEvent {
        change: self::change(change) as i32,
        commitment: Some(Box::new(commitment(c))),
    }
}

pub(crate) fn record(r: Recorded) -> pb::CommitmentRecord {
    pb::CommitmentRecord {
        seq: r.seq,
        change: change(r.change) as i32,
        commitment: Some(commitment(r.commitment)),
    }
}

pub(crate) fn priority(p: Priority) -> pb::Priority {
    pb::Priority {
        id: p.id,
        score: p.score,
        reasons: p.reasons,
    }
}

fn requirement(r: Requirement) -> pb::Requirement {
    use pb::RequirementKind as K;
    match r {
        Requirement::ToolOk { tool, pattern } => pb::Requirement {
            kind: K::ToolOk as i32,
            tool,
            pattern,
            path: None,
        },
        Requirement::FileChanged { path } => pb::Requirement {
            kind: K::FileChanged as i32,
            tool: None,
            pattern: None,
            path: Some(path),
        },
        Requirement::Approval => pb::Requirement {
            kind: K::Approval as i32,
            tool: None,
            pattern: None,
            path: None,
        },
    }
}

fn closure(c: Closure) -> pb::Closure {
    pb::Closure {
        verdict: verdict(c.verdict) as i32,
        note: c.note,
        at: c.at,
    }
}

fn plan_status(s: PlanStatus) -> pb::PlanStatus {
    match s {
        PlanStatus::Pending => pb::PlanStatus::Pending,
        PlanStatus::InProgress => pb::PlanStatus::InProgress,
        PlanStatus::Done => pb::PlanStatus::Done,
        PlanStatus::Dropped => pb::PlanStatus::Dropped,
    }
}

fn stakes(s: Stakes) -> pb::Stakes {
    match s {
        Stakes::Low => pb::Stakes::Low,
        Stakes::Medium => pb::Stakes::Medium,
        Stakes::High => pb::Stakes::High,
    }
}

pub(crate) fn verdict(v: Verdict) -> pb::Verdict {
    match v {
        Verdict::Fulfilled => pb::Verdict::Fulfilled,
        Verdict::Abandoned => pb::Verdict::Abandoned,
        Verdict::Superseded => pb::Verdict::Superseded,
    }
}

/// A request's verdict; None for UNSPECIFIED or a number no verdict has.
pub(crate) fn verdict_in(n: i32) -> Option<Verdict> {
    match pb::Verdict::try_from(n).ok()? {
        pb::Verdict::Unspecified => None,
        pb::Verdict::Fulfilled => Some(Verdict::Fulfilled),
        pb::Verdict::Abandoned => Some(Verdict::Abandoned),
        pb::Verdict::Superseded => Some(Verdict::Superseded),
    }
}

fn change(c: Change) -> pb::CommitmentChange {
    match c {
        Change::Created => pb::CommitmentChange::Created,
        Change::Updated => pb::CommitmentChange::Updated,
        Change::Closed => pb::CommitmentChange::Closed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_core_value_has_the_proto_value_of_its_wire_name() {
        for s in [
            PlanStatus::Pending,
            PlanStatus::InProgress,
            PlanStatus::Done,
            PlanStatus::Dropped,
        ] {
            assert_eq!(plan_status(s).json_name(), s.as_str());
        }
        for v in [Verdict::Fulfilled, Verdict::Abandoned, Verdict::Superseded] {
            assert_eq!(verdict(v).json_name(), v.as_str());
            assert_eq!(verdict_in(verdict(v) as i32), Some(v));
        }
        assert_eq!(verdict_in(0), None);
        assert_eq!(verdict_in(99), None);
        for s in [Stakes::Low, Stakes::Medium, Stakes::High] {
            assert_eq!(stakes(s).json_name(), s.as_str());
        }
        for c in [Change::Created, Change::Updated, Change::Closed] {
            assert_eq!(change(c).json_name(), c.as_str());
        }
        let r = requirement(Requirement::FileChanged { path: "a".into() });
        assert_eq!(r.kind().json_name(), "file_changed");
    }
}
