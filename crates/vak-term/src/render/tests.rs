//! Unit tests of the renderer (`render.rs`): the lines each event shows.

use super::*;

fn input(pairs: &[(&str, &str)]) -> prost_types::Struct {
    prost_types::Struct {
        fields: pairs
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    prost_types::Value {
                        kind: Some(prost_types::value::Kind::StringValue(v.to_string())),
                    },
                )
            })
            .collect(),
    }
}

#[test]
fn tool_entries_are_one_line() {
    let i = input(&[("path", "f.txt"), ("content", "hi")]);
    assert_eq!(
        tool_call_line("write_file", Some(&i)),
        "⚙ write_file f.txt (2 bytes)"
    );
    let i = input(&[("command", "echo a\necho b")]);
    assert_eq!(tool_call_line("bash", Some(&i)), "⚙ bash $ echo a ⏎ echo b");
    assert_eq!(
        tool_result_line("bash", false, "a\nb\n\n[exit status: 1]", None),
        line(Style::Bad, "✗ bash: a (+2 more lines)")
    );
    assert_eq!(
        tool_result_line("bash", true, "a\nb", Some(3)),
        line(Style::Good, "✓ bash: a (+1 more line: /show 3)")
    );
}

#[test]
fn an_mcp_tool_shows_its_input_as_json_and_its_rule_once() {
    use prost_types::value::Kind as V;
    let num = |n| prost_types::Value {
        kind: Some(V::NumberValue(n)),
    };
    let i = prost_types::Struct {
        fields: [("a".to_string(), num(2.0)), ("b".to_string(), num(-0.5))].into(),
    };
    assert_eq!(
        tool_call_line("mcp__demo__add", Some(&i)),
        r#"⚙ mcp__demo__add {"a":2,"b":-0.5}"#
    );
    assert_eq!(
        tool_result_line("mcp__demo__add", true, "5", None),
        line(Style::Good, "✓ mcp__demo__add: 5")
    );
    let rule = |kind: pb::RuleKind, tool: &str, pattern: &str| {
        let mut r = pb::PermissionRule {
            tool: tool.into(),
            pattern: pattern.into(),
            ..Default::default()
        };
        r.set_kind(kind);
        always_line(&r)
    };
    assert_eq!(
        rule(pb::RuleKind::Tool, "mcp__demo__add", "mcp__demo__add"),
        "· always allowing every `mcp__demo__add` call in this workspace"
    );
    assert_eq!(
        rule(pb::RuleKind::Prefix, "bash", "ls"),
        "· always allowing bash `ls` in this workspace"
    );
}

#[test]
fn one_is_singular_everywhere() {
    assert_eq!(count(1, "byte"), "1 byte");
    assert_eq!(
        (count(0, "byte"), count(2, "line")),
        ("0 bytes".into(), "2 lines".into())
    );
    let i = input(&[("path", "f.txt"), ("content", "x")]);
    assert_eq!(
        tool_call_line("write_file", Some(&i)),
        "⚙ write_file f.txt (1 byte)"
    );
    // The server's own phrases for write_file, as the approval question and the result show them.
    assert_eq!(
        tool_text("write_file", "write 1 bytes to a.txt"),
        "write 1 byte to a.txt"
    );
    assert_eq!(
        tool_result_line("write_file", true, "wrote 1 bytes to 1 bytes.txt", None),
        line(Style::Good, "✓ write_file: wrote 1 byte to 1 bytes.txt")
    );
    assert_eq!(
        tool_text("write_file", "wrote 11 bytes to a"),
        "wrote 11 bytes to a"
    );
    // Anything else is the command's own output, shown as it is.
    assert_eq!(tool_text("bash", "wrote 1 bytes to x"), "wrote 1 bytes to x");
}

#[test]
fn outputs_are_kept_for_show_only_when_interactive() {
    let mut r = Render::interactive();
    let call = pb::Event {
        kind: Some(Kind::ToolCall(pb::ToolCall {
            call_id: "c1".into(),
            tool: "bash".into(),
            ..Default::default()
        })),
        ..Default::default()
    };
    let result = pb::Event {
        kind: Some(Kind::ToolResult(pb::ToolResult {
            call_id: "c1".into(),
            ok: true,
            output: "one\ntwo\nthree\n".into(),
        })),
        ..Default::default()
    };
    r.event(&call);
    assert_eq!(
        r.event(&result),
        vec![line(Style::Good, "✓ bash: one (+2 more lines: /show 1)")]
    );
    assert_eq!(
        full_output(1, &r.outputs()[0]),
        vec![
            line(Style::Info, "── /show 1: ✓ bash output ──"),
            line(Style::Plain, "one"),
            line(Style::Plain, "two"),
            line(Style::Plain, "three"),
        ]
    );
    let mut plain = Render::default();
    plain.event(&call);
    assert_eq!(
        plain.event(&result),
        vec![line(Style::Good, "✓ bash: one (+2 more lines)")]
    );
    assert!(plain.outputs().is_empty());
}

fn child(id: &str, kind: pb::WorkerKind, state: pb::WorkerState) -> pb::Worker {
    let mut w = pb::Worker {
        id: id.into(),
        parent_id: "p".into(),
        prompt: "write the README\nwith care".into(),
        branch: format!("vak/p/{id}"),
        ..Default::default()
    };
    w.set_kind(kind);
    w.set_state(state);
    w
}

#[test]
fn children_and_dev_servers_are_one_line_each() {
    let ev = |kind: Kind| pb::Event {
        seq: 3,
        session_id: "p".into(),
        kind: Some(kind),
    };
    let worker = |phase: pb::WorkerPhase, w: pb::Worker| {
        let mut e = pb::WorkerEvent {
            worker: Some(Box::new(w)),
            ..Default::default()
        };
        e.set_phase(phase);
        Kind::Worker(e)
    };
    let mut r = Render::default();
    let (w, c) = (pb::WorkerKind::Worker, pb::WorkerKind::Candidate);
    assert_eq!(
        r.event(&ev(worker(
            pb::WorkerPhase::Spawned,
            child("c1", w, pb::WorkerState::Running)
        ))),
        vec![line(
            Style::Dim,
            "⑂ worker c1 spawned on vak/p/c1: write the README"
        )]
    );
    let mut done = child("c1", w, pb::WorkerState::Finished);
    done.summary = "Added README.md.\n\nDetails follow.".into();
    done.diff_stat = Some(pb::DiffStat {
        files: 1,
        insertions: 12,
        deletions: 0,
    });
    assert_eq!(
        r.event(&ev(worker(pb::WorkerPhase::Finished, done))),
        vec![line(
            Style::Good,
            "✓ worker c1 finished (1 file +12 -0): Added README.md."
        )]
    );
    let mut failed = child("c2", w, pb::WorkerState::Failed);
    failed.summary = "the model failed".into();
    assert_eq!(
        r.event(&ev(worker(pb::WorkerPhase::Finished, failed))),
        vec![line(Style::Bad, "✗ worker c2 failed: the model failed")]
    );
    let bench = pb::Workbench {
        bestofn_id: "bon_0123456789ab".into(),
        candidate: Some(Box::new(child("c3", c, pb::WorkerState::Running))),
    };
    assert_eq!(
        r.event(&ev(Kind::Workbench(bench))),
        vec![line(Style::Dim, "⑂ candidate c3 running")]
    );
    let mut gone = pb::DraftDiscarded {
        candidate: "c4".into(),
        branch: "vak/p/c4".into(),
        ..Default::default()
    };
    gone.set_why(pb::DiscardReason::KeptOther);
    assert_eq!(
        r.event(&ev(Kind::DraftDiscarded(gone))),
        vec![line(
            Style::Dim,
            "· candidate c4 removed: another candidate was kept (branch vak/p/c4 deleted)"
        )]
    );
    let mut out = pb::LaunchOutput {
        name: "web".into(),
        text: "ready on :3000\nGET /\n".into(),
        ..Default::default()
    };
    out.set_stream(pb::OutputStream::Stdout);
    assert_eq!(
        r.event(&ev(Kind::LaunchOutput(out.clone()))),
        vec![
            line(Style::Dim, "[web] ready on :3000"),
            line(Style::Dim, "[web] GET /"),
        ]
    );
    out.set_stream(pb::OutputStream::Stderr);
    out.text = (1..=25).map(|i| format!("e{i}\n")).collect();
    let shown = r.event(&ev(Kind::LaunchOutput(out)));
    assert_eq!(shown.len(), LAUNCH_LINES + 1);
    assert_eq!(shown[0], line(Style::Note, "[web] e1"));
    assert_eq!(shown[LAUNCH_LINES], line(Style::Dim, "[web] … (+5 more lines)"));
}

#[test]
fn the_worker_list_is_a_line_per_child() {
    assert_eq!(
        worker_list(&[]),
        vec![line(Style::Info, "no workers in this session")]
    );
    let mut done = child("c1", pb::WorkerKind::Candidate, pb::WorkerState::Finished);
    done.summary = "Fixed it.".into();
    done.diff_stat = Some(pb::DiffStat {
        files: 2,
        insertions: 5,
        deletions: 1,
    });
    let mut running = child("c2", pb::WorkerKind::Worker, pb::WorkerState::Running);
    running.branch.clear();
    assert_eq!(
        worker_list(&[done, running]),
        vec![
            line(Style::Info, "2 workers of this session:"),
            line(
                Style::Plain,
                "  c1  candidate  finished  vak/p/c1  2 files +5 -1  Fixed it."
            ),
            line(Style::Plain, "  c2  worker  running  write the README"),
        ]
    );
}

#[test]
fn skills_are_one_bounded_line_at_the_start_and_a_line_each_when_asked() {
    let skill = |name: &str, kind: pb::SkillKind, scope: pb::SkillScope| pb::Skill {
        name: name.into(),
        description: format!("runs: {name}\nmore"),
        kind: kind as i32,
        scope: scope as i32,
        ..Default::default()
    };
    assert!(skill_list(&[], false).is_empty(), "nothing said without skills");
    assert_eq!(
        skill_list(&[], true),
        vec![line(
            Style::Info,
            "no skills promoted for this workspace (POST /skills/proposals/ID/promote makes one)"
        )]
    );
    let two = [
        skill("fmt", pb::SkillKind::Script, pb::SkillScope::Workspace),
        skill("greet", pb::SkillKind::Prompt, pb::SkillScope::Global),
    ];
    assert_eq!(
        skill_list(&two, false),
        vec![line(
            Style::Info,
            "· skills: /fmt /greet (/skills says what each does)"
        )]
    );
    assert_eq!(
        skill_list(&two, true),
        vec![
            line(
                Style::Info,
                "2 skills; type /NAME [ARGUMENTS] to have the model use one:"
            ),
            line(Style::Plain, "  /fmt  script  runs: fmt"),
            line(Style::Plain, "  /greet  prompt  runs: greet  (every workspace)"),
        ]
    );
    let many: Vec<pb::Skill> = (0..30)
        .map(|i| skill(&format!("s{i}"), pb::SkillKind::Prompt, pb::SkillScope::Workspace))
        .collect();
    let start = skill_list(&many, false);
    let Piece::Line { text, .. } = &start[0] else {
        panic!("{start:?}")
    };
    assert!(text.contains("/s11 and 18 more ("), "{text}");
    assert!(!text.contains("/s12"), "{text}");
}

fn background(source: &str, id: &str, text: &str, reason: Option<&str>) -> pb::BackgroundResult {
    let mut b = pb::BackgroundResult {
        id: id.into(),
        text: text.into(),
        alert: reason.is_some(),
        ..Default::default()
    };
    b.set_source(pb::BackgroundSource::from_json_name(source).expect("a source"));
    if let Some(r) = reason {
        b.set_reason(pb::BackgroundReason::from_json_name(r).expect("a reason"));
    }
    b
}

#[test]
fn a_background_result_is_one_entry_and_an_alert_is_marked_as_one() {
    let ev = |b: pb::BackgroundResult| pb::Event {
        seq: 9,
        session_id: "s".into(),
        kind: Some(Kind::BackgroundResult(b)),
    };
    let mut r = Render::default();
    assert_eq!(
        r.event(&ev(background(
            "script",
            "task_0123456789ab",
            "  all quiet\n",
            None
        ))),
        vec![line(
            Style::Info,
            "⟲ background (script task_0123456789ab): all quiet"
        )]
    );
    assert_eq!(
        r.event(&ev(background(
            "script",
            "task_0123456789ab",
            "exit code 3\ndisk is \x1b[31mfull",
            Some("script_failed")
        ))),
        vec![
            line(
                Style::Bad,
                "⚠ script_failed (script task_0123456789ab): exit code 3"
            ),
            line(Style::Note, "  disk is [31mfull"),
        ]
    );
    let mut budget = background(
        "budget",
        "budget:2026-12-04:80",
        "80% of today's budget",
        Some("budget_80"),
    );
    budget.summarised = 2;
    assert_eq!(
        background_lines(&budget),
        vec![line(
            Style::Bad,
            "⚠ budget_80 (budget budget:2026-12-04:80) [2 results summarised]: 80% of today's budget"
        )]
    );
    // A long output is cut, saying where the rest is.
    let long: String = (1..=30).map(|i| format!("line {i}\n")).collect();
    let shown = background_lines(&background("task", "task_x", &long, None));
    assert_eq!(shown.len(), 1 + BACKGROUND_LINES + 1);
    assert_eq!(shown[1], line(Style::Plain, "  line 2"));
    assert_eq!(
        shown.last().unwrap(),
        &line(Style::Info, "  … (+9 more lines in the transcript)")
    );
    // An empty text says only where it came from.
    assert_eq!(
        background_lines(&background("worker", "w1", "", None)),
        vec![line(Style::Info, "⟲ background (worker w1)")]
    );
}

#[test]
fn a_transcript_replays_its_background_messages() {
    let mut m = pb::Message {
        text: "all quiet".into(),
        background: Some(background("script", "task_a", "all quiet", None)),
        ..Default::default()
    };
    m.set_role(pb::MessageRole::Background);
    let bare = pb::Message {
        role: pb::MessageRole::Background as i32,
        text: "no result attached".into(),
        ..Default::default()
    };
    let t = pb::Transcript {
        messages: vec![m, bare],
        ..Default::default()
    };
    assert_eq!(
        Render::default().transcript(&t),
        vec![
            line(Style::Info, "⟲ background (script task_a): all quiet"),
            line(Style::Info, "⟲ background: no result attached"),
        ]
    );
}

#[test]
fn control_characters_never_reach_the_terminal() {
    assert_eq!(clean("a\x1b[2Jb\r\n\tc\u{7}"), "a[2Jb\n    c");
}

#[test]
fn live_output_shows_finished_lines_under_the_call_and_the_rest_with_the_result() {
    let mut r = Render::default();
    let ev = |kind| pb::Event {
        seq: 1,
        session_id: "s".into(),
        kind: Some(kind),
    };
    let out = |stream: &str, text: &str| {
        ev(Kind::ToolOutput(pb::ToolOutput {
            call_id: "c".into(),
            stream: pb::OutputStream::from_json_name(stream).expect("a stream") as i32,
            text: text.into(),
        }))
    };
    let dim = |t: &str| line(Style::Dim, t);
    assert_eq!(r.event(&out("stdout", "one\ntw")), vec![dim("  │ one")]);
    assert_eq!(r.event(&out("stderr", "oops\n")), vec![dim("  ! oops")]);
    assert_eq!(r.event(&out("stdout", "o\nthr")), vec![dim("  │ two")]);
    let end = r.event(&ev(Kind::ToolResult(pb::ToolResult {
        call_id: "c".into(),
        ok: true,
        output: "one\ntwo\nthree".into(),
    })));
    assert_eq!(end[0], dim("  │ thr"));
    assert_eq!(end.len(), 2, "{end:?}");
    assert!(r.partial.is_empty());
}

#[test]
fn a_refused_approval_is_said_once_by_its_approval_line() {
    let ev = |kind| pb::Event {
        seq: 1,
        session_id: "s".into(),
        kind: Some(kind),
    };
    let call = |id: &str| {
        ev(Kind::ToolCall(pb::ToolCall {
            call_id: id.into(),
            tool: "bash".into(),
            ..Default::default()
        }))
    };
    let asked = |rid: &str, id: &str| {
        ev(Kind::ApprovalRequested(pb::ApprovalRequested {
            request_id: rid.into(),
            tool: "bash".into(),
            call_id: id.into(),
            ..Default::default()
        }))
    };
    let resolved = |rid: &str, outcome: pb::ApprovalOutcome, reason: &str| {
        ev(Kind::ApprovalResolved(pb::ApprovalResolved {
            request_id: rid.into(),
            outcome: outcome as i32,
            reason: reason.into(),
        }))
    };
    let result = |id: &str, ok: bool, output: &str| {
        ev(Kind::ToolResult(pb::ToolResult {
            call_id: id.into(),
            ok,
            output: output.into(),
        }))
    };
    for mut r in [Render::default(), Render::interactive()] {
        // Denied: the approval line says it, the result (the same denial) is not shown.
        r.event(&call("c1"));
        assert!(r.event(&asked("a1", "c1")).is_empty());
        assert_eq!(
            r.event(&resolved(
                "a1",
                pb::ApprovalOutcome::Denied,
                "vak term --approve deny"
            )),
            vec![line(Style::Bad, "✗ bash denied: vak term --approve deny")]
        );
        assert!(r
            .event(&result(
                "c1",
                false,
                "denied by the user: vak term --approve deny"
            ))
            .is_empty());
        // Expired: the same.
        r.event(&call("c2"));
        r.event(&asked("a2", "c2"));
        assert_eq!(
            r.event(&resolved("a2", pb::ApprovalOutcome::Expired, "nobody answered"))
                .len(),
            1
        );
        assert!(r.event(&result("c2", false, "the approval expired")).is_empty());
        // Approved: the approval line, then the result.
        r.event(&call("c3"));
        r.event(&asked("a3", "c3"));
        assert_eq!(
            r.event(&resolved("a3", pb::ApprovalOutcome::Approved, "")),
            vec![line(Style::Good, "✓ bash approved")]
        );
        assert_eq!(
            r.event(&result("c3", true, "hi")),
            vec![line(Style::Good, "✓ bash: hi")]
        );
        // A call refused without asking (the mode's rules) still shows its result.
        r.event(&call("c4"));
        assert_eq!(
            r.event(&result("c4", false, "not allowed in plan mode")),
            vec![line(Style::Bad, "✗ bash: not allowed in plan mode")]
        );
        assert!(r.refused.is_empty());
    }
}

#[test]
fn a_run_cut_or_stopped_is_one_line_live_and_on_a_redraw() {
    let end = |outcome: pb::RunOutcome, message: &str, stop: Option<i32>| pb::Event {
        seq: 9,
        session_id: "s".into(),
        kind: Some(Kind::RunFinished(pb::RunFinished {
            outcome: outcome as i32,
            message: message.into(),
            stop_reason: stop,
        })),
    };
    let note = |t: &str| line(Style::Note, t);
    let mut r = Render::interactive();
    let cut = Some(pb::StopReason::MaxTokens as i32);
    assert_eq!(
        r.event(&end(pb::RunOutcome::Completed, "cut at the output limit", cut)),
        vec![note("⚠ cut at the output limit")]
    );
    assert_eq!(
        r.event(&end(
            pb::RunOutcome::Completed,
            "the model refused",
            Some(pb::StopReason::Refusal as i32)
        )),
        vec![note("⚠ the model refused")]
    );
    assert_eq!(
        r.event(&end(
            pb::RunOutcome::Completed,
            "stopped by the provider's content filter",
            Some(pb::StopReason::ContentFilter as i32)
        )),
        vec![note("⚠ stopped by the provider's content filter")]
    );
    assert!(r
        .event(&end(pb::RunOutcome::Completed, "completed", None))
        .is_empty());
    // A reason this client does not know: the message says it.
    assert_eq!(
        r.event(&end(
            pb::RunOutcome::Completed,
            "stopped for a new reason",
            Some(99)
        )),
        vec![note("⚠ stopped for a new reason")]
    );
    // Redrawn from the transcript's "run" entry: the same line.
    let t = pb::Transcript {
        messages: vec![pb::Message {
            role: pb::MessageRole::Run as i32,
            text: "cut at the output limit".into(),
            outcome: Some(pb::RunOutcome::Completed as i32),
            stop_reason: cut,
            seq: 9,
            ..Default::default()
        }],
        ..Default::default()
    };
    assert_eq!(
        Render::interactive().transcript(&t),
        vec![note("⚠ cut at the output limit")]
    );
}

#[test]
fn a_retrying_status_is_one_dim_line_and_a_plain_one_nothing() {
    let status = |retrying| pb::Event {
        kind: Some(Kind::Status(pb::Status { busy: true, retrying })),
        ..Default::default()
    };
    let mut r = Render::default();
    assert!(r.event(&status(None)).is_empty());
    let retrying = pb::Retrying {
        attempt: 1,
        of: 3,
        reason: "could not reach the model service at 127.0.0.1:9 (connection refused)\x1b[2J".into(),
    };
    assert_eq!(
        r.event(&status(Some(retrying))),
        vec![line(
            Style::Dim,
            "retrying 1/3: could not reach the model service at 127.0.0.1:9 (connection refused)[2J"
        )]
    );
}
