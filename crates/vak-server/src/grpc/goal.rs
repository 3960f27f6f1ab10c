//! The goal of a turn chain between core and wire: a goal update and the goal state.

use vak_core::goal::{Control, GoalState, GoalUpdate, Relation};
use vak_proto::v1 as pb;

fn relation(r: Relation) -> pb::GoalRelation {
    match r {
        Relation::Add => pb::GoalRelation::Add,
        Relation::Correct => pb::GoalRelation::Correct,
        Relation::Replace => pb::GoalRelation::Replace,
        Relation::Pause => pb::GoalRelation::Pause,
        Relation::Resume => pb::GoalRelation::Resume,
        Relation::Reprioritise => pb::GoalRelation::Reprioritise,
        Relation::Cancel => pb::GoalRelation::Cancel,
    }
}

fn control(c: Control) -> pb::GoalControl {
    match c {
        Control::Running => pb::GoalControl::Running,
        Control::Paused => pb::GoalControl::Paused,
        Control::Cancelled => pb::GoalControl::Cancelled,
        Control::Done => pb::GoalControl::Done,
    }
}

pub(crate) fn update(u: GoalUpdate) -> pb::GoalUpdate {
    pb::GoalUpdate {
        relation: relation(u.relation) as i32,
        text: u.text,
        signals: u.signals,
        request_id: u.request_id,
        widens_permissions: u.widens_permissions,
        at_seq: u.at_seq,
    }
}

pub(crate) fn state(g: GoalState) -> pb::GoalState {
    pb::GoalState {
        objective: g.objective,
        additions: g.additions,
        superseded: g.superseded,
        control: control(g.control) as i32,
        updates: g.updates.into_iter().map(update).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_core_value_has_the_proto_value_of_its_wire_name() {
        use Relation as R;
        for r in [
            R::Add,
            R::Correct,
            R::Replace,
            R::Pause,
            R::Resume,
            R::Reprioritise,
            R::Cancel,
        ] {
            assert_eq!(relation(r).json_name(), r.as_str());
        }
        for c in [
            Control::Running,
            Control::Paused,
            Control::Cancelled,
            Control::Done,
        ] {
            assert_eq!(control(c).json_name(), c.as_str());
        }
    }
}
