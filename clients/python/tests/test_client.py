"""Every `Client` method, over gRPC and over REST (the `unary` fixture)."""

from __future__ import annotations

import re
import secrets

import pytest
from helpers import Server, burst_text, finished, kind, take_until, texts, wait_finished

from vak_client import Client, VakError, agent_pb2, json_name


def test_create_list_attach(client: Client) -> None:
    sid = client.create_session()
    assert re.fullmatch(r"[0-9a-f]{32}", sid), sid
    listed = {s.session_id: s for s in client.list_sessions()}
    assert sid in listed
    assert listed[sid].title == "" and listed[sid].latest_seq == 0
    summary = client.attach(sid)
    assert isinstance(summary, agent_pb2.SessionSummary)
    assert summary.session_id == sid and summary.loaded and not summary.busy
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", summary.created_at), summary.created_at


def test_run_transcript_presentation(client: Client) -> None:
    sid = client.create_session()
    rid = f"r-{secrets.token_hex(4)}"
    with client.follow(sid, after=0) as events:
        admission = client.run(sid, "hello world\nbye", request_id=rid)
        assert (admission.request_id, json_name(admission, "state")) == (rid, "started")
        got = take_until(events, finished, events)
    assert texts(got) == "echo: hello world\necho: bye"
    assert json_name(got[-1].run_finished, "outcome") == "completed"
    # Retrying with the same request id is safe.
    assert json_name(client.run(sid, "hello world\nbye", request_id=rid), "state") == "duplicate"

    transcript = client.transcript(sid)
    assert transcript.session_id == sid
    assert [(json_name(m, "role"), m.text) for m in transcript.messages] == [
        ("user", "hello world\nbye"),
        ("assistant", "echo: hello world\necho: bye"),
    ]
    assert transcript.usage.output_tokens > 0

    markdown = client.transcript_markdown(sid)
    assert markdown.startswith(f"# Session {sid}")
    assert "echo: hello world" in markdown

    timeline = client.presentation(sid)
    assert timeline.schema_version == 2 and timeline.session_id == sid
    assert timeline.seq == got[-1].seq
    assert [json_name(i, "kind") for i in timeline.items][:2] == ["user_input", "assistant_text"]
    assert client.attach(sid).title == "hello world"


def test_run_generates_request_id(client: Client) -> None:
    sid = client.create_session()
    admission = client.run(sid, "hi")
    assert re.fullmatch(r"req_[0-9a-f]{32}", admission.request_id), admission.request_id
    wait_finished(client, sid)


def test_steer_and_cancel(client: Client) -> None:
    sid = client.create_session()
    with client.follow(sid, after=0) as events:
        assert json_name(client.run(sid, "/sleep 60000"), "state") == "started"
        take_until(events, lambda e: kind(e) == "turn_started", events)
        steered = client.steer(sid, "also this", request_id="s1")
        assert (steered.request_id, json_name(steered, "state")) == ("s1", "queued")
        assert json_name(client.steer(sid, "also this", request_id="s1"), "state") == "duplicate"
        assert json_name(client.steer(sid, "and this"), "state") == "queued"
        cancelled = client.cancel(sid)
        assert cancelled.cancelled and cancelled.discarded == 2
        got = take_until(events, finished, events)
    assert json_name(got[-1].run_finished, "outcome") == "cancelled"
    assert got[-1].run_finished.message == "cancelled by a client"
    # Discarded input never appears; an idle cancel is not an error.
    assert not any(kind(e) == "user_message" for e in got)
    idle = client.cancel(sid)
    assert not idle.cancelled and idle.discarded == 0


def test_steer_starts_a_run_when_idle(client: Client) -> None:
    sid = client.create_session()
    with client.follow(sid, after=0) as events:
        assert json_name(client.steer(sid, "steered"), "state") == "started"
        got = take_until(events, finished, events)
    assert texts(got) == "echo: steered"


@pytest.mark.parametrize("approve", [True, False])
def test_approval_round_trip(server: Server, client: Client, approve: bool) -> None:
    sid = client.create_session()
    name = f"f-{secrets.token_hex(4)}.txt"
    answers: list[agent_pb2.ApproveResponse] = []

    def answer(ev: agent_pb2.Event) -> None:
        if kind(ev) == "approval_requested":
            req = ev.approval_requested
            assert req.tool == "write_file" and req.reason == f"write 2 bytes to {name}"
            assert dict(req.input) == {"path": name, "content": "hi"}
            answers.append(client.approve(sid, req.request_id, approve, reason="" if approve else "no thanks"))

    with client.follow(sid, after=0) as events:
        client.run(sid, f"/write {name} hi")
        got = take_until(events, finished, events, on_item=answer)

    assert len(answers) == 1
    assert json_name(answers[0], "outcome") == ("approved" if approve else "denied")
    resolved = [e.approval_resolved for e in got if kind(e) == "approval_resolved"]
    assert [r.outcome for r in resolved] == [answers[0].outcome]
    result = next(e.tool_result for e in got if kind(e) == "tool_result")
    path = server.workspace / name
    if approve:
        assert result.ok and result.output == f"wrote 2 bytes to {name}"
        assert path.read_text() == "hi"
    else:
        assert not result.ok and result.output == "denied by the user: no thanks"
        assert not path.exists()
    assert json_name(got[-1].run_finished, "outcome") == "completed"

    # An approval resolves exactly once.
    with pytest.raises(VakError) as err:
        client.approve(sid, answers[0].request_id, True)
    assert (err.value.status, err.value.code) == (409, "conflict")


def test_errors_are_the_same_on_both_transports(server: Server, client: Client, unary: str) -> None:
    sid = client.create_session()
    cases: list[tuple[int, str, object]] = [
        (404, "not_found", lambda: client.run("nosuch", "x")),
        (404, "not_found", lambda: client.approve(sid, "ap_nope", True)),
        (400, "invalid_argument", lambda: client.run(sid, "   ")),
        (400, "invalid_argument", lambda: client.steer(sid, "")),
        (400, "invalid_argument", lambda: client.transcript("bad.id")),
    ]
    for status, code, call in cases:
        with pytest.raises(VakError) as err:
            call()  # type: ignore[operator]
        assert (err.value.status, err.value.code) == (status, code), err.value
        assert not err.value.retryable
        if unary == "grpc":
            assert err.value.grpc_code is not None

    with Client(server.url, "wrong-token", unary=unary) as wrong:  # type: ignore[arg-type]
        with pytest.raises(VakError) as err:
            wrong.create_session()
    assert (err.value.status, err.value.code) == (401, "unauthenticated")


def test_unreachable_server_is_unavailable(unary: str) -> None:
    import socket

    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with Client(f"http://127.0.0.1:{port}", "t", unary=unary, timeout=5) as c:  # type: ignore[arg-type]
        with pytest.raises(VakError) as err:
            c.list_sessions()
    # Retryable 503 unavailable, but the text says what happened: the server
    # sent no status, so the text names none.
    assert err.value.status == 503 and err.value.retryable
    text = str(err.value)
    assert "HTTP" not in text and "503" not in text, text
    if unary == "rest":
        assert not err.value.reached
        assert text == f"could not connect to http://127.0.0.1:{port}: connection refused (GET /sessions)"
    else:
        assert text.startswith("gRPC UNAVAILABLE: ") and "connection refused" in text.lower(), text


def test_burst_is_exact(direct: Client) -> None:
    sid = direct.create_session()
    with direct.follow(sid, after=0) as events:
        direct.run(sid, "/burst 300")
        got = take_until(events, finished, events)
    assert texts(got) == burst_text(300)


def test_always_rules_are_stored_listed_and_deleted(client: Client) -> None:
    sid = client.create_session()
    prog = f"nosuch{secrets.token_hex(4)}"
    answers: list[agent_pb2.ApproveResponse] = []

    def answer(ev: agent_pb2.Event) -> None:
        if kind(ev) == "approval_requested":
            answers.append(client.approve(sid, ev.approval_requested.request_id, True, always=True))

    with client.follow(sid, after=0) as events:
        client.run(sid, f"/bash {prog} run fast")
        take_until(events, finished, events, on_item=answer)
    assert len(answers) == 1 and json_name(answers[0], "outcome") == "approved" and answers[0].persisted
    rule = answers[0].rule
    assert (rule.tool, json_name(rule, "kind"), rule.pattern) == ("bash", "prefix", f"{prog} run")
    assert rule.id.startswith("rule_")
    listed = client.list_rules()
    assert rule in list(listed.rules) and listed.max_rules == 256 and listed.workspace
    # Named by its path, the server's own workspace lists the same rules.
    assert client.list_rules(workspace=listed.workspace) == listed
    with pytest.raises(VakError) as err:
        client.list_rules(workspace="/not/an/open/workspace")
    assert err.value.code == "not_found"

    # A call the rule covers runs without asking.
    with client.follow(sid, after=client.attach(sid).latest_seq) as events:
        client.run(sid, f"/bash {prog} run")
        got = take_until(events, finished, events)
    assert not any(kind(e) == "approval_requested" for e in got)

    assert client.delete_rule(rule.id).rule == rule
    assert rule not in list(client.list_rules().rules)
    with pytest.raises(VakError) as err:
        client.delete_rule(rule.id)
    assert (err.value.status, err.value.code) == (404, "not_found")


def test_set_mode_and_leaving_plan_mode_with_a_mode(client: Client) -> None:
    try:
        changed = client.set_mode("plan")
        assert changed.changed and json_name(changed.config, "permission_mode") == "plan"
        assert not client.set_mode("plan").changed
        with pytest.raises(VakError) as err:
            client.set_mode("yolo")
        assert (err.value.status, err.value.code) == (400, "invalid_argument")

        sid = client.create_session()
        answers: list[agent_pb2.ApproveResponse] = []

        def answer(ev: agent_pb2.Event) -> None:
            if kind(ev) == "approval_requested":
                assert dict(ev.approval_requested.input) == {"plan": "1. nothing"}
                rid = ev.approval_requested.request_id
                with pytest.raises(VakError) as bad:
                    client.approve(sid, rid, True, always=True)
                assert bad.value.status == 400
                answers.append(client.approve(sid, rid, True, mode="accept-edits"))

        with client.follow(sid, after=0) as events:
            client.run(sid, "/plan 1. nothing")
            take_until(events, finished, events, on_item=answer)
        assert [json_name(a, "outcome") for a in answers] == ["approved"]
        assert not answers[0].persisted
        assert not client.set_mode("accept-edits").changed, "the plan's answer chose it"
    finally:
        client.set_mode("default")
