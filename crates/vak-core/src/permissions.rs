//! Permission modes: what a tool call may do without asking, decided from the server's live mode and the tool's class.

use super::tools::ToolClass;
use crate::error::{Error, Result};

/// The server's permission mode: live state of the runtime, set at startup by
/// `--permission-mode`, changed by `SetMode` and by an approved plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PermissionMode {
    /// Read-only tools run; edits and commands ask.
    Default,
    /// Read-only tools and edits run; commands ask.
    AcceptEdits,
    /// Only read-only tools run; edits and commands are refused, and the
    /// model proposes a plan with `exit_plan_mode`.
    Plan,
    /// Nothing asks. Only when the server allows it (`--allow-bypass`).
    Bypass,
}

/// The names `--permission-mode` accepted before modes existed, kept as
/// aliases (`ask`, `allow`, `deny`).
#[allow(non_upper_case_globals)]
impl PermissionMode {
    pub const Ask: PermissionMode = PermissionMode::Default;
    pub const Allow: PermissionMode = PermissionMode::Bypass;
    pub const Deny: PermissionMode = PermissionMode::Plan;
}

/// The names the API and `--permission-mode` accept, in the order errors list them.
pub const MODES: [PermissionMode; 4] = [
    PermissionMode::Default,
    PermissionMode::AcceptEdits,
    PermissionMode::Plan,
    PermissionMode::Bypass,
];

impl PermissionMode {
    pub fn as_str(self) -> &'static str {
        match self {
            PermissionMode::Default => "default",
            PermissionMode::AcceptEdits => "accept-edits",
            PermissionMode::Plan => "plan",
            PermissionMode::Bypass => "bypass",
        }
    }

    /// A mode by its name (what `SetMode` takes); anything else is a clear error.
    pub fn parse(name: &str) -> Result<PermissionMode> {
        if name.is_empty() {
            return Err(Error::invalid(
                "mode is required: one of default, accept-edits, plan, bypass",
            ));
        }
        MODES.into_iter().find(|m| m.as_str() == name).ok_or_else(|| {
            Error::invalid(format!(
                "unknown permission mode {}: expected one of default, accept-edits, plan, bypass",
                quoted(name)
            ))
        })
    }

    /// The mode an approved plan switches to: `accept-edits` or `default`.
    pub fn parse_plan_exit(name: &str) -> Result<PermissionMode> {
        match name {
            "accept-edits" => Ok(PermissionMode::AcceptEdits),
            "default" => Ok(PermissionMode::Default),
            other => Err(Error::invalid(format!(
                "unknown mode {} for leaving plan mode: expected accept-edits or default",
                quoted(other)
            ))),
        }
    }

    /// Refuses `bypass` unless the server allows it.
    pub fn check(self, bypass_allowed: bool) -> Result<()> {
        if self == PermissionMode::Bypass && !bypass_allowed {
            return Err(Error::invalid(
                "the bypass mode lets the model run any command without asking: \
                 it needs a server started with --allow-bypass",
            ));
        }
        Ok(())
    }
}

/// At most 64 characters of a client's string, quoted.
fn quoted(s: &str) -> String {
    format!("{:?}", s.chars().take(64).collect::<String>())
}

/// What a tool call does in a mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Runs without asking.
    Run,
    /// Waits for a client's approval.
    Ask,
    /// Does not run: the model gets this as a failed result.
    Refuse(String),
}

/// What plan mode tells the model when it tries to change something.
pub(crate) const PLAN_REFUSAL: &str =
    "refused: the session is in plan mode, where only tools that read the workspace run. \
Do not change anything yet: finish looking around, then propose your plan with exit_plan_mode";

/// What exit_plan_mode answers outside plan mode.
pub(crate) const NOT_IN_PLAN_MODE: &str = "the session is not in plan mode: go ahead without exit_plan_mode";

/// What plan mode tells the model when it tries to spawn a worker.
pub(crate) const PLAN_WORKER_REFUSAL: &str =
    "refused: the session is in plan mode, where no work that changes anything starts, \
and a worker would. Propose your plan with exit_plan_mode first";

/// The permission table: read-only tools always run; spawning a worker
/// runs without asking (the child's own tools ask in the child) except in
/// `plan`, which refuses it; edits ask in
/// `default`; commands ask in `default` and `accept-edits`; `plan` refuses
/// both and asks only for `exit_plan_mode`; `bypass` asks nothing.
pub(crate) fn decide(mode: PermissionMode, class: ToolClass) -> Decision {
    use PermissionMode as M;
    use ToolClass as C;
    match (mode, class) {
        (_, C::Read | C::Track) => Decision::Run,
        (M::Plan, C::Delegate) => Decision::Refuse(PLAN_WORKER_REFUSAL.into()),
        (_, C::Delegate) => Decision::Run,
        (M::Plan, C::Plan) => Decision::Ask,
        (_, C::Plan) => Decision::Refuse(NOT_IN_PLAN_MODE.into()),
        (M::Plan, C::Edit | C::Exec) => Decision::Refuse(PLAN_REFUSAL.into()),
        (M::Bypass, _) | (M::AcceptEdits, C::Edit) => Decision::Run,
        (M::Default, _) | (M::AcceptEdits, C::Exec) => Decision::Ask,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_mode_runs_asks_or_refuses_each_class() {
        use Decision::{Ask, Run};
        use PermissionMode as M;
        let refused = |d: Decision| matches!(d, Decision::Refuse(_));
        let table = [
            (M::Default, [Run, Ask, Ask]),
            (M::AcceptEdits, [Run, Run, Ask]),
            (M::Bypass, [Run, Run, Run]),
        ];
        for (mode, [read, edit, exec]) in table {
            assert_eq!(decide(mode, ToolClass::Read), read, "{mode:?}");
            assert_eq!(decide(mode, ToolClass::Edit), edit, "{mode:?}");
            assert_eq!(decide(mode, ToolClass::Exec), exec, "{mode:?}");
            assert!(refused(decide(mode, ToolClass::Plan)), "{mode:?}");
            assert_eq!(decide(mode, ToolClass::Delegate), Run, "{mode:?}");
            assert_eq!(decide(mode, ToolClass::Track), Run, "{mode:?}");
        }
        assert_eq!(decide(M::Plan, ToolClass::Read), Run);
        assert_eq!(decide(M::Plan, ToolClass::Plan), Ask);
        assert!(refused(decide(M::Plan, ToolClass::Edit)));
        assert!(refused(decide(M::Plan, ToolClass::Exec)));
        assert!(refused(decide(M::Plan, ToolClass::Delegate)));
        assert_eq!(
            decide(M::Plan, ToolClass::Track),
            Run,
            "the plan is kept in plan mode too"
        );
    }

    #[test]
    fn names_round_trip_and_bad_ones_are_clear_errors() {
        for m in MODES {
            assert_eq!(PermissionMode::parse(m.as_str()).unwrap(), m);
        }
        let e = PermissionMode::parse("ask").unwrap_err();
        assert!(
            e.message
                .contains("expected one of default, accept-edits, plan, bypass"),
            "{e:?}"
        );
        assert!(PermissionMode::parse("")
            .unwrap_err()
            .message
            .starts_with("mode is required"));
        assert!(PermissionMode::parse_plan_exit("plan").is_err());
        assert!(PermissionMode::parse_plan_exit("bypass").is_err());
        assert_eq!(
            PermissionMode::parse_plan_exit("accept-edits").unwrap(),
            PermissionMode::AcceptEdits
        );
        assert!(PermissionMode::Bypass.check(false).is_err());
        assert!(PermissionMode::Bypass.check(true).is_ok());
        assert!(PermissionMode::Plan.check(false).is_ok());
    }
}
