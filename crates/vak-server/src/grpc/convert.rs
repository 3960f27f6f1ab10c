//! Every conversion between core types and wire (proto) types, in one place.

use super::enums;
use pb::event::Kind;
use prost_types::value::Kind as Pv;
use serde_json::Value;
use vak_core::event::{ClientEvent, Frame, SideOutcome, SidePhase};
use vak_core::host::agent_settings::{self, SettingsPatch};
use vak_core::host::control::{ConfigInfo, ModeChange};
use vak_core::host::hooks::{HookEvent, HookSpec, HookSpecs, Hooks};
use vak_core::host::rules::Rule;
use vak_core::log::presentation::{Item, PresentationEvent, Timeline};
use vak_core::log::transcript::{self, Role, Transcript};
use vak_core::provider::TokenUsage;
use vak_core::reasons::{CloseReason, ResyncReason};
use vak_core::session::admission::{Admission, CancelResult};
use vak_core::session::attachments::AttachmentRef;
use vak_core::session::live::Client;
use vak_core::session::live::SessionInfo;
use vak_core::session::side::SideEntry;
use vak_core::stream::mux::{MuxFrame, MuxItem};
use vak_proto::v1 as pb;

pub(crate) fn json_to_value(v: &Value) -> prost_types::Value {
    let kind = match v {
        Value::Null => Pv::NullValue(0),
        Value::Bool(b) => Pv::BoolValue(*b),
        Value::Number(n) => Pv::NumberValue(n.as_f64().unwrap_or(0.0)),
        Value::String(s) => Pv::StringValue(s.clone()),
        Value::Array(a) => Pv::ListValue(prost_types::ListValue {
            values: a.iter().map(json_to_value).collect(),
        }),
        Value::Object(_) => Pv::StructValue(json_to_struct(v)),
    };
    prost_types::Value { kind: Some(kind) }
}

/// A JSON object as a Struct; any other value is wrapped as `{"value": v}`.
pub(crate) fn json_to_struct(v: &Value) -> prost_types::Struct {
    match v {
        Value::Object(map) => prost_types::Struct {
            fields: map.iter().map(|(k, v)| (k.clone(), json_to_value(v))).collect(),
        },
        other => prost_types::Struct {
            fields: [("value".to_string(), json_to_value(other))]
                .into_iter()
                .collect(),
        },
    }
}

pub(crate) fn kind(event: &ClientEvent) -> Kind {
    match event.clone() {
        ClientEvent::UserMessage {
            text,
            request_id,
            attachments,
        } => Kind::UserMessage(pb::UserMessage {
            text,
            request_id,
            attachments: attachments.into_iter().map(attachment_ref).collect(),
        }),
        ClientEvent::TurnStarted { request_id } => Kind::TurnStarted(pb::TurnStarted { request_id }),
        ClientEvent::TextDelta { text } => Kind::TextDelta(pb::TextDelta { text }),
        ClientEvent::ThinkingDelta { text } => Kind::ThinkingDelta(pb::ThinkingDelta { text }),
        ClientEvent::ToolCall { call_id, tool, input } => Kind::ToolCall(pb::ToolCall {
            call_id,
            tool,
            input: Some(json_to_struct(&input)),
        }),
        ClientEvent::ToolResult { call_id, ok, output } => {
            Kind::ToolResult(pb::ToolResult { call_id, ok, output })
        }
        ClientEvent::ToolOutput {
            call_id,
            stream,
            text,
        } => Kind::ToolOutput(pb::ToolOutput {
            call_id,
            stream: enums::output_stream(stream) as i32,
            text,
        }),
        ClientEvent::ApprovalRequested {
            request_id,
            tool,
            reason,
            input,
            call_id,
        } => Kind::ApprovalRequested(pb::ApprovalRequested {
            request_id,
            tool,
            reason,
            input: Some(json_to_struct(&input)),
            call_id,
        }),
        ClientEvent::ApprovalResolved {
            request_id,
            outcome,
            reason,
        } => Kind::ApprovalResolved(pb::ApprovalResolved {
            request_id,
            outcome: enums::approval_outcome(outcome) as i32,
            reason,
        }),
        ClientEvent::Status { busy, retrying } => Kind::Status(pb::Status {
            busy,
            retrying: retrying.map(|r| pb::Retrying {
                attempt: r.attempt,
                of: r.of,
                reason: r.reason,
            }),
        }),
        ClientEvent::RunFinished {
            outcome,
            message,
            stop_reason,
        } => Kind::RunFinished(pb::RunFinished {
            outcome: enums::run_outcome(outcome) as i32,
            message,
            stop_reason: stop_reason.map(|r| enums::stop_reason(r) as i32),
        }),
        ClientEvent::Notice { level, text } => Kind::Notice(pb::Notice {
            level: enums::notice_level(level) as i32,
            text,
        }),
        ClientEvent::Side { side_id, phase } => Kind::Side(pb::Side {
            side_id,
            phase: Some(side_phase(phase)),
        }),
        ClientEvent::BackgroundResult {
            result, summarised, ..
        } => Kind::BackgroundResult(background_result(result, summarised)),
        ClientEvent::Worker { phase, worker: w } => Kind::Worker(pb::WorkerEvent {
            phase: enums::worker_phase(phase) as i32,
            worker: Some(Box::new(worker(*w))),
        }),
        ClientEvent::Workbench {
            bestofn_id,
            candidate,
        } => Kind::Workbench(pb::Workbench {
            bestofn_id,
            candidate: Some(Box::new(worker(*candidate))),
        }),
        ClientEvent::DraftDiscarded {
            candidate,
            branch,
            why,
        } => Kind::DraftDiscarded(pb::DraftDiscarded {
            candidate,
            branch,
            why: enums::discard_reason(why) as i32,
        }),
        ClientEvent::LaunchOutput { name, stream, text } => Kind::LaunchOutput(pb::LaunchOutput {
            name,
            stream: enums::output_stream(stream) as i32,
            text,
        }),
        ClientEvent::GoalUpdate { update } => Kind::GoalUpdate(pb::GoalUpdateEvent {
            update: Some(Box::new(super::goal::update(*update))),
        }),
        ClientEvent::Commitment { change, commitment } => {
            Kind::Commitment(super::commitments::event(change, *commitment))
        }
    }
}

/// A child session as the wire carries it.
pub(crate) fn worker(w: vak_core::worker::WorkerInfo) -> pb::Worker {
    pb::Worker {
        id: w.id,
        parent_id: w.parent_id,
        kind: enums::worker_kind(w.kind) as i32,
        prompt: w.prompt,
        state: enums::worker_state(w.state) as i32,
        branch: w.branch,
        worktree: w.worktree,
        started_at: w.started_at,
        summary: w.summary,
        diff_stat: w.diff_stat.map(|d| pb::DiffStat {
            files: d.files,
            insertions: d.insertions,
            deletions: d.deletions,
        }),
        bestofn_id: w.bestofn_id,
    }
}

pub(crate) fn background_result(
    r: vak_core::background::BackgroundResult,
    summarised: u32,
) -> pb::BackgroundResult {
    pb::BackgroundResult {
        source: enums::background_source(r.source) as i32,
        alert: r.alert(),
        reason: enums::background_reason(r.reason) as i32,
        id: r.id,
        text: r.text,
        result_id: r.result_id,
        arrived_at: r.arrived_at,
        summarised,
    }
}

fn attachment_ref(a: AttachmentRef) -> pb::AttachmentRef {
    pb::AttachmentRef {
        sha256: a.sha256,
        media_type: a.media_type,
        name: a.name,
        size: a.size,
    }
}

fn side_phase(phase: SidePhase) -> pb::side::Phase {
    use pb::side::Phase;
    match phase {
        SidePhase::Started { question, branch_seq } => {
            Phase::Started(pb::SideStarted { question, branch_seq })
        }
        SidePhase::TextDelta { text } => Phase::TextDelta(pb::TextDelta { text }),
        SidePhase::Finished {
            outcome,
            message,
            usage: u,
        } => Phase::Finished(pb::SideFinished {
            outcome: side_outcome(Some(outcome)) as i32,
            message,
            usage: Some(usage(u)),
        }),
    }
}

pub(crate) fn side_outcome(o: Option<SideOutcome>) -> pb::SideOutcome {
    match o {
        None => pb::SideOutcome::Unspecified,
        Some(SideOutcome::Completed) => pb::SideOutcome::Completed,
        Some(SideOutcome::Cancelled) => pb::SideOutcome::Cancelled,
        Some(SideOutcome::Failed) => pb::SideOutcome::Failed,
    }
}

pub(crate) fn side_entry(e: SideEntry) -> pb::SideEntry {
    pb::SideEntry {
        side_id: e.side_id,
        question: e.question,
        branch_seq: e.branch_seq,
        seq: e.seq,
        answer: e.answer,
        outcome: side_outcome(e.outcome) as i32,
        message: e.message,
    }
}

pub(crate) fn frame(f: &Frame) -> pb::Event {
    pb::Event {
        seq: f.seq,
        session_id: f.session_id.to_string(),
        kind: Some(kind(&f.event)),
    }
}

/// A stream-level frame: seq 0, so it never moves a cursor.
fn stream_frame(session_id: &str, kind: Kind) -> pb::Event {
    pb::Event {
        seq: 0,
        session_id: session_id.to_string(),
        kind: Some(kind),
    }
}

pub(crate) fn stream_opened(session_id: &str, latest_seq: u64) -> pb::Event {
    stream_frame(
        session_id,
        Kind::StreamOpened(pb::StreamOpened {
            session_id: session_id.to_string(),
            latest_seq,
            ..Default::default()
        }),
    )
}

pub(crate) fn resync(
    session_id: &str,
    reason: ResyncReason,
    latest_seq: u64,
    lost: Option<(u64, u64)>,
) -> pb::Event {
    let (from, to) = lost.unwrap_or_default();
    stream_frame(
        session_id,
        Kind::Resync(pb::Resync {
            reason: enums::resync_reason(reason) as i32,
            latest_seq,
            from,
            to,
        }),
    )
}

pub(crate) fn session_closed(session_id: &str, reason: CloseReason) -> pb::Event {
    let reason = reason.as_str().into_owned();
    stream_frame(session_id, Kind::SessionClosed(pb::SessionClosed { reason }))
}

pub(crate) fn summary(s: SessionInfo) -> pb::SessionSummary {
    pb::SessionSummary {
        session_id: s.session_id,
        created_at: s.created_at,
        title: s.title,
        latest_seq: s.latest_seq,
        loaded: s.loaded,
        busy: s.busy,
        usage: Some(usage(s.usage)),
        workspace: s.workspace,
    }
}

pub(crate) fn admission(a: Admission) -> pb::Admission {
    pb::Admission {
        request_id: a.request_id,
        state: enums::admission_state(a.state) as i32,
        after_seq: a.after_seq,
        result: None,
    }
}

pub(crate) fn cancel(c: CancelResult) -> pb::CancelResponse {
    pb::CancelResponse {
        cancelled: c.cancelled,
        discarded: c.discarded,
    }
}

/// One transcript entry with only its role's fields present (see proto `Message`).
fn message(m: transcript::Message) -> pb::Message {
    let mut out = pb::Message {
        role: enums::role(m.role) as i32,
        text: m.text,
        seq: m.seq,
        ..Default::default()
    };
    match m.role {
        Role::User if m.attachments.is_empty() => {}
        Role::User => {
            out.attachments = Some(pb::Attachments {
                items: m.attachments.into_iter().map(attachment_ref).collect(),
            })
        }
        Role::Assistant => {
            out.thinking = (!m.thinking.is_empty()).then_some(m.thinking);
            out.interrupted = m.interrupted.then_some(true);
        }
        Role::Tool => {
            out.call_id = Some(m.call_id);
            out.tool = Some(m.tool);
            out.input = (!m.input.is_null()).then(|| json_to_struct(&m.input));
            out.ok = Some(m.ok);
        }
        Role::Run => {
            out.outcome = m.outcome.map(|o| enums::run_outcome(o) as i32);
            out.stop_reason = m.stop_reason.map(|r| enums::stop_reason(r) as i32);
        }
        Role::Background => out.background = m.background.map(|b| background_result(b, 0)),
    }
    out
}

fn usage(u: TokenUsage) -> pb::Usage {
    pb::Usage {
        input_tokens: u.input_tokens,
        output_tokens: u.output_tokens,
        cache_read_tokens: u.cache_read_tokens,
        cache_write_tokens: u.cache_write_tokens,
    }
}

pub(crate) fn transcript(session_id: &str, t: Transcript) -> pb::Transcript {
    pb::Transcript {
        session_id: session_id.to_string(),
        seq: t.seq,
        messages: t.messages.into_iter().map(message).collect(),
        usage: Some(usage(t.usage)),
        turns: t
            .turns
            .into_iter()
            .map(|(seq, u)| pb::TurnUsage {
                seq,
                usage: Some(usage(u)),
            })
            .collect(),
    }
}

pub(crate) fn timeline(t: &Timeline) -> pb::OutputTimeline {
    pb::OutputTimeline {
        schema_version: t.schema_version,
        session_id: t.session_id.clone(),
        seq: t.seq,
        items: t.items.iter().map(item).collect(),
        goal: t.goal.clone().map(|g| Box::new(super::goal::state(g))),
    }
}

pub(crate) fn item(i: &Item) -> pb::TimelineItem {
    pb::TimelineItem {
        id: i.id.clone(),
        kind: enums::item_kind(i.kind) as i32,
        status: enums::item_status(i.status) as i32,
        text: i.text.clone(),
        seq: i.seq,
        tool: i.tool.clone(),
        call_id: i.call_id.clone(),
        input: (!i.input.is_null()).then(|| json_to_struct(&i.input)),
        request_id: i.request_id.clone(),
        commitment: i
            .commitment
            .as_ref()
            .map(|c| Box::new(super::commitments::commitment((**c).clone()))),
    }
}

pub(crate) fn presentation(session_id: &str, e: &PresentationEvent) -> pb::PresentationEvent {
    use pb::presentation_event::Kind as P;
    let kind = match e {
        PresentationEvent::Snapshot(t) => P::Snapshot(timeline(t)),
        PresentationEvent::ItemStarted(i) => P::ItemStarted(item(i)),
        PresentationEvent::TextDelta { item_id, text, .. } => P::TextDelta(pb::PresentationTextDelta {
            item_id: item_id.clone(),
            text: text.clone(),
        }),
        PresentationEvent::ItemReplaced(i) => P::ItemReplaced(item(i)),
        PresentationEvent::ItemCompleted { item_id, status, .. } => P::ItemCompleted(pb::ItemCompleted {
            item_id: item_id.clone(),
            status: enums::item_status(*status) as i32,
        }),
        PresentationEvent::Goal { goal, .. } => P::Goal(Box::new(super::goal::state(goal.clone()))),
    };
    pb::PresentationEvent {
        seq: e.seq(),
        session_id: session_id.to_string(),
        kind: Some(kind),
    }
}

fn client(c: &Client) -> pb::Client {
    pb::Client {
        client_id: c.client_id.clone(),
        surface: enums::surface(c.surface) as i32,
        attached_at: c.attached_at.clone(),
    }
}

/// The console's view of one live session and who is attached to it.
pub(crate) fn presence(s: SessionInfo, clients: &[Client]) -> pb::SessionPresence {
    pb::SessionPresence {
        session_id: s.session_id,
        busy: s.busy,
        latest_seq: s.latest_seq,
        clients: clients.iter().map(client).collect(),
    }
}

pub(crate) fn recent_error(e: crate::recent_errors::RecentError) -> pb::RecentError {
    pb::RecentError {
        at: e.at,
        method: e.method,
        path: e.path,
        status: e.status.into(),
        grpc_status: e.grpc_status.map(u32::from),
        message: e.message,
    }
}

pub(crate) fn rule(r: Rule) -> pb::PermissionRule {
    pb::PermissionRule {
        id: r.id,
        tool: r.what.tool,
        kind: enums::rule_kind(r.what.kind) as i32,
        pattern: r.what.pattern,
        created_at: r.created_at,
    }
}

/// The MCP servers as GetMcpConfig answers them.
pub(crate) fn mcp_config(servers: Vec<vak_core::mcp::ServerStatus>) -> pb::McpConfig {
    pb::McpConfig {
        servers: servers
            .into_iter()
            .map(|s| {
                let d = s.def;
                let server = pb::McpServer {
                    enabled: Some(d.enabled),
                    timeout_ms: d.timeout_ms,
                    command: d.command,
                    args: d.args,
                    env: d.env.into_iter().collect(),
                    cwd: d.cwd,
                    url: d.url,
                    headers: d.headers.into_iter().collect(),
                    state: enums::mcp_state(s.state) as i32,
                    tool_count: s.tools.len() as u32,
                    tools: s.tools,
                    pid: s.pid,
                    restarts: s.restarts,
                    last_error: s.last_error,
                };
                (s.name, server)
            })
            .collect(),
    }
}

/// A PutMcpConfig request's definitions (the output-only fields ignored).
pub(crate) fn mcp_defs(
    servers: std::collections::HashMap<String, pb::McpServer>,
) -> vak_core::mcp::config::ServerDefs {
    servers
        .into_iter()
        .map(|(name, s)| {
            let def = vak_core::mcp::config::ServerDef {
                enabled: s.enabled.unwrap_or(true),
                timeout_ms: s.timeout_ms,
                command: s.command,
                args: s.args,
                env: s.env.into_iter().collect(),
                cwd: s.cwd,
                url: s.url,
                headers: s.headers.into_iter().collect(),
            };
            (name, def)
        })
        .collect()
}

pub(crate) fn mode_change(m: ModeChange) -> pb::SetModeResponse {
    pb::SetModeResponse {
        config: Some(config(m.config)),
        changed: m.changed,
        cancelled_runs: m.cancelled_runs as u32,
        denied_approvals: m.denied_approvals as u32,
    }
}

pub(crate) fn config(c: ConfigInfo) -> pb::ConfigInfo {
    pb::ConfigInfo {
        // The core hands the live mode over by its name.
        permission_mode: vak_core::PermissionMode::parse(&c.permission_mode)
            .map(enums::permission_mode)
            .unwrap_or_default() as i32,
        ring: c.ring,
        route: Some(pb::ModelRoute {
            provider: c.route.provider.as_str().to_string(),
            model: c.route.model,
            base_url: c.route.base_url,
            source: enums::route_source(c.route.source) as i32,
            label: c.route.provider.label().to_string(),
        }),
        revision: c.revision,
        max_turns: c.settings.max_turns,
        max_turns_source: enums::route_source(c.settings.max_turns_source) as i32,
        theme: enums::theme(c.settings.theme) as i32,
        theme_source: enums::route_source(c.settings.theme_source) as i32,
        hooks: Some(hooks(&c.settings.hooks.specs())),
        hooks_source: enums::route_source(c.settings.hooks_source) as i32,
        warnings: c.warnings,
    }
}

pub(crate) fn hooks(h: &HookSpecs) -> pb::Hooks {
    let list = |e: HookEvent| {
        h.of(e)
            .iter()
            .map(|s| pb::Hook {
                command: s.command.clone(),
                matcher: s.matcher.clone(),
                timeout_ms: s.timeout_ms.map(|t| t as u32),
            })
            .collect()
    };
    pb::Hooks {
        pre_tool_use: list(HookEvent::PreToolUse),
        post_tool_use: list(HookEvent::PostToolUse),
        session_start: list(HookEvent::SessionStart),
        stop: list(HookEvent::Stop),
    }
}

/// UpdateConfigRequest's max_turns, theme and hooks, checked (an error names the field).
pub(crate) fn settings_patch(
    max_turns: Option<u32>,
    theme: Option<i32>,
    hooks: Option<pb::Hooks>,
) -> vak_core::Result<SettingsPatch> {
    Ok(SettingsPatch {
        max_turns: max_turns
            .map(|n| agent_settings::check_max_turns(n, "max_turns"))
            .transpose()?,
        theme: theme.map(enums::theme_in).transpose()?,
        hooks: hooks.map(|h| Hooks::check(&hook_specs(h), "hooks")).transpose()?,
    })
}

fn hook_specs(h: pb::Hooks) -> HookSpecs {
    let list = |v: Vec<pb::Hook>| {
        v.into_iter()
            .map(|h| HookSpec {
                command: h.command,
                matcher: h.matcher,
                timeout_ms: h.timeout_ms.map(u64::from),
            })
            .collect()
    };
    HookSpecs {
        pre_tool_use: list(h.pre_tool_use),
        post_tool_use: list(h.post_tool_use),
        session_start: list(h.session_start),
        stop: list(h.stop),
    }
}

pub(crate) fn provider_info(p: vak_core::host::config::ProviderStatus) -> pb::ProviderInfo {
    pb::ProviderInfo {
        name: p.kind.as_str().to_string(),
        label: p.kind.label().to_string(),
        configured: p.configured,
        pool_size: p.fingerprints.len() as u32,
        fingerprints: p.fingerprints,
        key_sources: p
            .key_sources
            .iter()
            .map(|&s| enums::key_source(s) as i32)
            .collect(),
    }
}

pub(crate) fn model_entry(m: vak_core::provider::ModelInfo) -> pb::ModelEntry {
    pb::ModelEntry {
        id: m.id,
        display_name: m.display_name,
    }
}

pub(crate) fn mux_opened(stream_id: &str, cursor: String) -> pb::StreamMessage {
    pb::StreamMessage {
        id: String::new(),
        session_id: String::new(),
        frame: Some(pb::stream_message::Frame::StreamOpened(pb::StreamOpened {
            stream_id: stream_id.to_string(),
            cursor,
            ..Default::default()
        })),
    }
}

pub(crate) fn mux_item(m: MuxItem) -> pb::StreamMessage {
    use pb::stream_message::Frame as F;
    let sid = m.session_id.as_str();
    let frame = match m.frame {
        // A side run's frames have a frame kind of their own on the mux.
        MuxFrame::Agent(f) if matches!(f.event, ClientEvent::Side { .. }) => F::Side(frame(&f)),
        MuxFrame::Agent(f) => F::Agent(frame(&f)),
        MuxFrame::Presentation(e) => F::Presentation(presentation(sid, &e)),
        MuxFrame::Resync {
            reason,
            latest_seq,
            lost,
        } => F::Resync(resync(sid, reason, latest_seq, lost)),
        MuxFrame::Coworking {
            clients,
            joined,
            left,
        } => F::Coworking(pb::Coworking {
            session_id: sid.to_string(),
            clients: clients.iter().map(client).collect(),
            joined: joined.iter().map(client).collect(),
            left: left.iter().map(client).collect(),
        }),
        MuxFrame::Closed { reason } => F::SessionClosed(session_closed(sid, reason)),
    };
    pb::StreamMessage {
        id: m.cursor.unwrap_or_default(),
        session_id: m.session_id,
        frame: Some(frame),
    }
}

pub(crate) fn mux_extra(frame: pb::stream_message::Frame) -> pb::StreamMessage {
    pb::StreamMessage {
        id: String::new(),
        session_id: String::new(),
        frame: Some(frame),
    }
}

/// The SSE `event:` name of a multiplexed message.
pub(crate) fn mux_kind_name(frame: &pb::stream_message::Frame) -> &'static str {
    use pb::stream_message::Frame as F;
    match frame {
        F::StreamOpened(_) => "stream_opened",
        F::Agent(_) => "agent",
        F::Presentation(_) => "presentation",
        F::Resync(_) => "resync",
        F::Coworking(_) => "coworking",
        F::Host(_) => "host",
        F::Config(_) => "config",
        F::SessionClosed(_) => "session_closed",
        F::Side(_) => "side",
    }
}

/// The SSE `event:` name of a presentation event.
pub(crate) fn presentation_kind_name(kind: &pb::presentation_event::Kind) -> &'static str {
    use pb::presentation_event::Kind as P;
    match kind {
        P::Snapshot(_) => "snapshot",
        P::ItemStarted(_) => "item_started",
        P::TextDelta(_) => "text_delta",
        P::ItemReplaced(_) => "item_replaced",
        P::ItemCompleted(_) => "item_completed",
        P::Goal(_) => "goal",
    }
}

// ---- Workspace files, diff and session lifecycle (issue 15) ----

/// A file read: text as itself, anything else (invalid UTF-8, a NUL byte) as base64.
pub(crate) fn file_content(f: vak_core::host::files::FileRead) -> pb::FileContent {
    use base64::Engine;
    let size = f.bytes.len() as u64;
    let (content, encoding) = if vak_core::host::files::is_text(&f.bytes) {
        (
            String::from_utf8(f.bytes).unwrap_or_default(),
            pb::FileEncoding::Utf8,
        )
    } else {
        (
            base64::engine::general_purpose::STANDARD.encode(&f.bytes),
            pb::FileEncoding::Base64,
        )
    };
    pb::FileContent {
        path: f.path,
        content,
        encoding: encoding as i32,
        sha: f.sha256,
        size,
    }
}

/// The bytes a WriteFile carries, decoded as its `encoding` says.
pub(crate) fn file_bytes(content: String, encoding: i32) -> vak_core::Result<Vec<u8>> {
    use base64::Engine;
    match pb::FileEncoding::try_from(encoding) {
        Ok(pb::FileEncoding::Unspecified | pb::FileEncoding::Utf8) => Ok(content.into_bytes()),
        Ok(pb::FileEncoding::Base64) => base64::engine::general_purpose::STANDARD
            .decode(content.as_bytes())
            .map_err(|e| vak_core::Error::invalid(format!("content is not valid base64: {e}"))),
        Err(_) => Err(vak_core::Error::invalid(format!(
            "encoding {encoding}: use \"utf-8\" or \"base64\""
        ))),
    }
}

pub(crate) fn file_written(w: vak_core::host::files::FileWritten) -> pb::WriteFileResponse {
    pb::WriteFileResponse {
        path: w.path,
        sha: w.sha256,
        size: w.size,
        created: w.created,
    }
}

pub(crate) fn dir_listing(d: vak_core::host::files::DirListing) -> pb::DirListing {
    pb::DirListing {
        path: d.path,
        parent: d.parent,
        dirs: d.dirs,
        truncated: d.truncated,
        roots: d.roots,
    }
}

pub(crate) fn workspace(w: vak_core::host::workspaces::OpenWorkspace) -> pb::Workspace {
    pb::Workspace {
        path: w.path.display().to_string(),
        trusted: w.trusted,
        primary: w.primary,
    }
}

pub(crate) fn sandbox(s: vak_core::tools::sandbox::SandboxFacts) -> pb::SandboxInfo {
    pb::SandboxInfo {
        mode: enums::sandbox_mode(s.mode) as i32,
        network: s.network,
        landlock_abi: u32::try_from(s.landlock_abi).unwrap_or(0),
        writable_roots: s.writable_roots.iter().map(|r| r.display().to_string()).collect(),
    }
}

pub(crate) fn workspace_diff(session_id: &str, d: vak_core::host::diff::Diff) -> pb::WorkspaceDiff {
    pb::WorkspaceDiff {
        session_id: session_id.to_string(),
        reason: enums::diff_reason(d.reason) as i32,
        message: d.message,
        files: d
            .files
            .into_iter()
            .map(|f| pb::ChangedFile {
                path: f.path,
                status: f.status,
                from: f.from,
            })
            .collect(),
        diff: d.diff,
        truncated: d.truncated,
    }
}

pub(crate) fn run_result(r: vak_core::session::wait::Settled) -> pb::RunResult {
    pb::RunResult {
        outcome: enums::run_outcome(r.outcome) as i32,
        message: r.message,
        answer: r.answer,
        seq: r.seq,
    }
}

pub(crate) fn memory_scope(s: vak_core::host::memory::Scope) -> pb::MemoryScope {
    match s {
        vak_core::host::memory::Scope::Workspace => pb::MemoryScope::Workspace,
        vak_core::host::memory::Scope::User => pb::MemoryScope::User,
    }
}

/// A scope a request names (an enum number no scope has is refused).
pub(crate) fn memory_scope_in(
    n: Option<i32>,
) -> Result<Option<vak_core::host::memory::Scope>, vak_core::Error> {
    use vak_core::host::memory::Scope;
    match n.map(pb::MemoryScope::try_from) {
        None => Ok(None),
        Some(Ok(pb::MemoryScope::Workspace)) => Ok(Some(Scope::Workspace)),
        Some(Ok(pb::MemoryScope::User)) => Ok(Some(Scope::User)),
        Some(Err(_)) => Err(vak_core::Error::invalid("invalid scope: workspace or user")),
    }
}

pub(crate) fn memory_note(n: vak_core::host::memory::Note) -> pb::MemoryNote {
    pb::MemoryNote {
        id: n.id,
        scope: memory_scope(n.scope) as i32,
        text: n.text,
        kind: n.kind,
        tag: n.tag,
        session_id: n.session_id,
        created_at: n.created_at,
        updated_at: n.updated_at,
    }
}

pub(crate) fn search_hit(h: vak_core::host::search::Hit, title: String) -> pb::SearchHit {
    pb::SearchHit {
        session_id: h.session_id,
        seq: h.seq,
        workspace: h.workspace,
        // The index keeps the role by its name.
        role: pb::MessageRole::from_json_name(&h.role).unwrap_or_default() as i32,
        snippet: h.snippet,
        score: h.score,
        title,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vak_proto::v1 as pb;

    #[test]
    fn tool_output_names_its_stream_as_a_string() {
        let ev = vak_core::event::ClientEvent::ToolOutput {
            call_id: "c".into(),
            stream: vak_core::event::OutputStream::Stderr,
            text: "oops\n".into(),
        };
        let e = pb::Event {
            seq: 3,
            session_id: "s".into(),
            kind: Some(kind(&ev)),
        };
        let v: serde_json::Value = serde_json::from_slice(&vak_proto::json::to_json(&e)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"seq": 3, "session_id": "s", "tool_output": {"call_id": "c", "stream": "stderr", "text": "oops\n"}})
        );
    }
}
