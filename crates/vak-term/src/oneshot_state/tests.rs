//! Unit tests of the one-shot renderer's state machine (`oneshot_state.rs`).

use super::*;

/// What the renderer printed: stdout, and the note lines.
#[derive(Default)]
struct Rec {
    stdout: String,
    notes: Vec<String>,
}

impl Out for Rec {
    fn stdout(&mut self, s: &[u8]) {
        self.stdout.push_str(&String::from_utf8_lossy(s));
    }
    fn note(&mut self, line: &str) {
        self.notes.push(line.to_string());
    }
}

const OURS: &str = "term_ours";

fn renderer(json: bool, policy: Policy) -> Renderer<Rec> {
    Renderer::new(Rec::default(), "s1".into(), "p".into(), json, policy, false)
}

fn ev(seq: u64, kind: Kind) -> Update {
    Update::Event(pb::Event {
        seq,
        session_id: "s1".into(),
        kind: Some(kind),
    })
}

fn opened() -> Update {
    ev(0, Kind::StreamOpened(pb::StreamOpened::default()))
}

fn user(seq: u64, request_id: &str) -> Update {
    ev(
        seq,
        Kind::UserMessage(pb::UserMessage {
            text: "p".into(),
            request_id: request_id.into(),
            ..Default::default()
        }),
    )
}

fn text(seq: u64, t: &str) -> Update {
    ev(seq, Kind::TextDelta(pb::TextDelta { text: t.into() }))
}

fn finished(seq: u64, outcome: &str, message: &str) -> Update {
    ev(
        seq,
        Kind::RunFinished(pb::RunFinished {
            outcome: pb::RunOutcome::from_json_name(outcome).expect("an outcome") as i32,
            message: message.into(),
            stop_reason: None,
        }),
    )
}

fn asks(seq: u64, request_id: &str) -> Update {
    ev(
        seq,
        Kind::ApprovalRequested(pb::ApprovalRequested {
            request_id: request_id.into(),
            tool: "bash".into(),
            reason: "ls".into(),
            ..Default::default()
        }),
    )
}

/// Opened and admitted to run at once, after seq 3.
fn started(json: bool, policy: Policy) -> Renderer<Rec> {
    started_as(json, policy, "started")
}

/// Opened and admitted (`state`: "started" or "queued"), after seq 3.
fn started_as(json: bool, policy: Policy, state: &str) -> Renderer<Rec> {
    let mut r = renderer(json, policy);
    assert_eq!(r.update(opened()), Step::Opened);
    let a = pb::Admission {
        request_id: OURS.into(),
        state: pb::AdmissionState::from_json_name(state).expect("a state") as i32,
        after_seq: 3,
        ..Default::default()
    };
    r.admitted(OURS.into(), &a);
    assert_eq!(r.state(), State::Waiting);
    r
}

fn feed(r: &mut Renderer<Rec>, updates: Vec<Update>) -> Vec<Step> {
    updates.into_iter().map(|u| r.update(u)).collect()
}

fn approve(rid: &str, approve: bool, reason: &str) -> Effect {
    Effect::Answer(approval("s1", rid, approve, reason))
}

#[test]
fn opening_waits_for_stream_opened_and_says_when_it_reconnects() {
    let mut r = renderer(false, Policy::Ask);
    assert_eq!(r.update(text(1, "old")), Step::Continue);
    assert_eq!(r.update(Update::Reconnecting("gone".into())), Step::Continue);
    assert_eq!(
        r.update(Update::Reconnecting("still gone".into())),
        Step::Continue
    );
    assert_eq!(r.state(), State::Opening);
    assert_eq!(r.update(opened()), Step::Opened);
    assert_eq!(r.out.notes, ["reconnecting: gone", "reconnected"]);
    assert_eq!(r.out.stdout, "", "nothing before the run is ours");
}

#[test]
fn a_completed_run_prints_its_leg_only_and_exits_0() {
    let mut r = started(false, Policy::Ask);
    let steps = feed(
        &mut r,
        vec![
            user(4, "someone_else"),
            text(5, "not ours"),
            finished(6, "completed", ""),
            user(7, OURS),
            text(8, "echo: "),
            text(9, "p"),
            ev(10, Kind::ToolCall(pb::ToolCall::default())),
            text(11, "after the tool"),
        ],
    );
    assert!(steps.iter().all(|s| *s == Step::Continue), "{steps:?}");
    assert_eq!(r.state(), State::Ours { user_seq: 7 });
    assert_eq!(
        r.update(finished(12, "completed", "")),
        Step::Exit(EXIT_COMPLETED)
    );
    assert_eq!(r.out.stdout, "echo: p\nafter the tool\n");
    assert!(
        !r.out.notes.iter().any(|n| n.starts_with("run ")),
        "{:?}",
        r.out.notes
    );
}

#[test]
fn a_background_result_before_our_leg_is_a_note_never_part_of_the_answer() {
    let bg = |alert: bool| {
        let mut b = pb::BackgroundResult {
            id: "task_0123456789ab".into(),
            text: if alert {
                "exit code 3\nno disk"
            } else {
                "all quiet"
            }
            .into(),
            alert,
            ..Default::default()
        };
        b.set_source(pb::BackgroundSource::Script);
        if alert {
            b.set_reason(pb::BackgroundReason::ScriptFailed);
        }
        Kind::BackgroundResult(b)
    };
    let mut r = started_as(false, Policy::Ask, "queued");
    feed(
        &mut r,
        vec![
            ev(4, bg(false)),
            ev(5, bg(true)),
            user(6, OURS),
            text(7, "answer"),
        ],
    );
    assert_eq!(r.update(finished(8, "completed", "")), Step::Exit(EXIT_COMPLETED));
    assert_eq!(r.out.stdout, "answer\n");
    assert_eq!(
        r.out.notes,
        [
            "⟲ background (script task_0123456789ab): all quiet",
            "⚠ script_failed (script task_0123456789ab): exit code 3",
            "  no disk",
        ]
    );
    // In JSON mode it is a line like every other frame, and no note.
    let mut r = started(true, Policy::Ask);
    feed(&mut r, vec![ev(4, bg(false))]);
    assert!(
        r.out.stdout.contains(r#""background_result":{"source":"script""#),
        "{}",
        r.out.stdout
    );
    assert!(r.out.notes.is_empty(), "{:?}", r.out.notes);
}

#[test]
fn each_way_a_run_ends_has_its_exit_code_and_note() {
    for (outcome, code, note) in [
        ("completed", EXIT_COMPLETED, None),
        ("failed", EXIT_FAILED, Some("run failed: boom")),
        ("cancelled", EXIT_CANCELLED, Some("run cancelled: boom")),
        ("max_turns", EXIT_FAILED, Some("run max_turns: boom")),
    ] {
        let mut r = started(false, Policy::Ask);
        feed(&mut r, vec![user(4, OURS), text(5, "half")]);
        assert_eq!(
            r.update(finished(6, outcome, "boom")),
            Step::Exit(code),
            "{outcome}"
        );
        assert_eq!(r.out.stdout, "half\n", "the answer ends with a newline");
        assert_eq!(r.out.notes.last().map(String::as_str), note, "{outcome}");
    }
}

#[test]
fn a_queued_run_cancelled_before_it_began_exits_130() {
    // Admitted to run at once, a cancelled run before our prompt is another's.
    let mut running = started(false, Policy::Ask);
    assert_eq!(running.update(finished(4, "cancelled", "")), Step::Continue);
    let mut r = started_as(false, Policy::Ask, "queued");
    assert_eq!(
        r.update(finished(4, "completed", "")),
        Step::Continue,
        "the run ahead of ours"
    );
    assert_eq!(r.update(finished(5, "cancelled", "")), Step::Exit(EXIT_CANCELLED));
    assert_eq!(r.out.notes, ["run cancelled before the prompt ran"]);
}

#[test]
fn another_prompt_after_ours_is_not_printed_but_our_run_still_ends() {
    let mut r = started(false, Policy::Ask);
    feed(
        &mut r,
        vec![
            user(4, OURS),
            text(5, "mine"),
            user(6, "steer"),
            text(7, "theirs"),
        ],
    );
    assert_eq!(r.state(), State::After { user_seq: 4 });
    assert_eq!(r.update(finished(8, "completed", "")), Step::Exit(EXIT_COMPLETED));
    assert_eq!(r.out.stdout, "mine\n");
}

#[test]
fn json_mode_prints_every_frame_and_no_text() {
    let mut r = renderer(true, Policy::Ask);
    r.update(opened());
    let a = pb::Admission {
        request_id: OURS.into(),
        state: pb::AdmissionState::Started as i32,
        ..Default::default()
    };
    r.admitted(OURS.into(), &a);
    feed(&mut r, vec![user(1, OURS), text(2, "hi")]);
    assert_eq!(r.update(finished(3, "failed", "x")), Step::Exit(EXIT_FAILED));
    let lines: Vec<&str> = r.out.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert!(lines[2].contains("\"hi\""), "{}", lines[2]);
    assert!(r.out.notes.is_empty(), "{:?}", r.out.notes);
}

#[test]
fn questions_are_asked_one_at_a_time_until_answered() {
    let mut r = started(false, Policy::Ask);
    feed(
        &mut r,
        vec![user(4, OURS), asks(5, "a1"), asks(6, "a2"), text(7, "not yet")],
    );
    assert!(r.effects().is_empty(), "nothing answered at once");
    r.ask_next();
    assert!(r.asking());
    assert_eq!(r.effects(), [Effect::ReadStdin]);
    assert!(r.out.notes.last().unwrap().starts_with("bash wants approval: "));
    r.ask_next();
    assert!(r.effects().is_empty(), "one question at a time");
    assert_eq!(r.answered(Some("what?".into())), Step::Continue);
    assert!(r.effects().is_empty(), "no answer: asked again");
    r.ask_next();
    assert_eq!(r.effects(), [Effect::ReadStdin]);
    r.answered(Some("y".into()));
    assert_eq!(r.effects(), [approve("a1", true, "")]);
    r.ask_next();
    assert_eq!(r.effects(), [Effect::ReadStdin]);
    // stdin closes: this one and every later one are denied.
    r.answered(None);
    assert_eq!(r.effects(), [approve("a2", false, "")]);
    assert!(r.out.notes.contains(&"stdin closed: denying".to_string()));
    r.update(asks(8, "a3"));
    assert_eq!(r.effects(), [approve("a3", false, "vak term --approve deny")]);
    assert_eq!(r.out.notes.last().unwrap(), "stdin closed: denying");
}

#[test]
fn a_question_answered_elsewhere_is_not_asked_and_others_legs_are_not_ours() {
    let mut r = started(false, Policy::Ask);
    r.update(asks(4, "before_ours"));
    feed(&mut r, vec![user(5, OURS), asks(6, "a1")]);
    feed(
        &mut r,
        vec![ev(
            7,
            Kind::ApprovalResolved(pb::ApprovalResolved {
                request_id: "a1".into(),
                ..Default::default()
            }),
        )],
    );
    r.ask_next();
    assert!(!r.asking());
    assert!(r.effects().is_empty());
}

#[test]
fn the_policy_answers_at_once() {
    let mut r = started(false, Policy::Allow);
    feed(&mut r, vec![user(4, OURS), asks(5, "a1")]);
    assert_eq!(r.effects(), [approve("a1", true, "")]);
    r.ask_next();
    assert!(!r.asking());
}

#[test]
fn a_denial_by_the_policy_is_one_line() {
    let mut r = started(false, Policy::Deny);
    let call = pb::ToolCall {
        call_id: "c1".into(),
        tool: "bash".into(),
        ..Default::default()
    };
    let asked = pb::ApprovalRequested {
        request_id: "a1".into(),
        tool: "bash".into(),
        reason: "ls".into(),
        call_id: "c1".into(),
        ..Default::default()
    };
    feed(
        &mut r,
        vec![
            user(4, OURS),
            ev(5, Kind::ToolCall(call)),
            ev(6, Kind::ApprovalRequested(asked)),
        ],
    );
    assert_eq!(r.effects(), [approve("a1", false, "vak term --approve deny")]);
    feed(
        &mut r,
        vec![
            ev(
                7,
                Kind::ApprovalResolved(pb::ApprovalResolved {
                    request_id: "a1".into(),
                    outcome: pb::ApprovalOutcome::Denied as i32,
                    reason: "vak term --approve deny".into(),
                }),
            ),
            ev(
                8,
                Kind::ToolResult(pb::ToolResult {
                    call_id: "c1".into(),
                    ok: false,
                    output: "denied by the user: vak term --approve deny".into(),
                }),
            ),
        ],
    );
    assert_eq!(r.update(finished(9, "completed", "")), Step::Exit(EXIT_COMPLETED));
    let denials: Vec<&String> = r.out.notes.iter().filter(|n| n.contains("den")).collect();
    assert_eq!(
        denials,
        ["✗ bash denied: vak term --approve deny"],
        "{:?}",
        r.out.notes
    );
}

#[test]
fn ctrl_c_cancels_and_a_second_quits_with_130() {
    let mut r = started(false, Policy::Ask);
    feed(&mut r, vec![user(4, OURS), text(5, "part")]);
    assert_eq!(r.interrupt(), Step::Continue);
    assert_eq!(r.effects(), [Effect::Cancel]);
    assert_eq!(r.interrupt(), Step::Exit(EXIT_CANCELLED));
    assert_eq!(r.out.stdout, "part\n");
}

fn msg(role: &str, text: &str) -> pb::Message {
    pb::Message {
        role: pb::MessageRole::from_json_name(role).expect("a role") as i32,
        text: text.into(),
        ..Default::default()
    }
}

fn resync(messages: Vec<pb::Message>, finished_runs: Vec<pb::TimelineItem>) -> Update {
    Update::Resynced(Box::new(Resync {
        event: pb::Event::default(),
        transcript: pb::Transcript {
            messages,
            ..Default::default()
        },
        pending_approvals: Vec::new(),
        finished_runs,
        busy: false,
    }))
}

#[test]
fn a_resync_prints_only_what_is_missing_and_may_end_the_run() {
    let mut r = started(false, Policy::Ask);
    feed(&mut r, vec![user(4, OURS), text(5, "echo: ")]);
    let mut prompt = msg("user", "p");
    prompt.seq = 4;
    let mut answer = msg("assistant", "echo: p");
    answer.seq = 6;
    assert_eq!(
        r.update(resync(vec![prompt.clone(), answer.clone()], Vec::new())),
        Step::Continue
    );
    assert_eq!(r.out.stdout, "echo: p");
    assert_eq!(r.state(), State::Ours { user_seq: 4 });
    let end = pb::TimelineItem {
        seq: 7,
        status: pb::ItemStatus::Completed as i32,
        ..Default::default()
    };
    assert_eq!(
        r.update(resync(vec![prompt, answer], vec![end])),
        Step::Exit(EXIT_COMPLETED)
    );
    assert_eq!(r.out.stdout, "echo: p\n");
    assert_eq!(
        r.out.notes,
        ["resynced from the transcript", "resynced from the transcript"]
    );
}

#[test]
fn a_resync_finds_our_prompt_by_its_text_after_the_admission() {
    let mut r = started(false, Policy::Ask);
    let mut old = msg("user", "p");
    old.seq = 2;
    let mut ours = msg("user", "p");
    ours.seq = 5;
    let mut tool = msg("tool", "ran");
    tool.seq = 6;
    r.update(resync(
        vec![old, msg("assistant", "before"), ours, tool],
        Vec::new(),
    ));
    assert_eq!(r.state(), State::Ours { user_seq: 5 });
    r.update(text(7, "then"));
    assert_eq!(
        r.out.stdout, "then",
        "nothing printed before the tool: no separator"
    );
}

#[test]
fn the_transcript_answer_matches_the_live_text() {
    let t = pb::Transcript {
        messages: vec![
            msg("user", "old"),
            msg("assistant", "echo: old"),
            msg("user", "p"),
            msg("assistant", "echo: before"),
            msg("tool", "wrote"),
            msg("assistant", "echo: after"),
            msg("user", "next"),
            msg("assistant", "echo: next"),
        ],
        ..Default::default()
    };
    // As printed live: the text after a tool starts on a line of its own; the leg ends at the next prompt.
    assert_eq!(transcript_answer(&t, 2), "echo: before\necho: after");
    assert_eq!(transcript_answer(&t, 0), "echo: old");
}

fn stopped(seq: u64, outcome: &str, message: &str, why: pb::StopReason) -> Update {
    ev(
        seq,
        Kind::RunFinished(pb::RunFinished {
            outcome: pb::RunOutcome::from_json_name(outcome).expect("an outcome") as i32,
            message: message.into(),
            stop_reason: Some(why as i32),
        }),
    )
}

#[test]
fn a_reply_cut_or_stopped_says_so_once_after_the_answer() {
    for (why, message, said) in [
        (
            pb::StopReason::MaxTokens,
            "cut at the output limit",
            "⚠ cut at the output limit",
        ),
        (
            pb::StopReason::Refusal,
            "the model refused",
            "⚠ the model refused",
        ),
        (
            pb::StopReason::ContentFilter,
            "stopped by the provider's content filter",
            "⚠ stopped by the provider's content filter",
        ),
    ] {
        let mut r = started(false, Policy::Ask);
        feed(&mut r, vec![user(4, OURS), text(5, "half an ans")]);
        assert_eq!(
            r.update(stopped(6, "completed", message, why)),
            Step::Exit(EXIT_COMPLETED),
            "the run completed"
        );
        assert_eq!(r.out.stdout, "half an ans\n");
        assert_eq!(r.out.notes, [said], "{why:?}");
    }
    // A completed run whose reply ended on its own says nothing more.
    let mut r = started(false, Policy::Ask);
    feed(&mut r, vec![user(4, OURS), text(5, "all")]);
    r.update(finished(6, "completed", "completed"));
    assert!(r.out.notes.is_empty(), "{:?}", r.out.notes);
    // --output json: the frame is on stdout, no note.
    let mut r = started(true, Policy::Ask);
    feed(&mut r, vec![user(4, OURS)]);
    r.update(stopped(
        5,
        "completed",
        "cut at the output limit",
        pb::StopReason::MaxTokens,
    ));
    assert!(r.out.notes.is_empty(), "{:?}", r.out.notes);
    assert!(
        r.out.stdout.contains("\"stop_reason\":\"max_tokens\""),
        "{}",
        r.out.stdout
    );
}

#[test]
fn a_run_cut_behind_a_resync_says_so_from_the_transcript() {
    let mut r = started(false, Policy::Ask);
    feed(&mut r, vec![user(4, OURS), text(5, "half")]);
    let mut prompt = msg("user", "p");
    prompt.seq = 4;
    let mut answer = msg("assistant", "half");
    answer.seq = 5;
    let mut run = msg("run", "cut at the output limit");
    run.seq = 6;
    run.outcome = Some(pb::RunOutcome::Completed as i32);
    run.stop_reason = Some(pb::StopReason::MaxTokens as i32);
    let end = pb::TimelineItem {
        seq: 6,
        status: pb::ItemStatus::Completed as i32,
        ..Default::default()
    };
    assert_eq!(
        r.update(resync(vec![prompt, answer, run], vec![end])),
        Step::Exit(EXIT_COMPLETED)
    );
    assert_eq!(
        r.out.notes,
        ["resynced from the transcript", "⚠ cut at the output limit"]
    );
}

#[test]
fn a_retry_of_our_run_is_a_note_never_part_of_the_answer() {
    let retrying = |attempt| {
        Kind::Status(pb::Status {
            busy: true,
            retrying: Some(pb::Retrying {
                attempt,
                of: 2,
                reason: "could not reach the model service at 127.0.0.1:9 (connection refused)".into(),
            }),
        })
    };
    let mut r = started(false, Policy::Ask);
    feed(
        &mut r,
        vec![user(4, OURS), ev(5, retrying(1)), ev(6, retrying(2))],
    );
    let failed = finished(7, "failed", "could not reach the model service at 127.0.0.1:9");
    assert_eq!(r.update(failed), Step::Exit(EXIT_FAILED));
    assert_eq!(r.out.stdout, "");
    assert_eq!(
        r.out.notes,
        [
            "retrying 1/2: could not reach the model service at 127.0.0.1:9 (connection refused)",
            "retrying 2/2: could not reach the model service at 127.0.0.1:9 (connection refused)",
            "run failed: could not reach the model service at 127.0.0.1:9",
        ]
    );
}
