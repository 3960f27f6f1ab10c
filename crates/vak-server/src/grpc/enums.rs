//! The core's closed sets as proto enums and back: the core keeps its own types (it never sees generated code), the wire names each value once in proto/.

use vak_core::background::{BackgroundReason, BackgroundSource};
use vak_core::event::{ApprovalOutcome, NoticeLevel, OutputStream, RunOutcome, StopReason};
use vak_core::host::agent_settings::Theme;
use vak_core::host::config::KeySource;
use vak_core::host::diff;
use vak_core::log::presentation::{ItemKind, ItemStatus};
use vak_core::log::transcript::Role;
use vak_core::reasons::{ResyncReason, Surface};
use vak_core::route::Source;
use vak_core::rule::RuleKind;
use vak_core::session::admission::AdmissionState;
use vak_core::tools::sandbox::SandboxMode;
use vak_core::worker::{DiscardWhy, WorkerKind, WorkerPhase, WorkerState};
use vak_core::PermissionMode;
use vak_proto::v1 as pb;

pub(crate) fn admission_state(s: AdmissionState) -> pb::AdmissionState {
    match s {
        AdmissionState::Started => pb::AdmissionState::Started,
        AdmissionState::Queued => pb::AdmissionState::Queued,
        AdmissionState::Duplicate => pb::AdmissionState::Duplicate,
        AdmissionState::Applied => pb::AdmissionState::Applied,
    }
}

pub(crate) fn run_outcome(o: RunOutcome) -> pb::RunOutcome {
    match o {
        RunOutcome::Completed => pb::RunOutcome::Completed,
        RunOutcome::Cancelled => pb::RunOutcome::Cancelled,
        RunOutcome::Failed => pb::RunOutcome::Failed,
        RunOutcome::MaxTurns => pb::RunOutcome::MaxTurns,
    }
}

pub(crate) fn stop_reason(r: StopReason) -> pb::StopReason {
    match r {
        StopReason::MaxTokens => pb::StopReason::MaxTokens,
        StopReason::Refusal => pb::StopReason::Refusal,
        StopReason::ContentFilter => pb::StopReason::ContentFilter,
    }
}

pub(crate) fn approval_outcome(o: ApprovalOutcome) -> pb::ApprovalOutcome {
    match o {
        ApprovalOutcome::Approved => pb::ApprovalOutcome::Approved,
        ApprovalOutcome::Denied => pb::ApprovalOutcome::Denied,
        ApprovalOutcome::Expired => pb::ApprovalOutcome::Expired,
    }
}

pub(crate) fn output_stream(s: OutputStream) -> pb::OutputStream {
    match s {
        OutputStream::Stdout => pb::OutputStream::Stdout,
        OutputStream::Stderr => pb::OutputStream::Stderr,
    }
}

pub(crate) fn notice_level(l: NoticeLevel) -> pb::NoticeLevel {
    match l {
        NoticeLevel::Info => pb::NoticeLevel::Info,
        NoticeLevel::Warning => pb::NoticeLevel::Warning,
    }
}

pub(crate) fn resync_reason(r: ResyncReason) -> pb::ResyncReason {
    match r {
        ResyncReason::CursorAhead => pb::ResyncReason::CursorAhead,
        ResyncReason::CursorTooOld => pb::ResyncReason::CursorTooOld,
        ResyncReason::HistoryLost => pb::ResyncReason::HistoryLost,
        ResyncReason::HistoryUnavailable => pb::ResyncReason::HistoryUnavailable,
    }
}

pub(crate) fn role(r: Role) -> pb::MessageRole {
    match r {
        Role::User => pb::MessageRole::User,
        Role::Assistant => pb::MessageRole::Assistant,
        Role::Tool => pb::MessageRole::Tool,
        Role::Run => pb::MessageRole::Run,
        Role::Background => pb::MessageRole::Background,
    }
}

pub(crate) fn worker_kind(k: WorkerKind) -> pb::WorkerKind {
    match k {
        WorkerKind::Worker => pb::WorkerKind::Worker,
        WorkerKind::Candidate => pb::WorkerKind::Candidate,
    }
}

pub(crate) fn worker_state(s: WorkerState) -> pb::WorkerState {
    match s {
        WorkerState::Running => pb::WorkerState::Running,
        WorkerState::Idle => pb::WorkerState::Idle,
        WorkerState::Finished => pb::WorkerState::Finished,
        WorkerState::Failed => pb::WorkerState::Failed,
        WorkerState::Cancelled => pb::WorkerState::Cancelled,
    }
}

pub(crate) fn worker_phase(p: WorkerPhase) -> pb::WorkerPhase {
    match p {
        WorkerPhase::Spawned => pb::WorkerPhase::Spawned,
        WorkerPhase::State => pb::WorkerPhase::State,
        WorkerPhase::Finished => pb::WorkerPhase::Finished,
    }
}

pub(crate) fn discard_reason(w: DiscardWhy) -> pb::DiscardReason {
    match w {
        DiscardWhy::Discarded => pb::DiscardReason::Discarded,
        DiscardWhy::KeptOther => pb::DiscardReason::KeptOther,
    }
}

pub(crate) fn background_source(s: BackgroundSource) -> pb::BackgroundSource {
    match s {
        BackgroundSource::Task => pb::BackgroundSource::Task,
        BackgroundSource::Script => pb::BackgroundSource::Script,
        BackgroundSource::Budget => pb::BackgroundSource::Budget,
        BackgroundSource::Worker => pb::BackgroundSource::Worker,
    }
}

pub(crate) fn background_reason(r: Option<BackgroundReason>) -> pb::BackgroundReason {
    match r {
        None => pb::BackgroundReason::Unspecified,
        Some(BackgroundReason::ScriptFailed) => pb::BackgroundReason::ScriptFailed,
        Some(BackgroundReason::ScriptTimeout) => pb::BackgroundReason::ScriptTimeout,
        Some(BackgroundReason::Budget80) => pb::BackgroundReason::Budget80,
        Some(BackgroundReason::Budget100) => pb::BackgroundReason::Budget100,
    }
}

pub(crate) fn surface(s: Surface) -> pb::Surface {
    match s {
        Surface::Sse => pb::Surface::Sse,
        Surface::Grpc => pb::Surface::Grpc,
        Surface::Stream => pb::Surface::Stream,
    }
}

pub(crate) fn sandbox_mode(m: SandboxMode) -> pb::SandboxMode {
    match m {
        SandboxMode::WorkspaceWrite => pb::SandboxMode::WorkspaceWrite,
        SandboxMode::ReadOnly => pb::SandboxMode::ReadOnly,
        SandboxMode::Off => pb::SandboxMode::Off,
    }
}

pub(crate) fn permission_mode(m: PermissionMode) -> pb::PermissionMode {
    match m {
        PermissionMode::Default => pb::PermissionMode::Default,
        PermissionMode::AcceptEdits => pb::PermissionMode::AcceptEdits,
        PermissionMode::Plan => pb::PermissionMode::Plan,
        PermissionMode::Bypass => pb::PermissionMode::Bypass,
    }
}

/// The mode a SetMode names. UNSPECIFIED and numbers no mode has are
/// refused by the core's parser, so the error reads as it always has.
pub(crate) fn permission_mode_in(n: i32) -> vak_core::Result<PermissionMode> {
    match pb::PermissionMode::try_from(n) {
        Ok(pb::PermissionMode::Default) => Ok(PermissionMode::Default),
        Ok(pb::PermissionMode::AcceptEdits) => Ok(PermissionMode::AcceptEdits),
        Ok(pb::PermissionMode::Plan) => Ok(PermissionMode::Plan),
        Ok(pb::PermissionMode::Bypass) => Ok(PermissionMode::Bypass),
        Ok(pb::PermissionMode::Unspecified) => PermissionMode::parse(""),
        Err(_) => PermissionMode::parse(&n.to_string()),
    }
}

/// The mode an approved plan leaves plan mode for (ApproveRequest.mode).
pub(crate) fn plan_exit_mode_in(n: i32) -> vak_core::Result<PermissionMode> {
    match pb::PlanExitMode::try_from(n) {
        Ok(pb::PlanExitMode::AcceptEdits) => Ok(PermissionMode::AcceptEdits),
        Ok(pb::PlanExitMode::Default) => Ok(PermissionMode::Default),
        Ok(pb::PlanExitMode::Unspecified) => PermissionMode::parse_plan_exit(""),
        Err(_) => PermissionMode::parse_plan_exit(&n.to_string()),
    }
}

pub(crate) fn route_source(s: Source) -> pb::RouteSource {
    match s {
        Source::Flag => pb::RouteSource::Flag,
        Source::Env => pb::RouteSource::Env,
        Source::File => pb::RouteSource::File,
        Source::Api => pb::RouteSource::Api,
        Source::Default => pb::RouteSource::Default,
    }
}

pub(crate) fn theme(t: Theme) -> pb::Theme {
    match t {
        Theme::Light => pb::Theme::Light,
        Theme::Dark => pb::Theme::Dark,
        Theme::System => pb::Theme::System,
    }
}

/// UpdateConfigRequest.theme; UNSPECIFIED or an unknown number is refused naming the field.
pub(crate) fn theme_in(n: i32) -> vak_core::Result<Theme> {
    match pb::Theme::try_from(n) {
        Ok(pb::Theme::Light) => Ok(Theme::Light),
        Ok(pb::Theme::Dark) => Ok(Theme::Dark),
        Ok(pb::Theme::System) => Ok(Theme::System),
        _ => Err(vak_core::Error::invalid(
            "theme: expected one of light, dark, system",
        )),
    }
}

pub(crate) fn rule_kind(k: RuleKind) -> pb::RuleKind {
    match k {
        RuleKind::Prefix => pb::RuleKind::Prefix,
        RuleKind::Exact => pb::RuleKind::Exact,
        RuleKind::Path => pb::RuleKind::Path,
        RuleKind::Tool => pb::RuleKind::Tool,
    }
}

pub(crate) fn mcp_state(s: vak_core::mcp::McpState) -> pb::McpServerState {
    use vak_core::mcp::McpState;
    match s {
        McpState::Starting => pb::McpServerState::Starting,
        McpState::Ready => pb::McpServerState::Ready,
        McpState::Failed => pb::McpServerState::Failed,
        McpState::Disabled => pb::McpServerState::Disabled,
    }
}

pub(crate) fn key_source(s: KeySource) -> pb::KeySource {
    match s {
        KeySource::Env => pb::KeySource::Env,
        KeySource::Store => pb::KeySource::Store,
    }
}

pub(crate) fn item_kind(k: ItemKind) -> pb::ItemKind {
    match k {
        ItemKind::UserInput => pb::ItemKind::UserInput,
        ItemKind::AssistantText => pb::ItemKind::AssistantText,
        ItemKind::Thinking => pb::ItemKind::Thinking,
        ItemKind::ToolCall => pb::ItemKind::ToolCall,
        ItemKind::Approval => pb::ItemKind::Approval,
        ItemKind::FinalResult => pb::ItemKind::FinalResult,
        ItemKind::Background => pb::ItemKind::Background,
        ItemKind::PlanItem => pb::ItemKind::PlanItem,
    }
}

pub(crate) fn item_status(s: ItemStatus) -> pb::ItemStatus {
    match s {
        ItemStatus::Streaming => pb::ItemStatus::Streaming,
        ItemStatus::Running => pb::ItemStatus::Running,
        ItemStatus::Pending => pb::ItemStatus::Pending,
        ItemStatus::Completed => pb::ItemStatus::Completed,
        ItemStatus::Failed => pb::ItemStatus::Failed,
        ItemStatus::Cancelled => pb::ItemStatus::Cancelled,
        ItemStatus::MaxTurns => pb::ItemStatus::MaxTurns,
        ItemStatus::Interrupted => pb::ItemStatus::Interrupted,
        ItemStatus::Approved => pb::ItemStatus::Approved,
        ItemStatus::Denied => pb::ItemStatus::Denied,
        ItemStatus::Expired => pb::ItemStatus::Expired,
    }
}

pub(crate) fn diff_reason(r: Option<diff::Reason>) -> pb::DiffReason {
    match r {
        None => pb::DiffReason::Unspecified,
        Some(diff::Reason::NotAGitRepo) => pb::DiffReason::NotAGitRepo,
        Some(diff::Reason::GitUnavailable) => pb::DiffReason::GitUnavailable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Every core value's proto value has the core's wire string as its JSON
    /// name, and the proto enum has no other value but UNSPECIFIED ("").
    fn same_names<C: Copy>(
        full_name: &str,
        all: &[C],
        as_str: fn(C) -> String,
        json_name: fn(C) -> &'static str,
    ) {
        for &c in all {
            assert_eq!(json_name(c), as_str(c), "{full_name}");
        }
        let core: BTreeSet<String> = all.iter().map(|&c| as_str(c)).collect();
        let (_, values) = pb::JSON_NAMES
            .iter()
            .find(|(n, _)| *n == full_name)
            .unwrap_or_else(|| panic!("{full_name} is a vak enum"));
        let wire: BTreeSet<String> = values
            .iter()
            .map(|(_, j)| j.to_string())
            .filter(|j| !j.is_empty())
            .collect();
        assert_eq!(
            wire, core,
            "{full_name}: the proto enum and the core's set differ"
        );
    }

    #[test]
    fn every_core_value_maps_to_the_proto_value_of_its_json_name() {
        use AdmissionState as A;
        same_names(
            "vak.v1.AdmissionState",
            &[A::Started, A::Queued, A::Duplicate, A::Applied],
            |c| c.as_str().into(),
            |c| admission_state(c).json_name(),
        );
        same_names(
            "vak.v1.Theme",
            &[Theme::Light, Theme::Dark, Theme::System],
            |c| c.as_str().into(),
            |c| theme(c).json_name(),
        );
        use RunOutcome as R;
        same_names(
            "vak.v1.RunOutcome",
            &[R::Completed, R::Cancelled, R::Failed, R::MaxTurns],
            |c| c.as_str().into(),
            |c| run_outcome(c).json_name(),
        );
        use StopReason as Sr;
        same_names(
            "vak.v1.StopReason",
            &[Sr::MaxTokens, Sr::Refusal, Sr::ContentFilter],
            |c| c.as_str().into(),
            |c| stop_reason(c).json_name(),
        );
        use ApprovalOutcome as Ap;
        same_names(
            "vak.v1.ApprovalOutcome",
            &[Ap::Approved, Ap::Denied, Ap::Expired],
            |c| c.as_str().into(),
            |c| approval_outcome(c).json_name(),
        );
        same_names(
            "vak.v1.OutputStream",
            &[OutputStream::Stdout, OutputStream::Stderr],
            |c| c.as_str().into(),
            |c| output_stream(c).json_name(),
        );
        use WorkerState as Ws;
        same_names(
            "vak.v1.WorkerState",
            &[Ws::Running, Ws::Idle, Ws::Finished, Ws::Failed, Ws::Cancelled],
            |c| c.as_str().into(),
            |c| worker_state(c).json_name(),
        );
        same_names(
            "vak.v1.WorkerKind",
            &[WorkerKind::Worker, WorkerKind::Candidate],
            |c| c.as_str().into(),
            |c| worker_kind(c).json_name(),
        );
        same_names(
            "vak.v1.WorkerPhase",
            &[WorkerPhase::Spawned, WorkerPhase::State, WorkerPhase::Finished],
            |c| c.as_str().into(),
            |c| worker_phase(c).json_name(),
        );
        same_names(
            "vak.v1.DiscardReason",
            &[DiscardWhy::Discarded, DiscardWhy::KeptOther],
            |c| c.as_str().into(),
            |c| discard_reason(c).json_name(),
        );
        same_names(
            "vak.v1.NoticeLevel",
            &[NoticeLevel::Info, NoticeLevel::Warning],
            |c| c.as_str().into(),
            |c| notice_level(c).json_name(),
        );
        use ResyncReason as Rr;
        same_names(
            "vak.v1.ResyncReason",
            &[
                Rr::CursorAhead,
                Rr::CursorTooOld,
                Rr::HistoryLost,
                Rr::HistoryUnavailable,
            ],
            |c| c.as_str().into(),
            |c| resync_reason(c).json_name(),
        );
        same_names(
            "vak.v1.MessageRole",
            &[
                Role::User,
                Role::Assistant,
                Role::Tool,
                Role::Run,
                Role::Background,
            ],
            |c| c.as_str().into(),
            |c| role(c).json_name(),
        );
        same_names(
            "vak.v1.Surface",
            &[Surface::Sse, Surface::Grpc, Surface::Stream],
            |c| c.as_str().into(),
            |c| surface(c).json_name(),
        );
        use SandboxMode as S;
        same_names(
            "vak.v1.SandboxMode",
            &[S::WorkspaceWrite, S::ReadOnly, S::Off],
            |c| c.as_str().into(),
            |c| sandbox_mode(c).json_name(),
        );
        same_names(
            "vak.v1.PermissionMode",
            &vak_core::permissions::MODES,
            |c| c.as_str().into(),
            |c| permission_mode(c).json_name(),
        );
        same_names(
            "vak.v1.RouteSource",
            &[
                Source::Flag,
                Source::Env,
                Source::File,
                Source::Api,
                Source::Default,
            ],
            |c| c.as_str().into(),
            |c| route_source(c).json_name(),
        );
        same_names(
            "vak.v1.RuleKind",
            &[RuleKind::Prefix, RuleKind::Exact, RuleKind::Path, RuleKind::Tool],
            |c| c.as_str().into(),
            |c| rule_kind(c).json_name(),
        );
        use vak_core::mcp::McpState;
        same_names(
            "vak.v1.McpServerState",
            &[
                McpState::Starting,
                McpState::Ready,
                McpState::Failed,
                McpState::Disabled,
            ],
            |c| c.as_str().into(),
            |c| mcp_state(c).json_name(),
        );
        same_names(
            "vak.v1.KeySource",
            &[KeySource::Env, KeySource::Store],
            |c| c.as_str().into(),
            |c| key_source(c).json_name(),
        );
        use BackgroundSource as B;
        same_names(
            "vak.v1.BackgroundSource",
            &[B::Task, B::Script, B::Budget, B::Worker],
            |c| c.as_str().into(),
            |c| background_source(c).json_name(),
        );
        use BackgroundReason as Br;
        same_names(
            "vak.v1.BackgroundReason",
            &[Br::ScriptFailed, Br::ScriptTimeout, Br::Budget80, Br::Budget100],
            |c| c.as_str().into(),
            |c| background_reason(Some(c)).json_name(),
        );
        use ItemKind as K;
        same_names(
            "vak.v1.ItemKind",
            &[
                K::UserInput,
                K::AssistantText,
                K::Thinking,
                K::ToolCall,
                K::Approval,
                K::FinalResult,
                K::Background,
                K::PlanItem,
            ],
            |c| c.as_str().into(),
            |c| item_kind(c).json_name(),
        );
        use ItemStatus as I;
        same_names(
            "vak.v1.ItemStatus",
            &[
                I::Streaming,
                I::Running,
                I::Pending,
                I::Completed,
                I::Failed,
                I::Cancelled,
                I::MaxTurns,
                I::Interrupted,
                I::Approved,
                I::Denied,
                I::Expired,
            ],
            |c| c.as_str().into(),
            |c| item_status(c).json_name(),
        );
        same_names(
            "vak.v1.DiffReason",
            &[diff::Reason::NotAGitRepo, diff::Reason::GitUnavailable],
            |c| c.as_str().into(),
            |c| diff_reason(Some(c)).json_name(),
        );
    }

    #[test]
    fn modes_a_request_names_come_back_as_the_core_mode() {
        for m in vak_core::permissions::MODES {
            assert_eq!(permission_mode_in(permission_mode(m) as i32).unwrap(), m);
        }
        let e = permission_mode_in(0).unwrap_err().to_string();
        assert!(e.contains("mode is required"), "{e}");
        let e = permission_mode_in(99).unwrap_err().to_string();
        assert!(e.contains("unknown permission mode \"99\""), "{e}");
        assert_eq!(
            plan_exit_mode_in(pb::PlanExitMode::AcceptEdits as i32).unwrap(),
            PermissionMode::AcceptEdits
        );
        assert_eq!(
            plan_exit_mode_in(pb::PlanExitMode::Default as i32).unwrap(),
            PermissionMode::Default
        );
        assert!(plan_exit_mode_in(0).is_err());
        assert!(plan_exit_mode_in(7).is_err());
    }
}
