"""Intent, learned skills and the goal of a turn chain (docs/protocol.md
sections 39 to 41), over gRPC and over REST (the `unary` fixture). Intent
and skills run against a server of their own in the bypass mode (so `/bash`
and a script skill run without an approval): "delete the build folder"
reads as a high-stakes change planned first, with approvals; what the
caller knows wins over the words; explaining writes no session; the policy
is the defaults. A `/bash` sequence completed twice makes one proposal;
promoted, it is a skill file, listed, and a run calls it; promoting it
again is `proposal_settled`, a near copy of it is `duplicate_of` it and
cannot take its name (`skill_exists`); a proposal asked for from a range of
a session's messages can be rejected, once. Steering runs on the shared
server (permission mode default, so a `/write` waits for its approval and
the run stays live): "pause" is `applied`, streamed as a `goal_update`,
and holds the chain's next leg until "resume"; the presentation's `goal`
shows each step."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import STEP, Server, finished, kind, serving, take_until
from helpers import run_async as run

from vak_client import AsyncClient, Client, Event, VakError, agent_pb2, enum_json_name, json_name


@pytest.fixture(scope="module")
def skills_vak(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = Server(tmp_path_factory.mktemp("vak-skills"), "--allow-bypass", "--permission-mode", "bypass")
    yield from serving(server)


@pytest.fixture
def sc(skills_vak: Server, unary: str) -> Iterator[Client]:
    with skills_vak.client(unary=unary) as c:
        yield c


def run_to_end(c: Client, sid: str, prompt: str) -> list[Event]:
    """Runs `prompt` in `sid`; the session's events up to the run's end (it must complete)."""
    with c.follow(sid) as events:
        c.run(sid, prompt)
        got = take_until(events, finished, events)
    assert json_name(got[-1].run_finished, "outcome") == "completed", got[-1]
    return got


def proposals_with_body(c: Client, body: str) -> list[agent_pb2.SkillProposal]:
    return [p for p in c.list_skill_proposals().proposals if p.body == body]


def wait_for_proposal(c: Client, body: str) -> agent_pb2.SkillProposal:
    """The proposal of `body`, which the server makes on a thread of its own
    shortly after a run finishes: polled until it appears or STEP passes."""
    deadline = time.monotonic() + STEP
    while not (found := proposals_with_body(c, body)):
        assert time.monotonic() < deadline, f"no proposal with body {body!r} within {STEP}s: {c.list_skill_proposals()}"
        time.sleep(0.05)
    assert len(found) == 1, found
    return found[0]


def acts(policy: agent_pb2.IntentPolicy) -> list[str]:
    return [enum_json_name(agent_pb2.Act.DESCRIPTOR, a) for a in policy.intent.read_only_acts]


def test_explain_reads_a_prompt_without_running_it(sc: Client) -> None:
    sessions = len(sc.list_sessions())
    ex = sc.explain_intent("delete the build folder")
    r = ex.reading
    assert (json_name(ex, "surface"), json_name(r, "act"), json_name(r, "horizon"), json_name(r, "stakes")) == (
        "api",
        "change",
        "now",
        "high",
    )
    assert [enum_json_name(agent_pb2.RequirementKind.DESCRIPTOR, k) for k in r.evidence] == ["file_changed", "approval"]
    assert ("act", "change", 'word "delete"') in [(s.field, s.value, s.because) for s in r.signals]
    # A high-stakes change is planned first: the plan and every tool that changes something ask a person.
    e = ex.engagement
    assert (json_name(e, "mode"), e.plan_first, e.read_only) == ("plan", True, False)
    assert {"exit_plan_mode", "write_file", "edit_file", "bash"} <= set(e.approvals), list(e.approvals)
    assert "bash" in e.tools and e.route == "offline/offline"
    d = ex.baseline_diff
    assert d.HasField("mode") and json_name(d, "mode") == "plan" and d.plan_first
    assert list(d.approvals_added) == list(e.approvals) and list(d.tools_withheld) == []

    # What the caller knows wins over the words: asked as a question, with no evidence, it only reads.
    asked = sc.explain_intent("delete the build folder", act="ask", evidence=[])
    assert (json_name(asked.reading, "act"), list(asked.reading.evidence)) == ("ask", [])
    assert ("act", "ask", "set by the request") in [(s.field, s.value, s.because) for s in asked.reading.signals]
    assert asked.engagement.read_only and not asked.engagement.plan_first and list(asked.engagement.approvals) == []
    assert "bash" not in asked.engagement.tools and "bash" in asked.baseline_diff.tools_withheld
    # A scheduled task's prompt runs later.
    task = sc.explain_intent("run the tests", surface="task")
    assert (json_name(task, "surface"), json_name(task.reading, "act"), json_name(task.reading, "horizon")) == (
        "task",
        "run",
        "scheduled",
    )
    # Nothing was run or written.
    assert len(sc.list_sessions()) == sessions

    with pytest.raises(VakError) as err:
        sc.explain_intent("x", act="destroy")
    assert (err.value.status, err.value.code) == (400, "invalid_argument") and "act" in err.value.message


def test_the_intent_policy_is_the_defaults(sc: Client, skills_vak: Server) -> None:
    p = sc.intent_policy()
    assert os.path.realpath(p.workspace) == os.path.realpath(skills_vak.workspace)
    assert json_name(p.intent, "high_stakes_mode") == "default" and json_name(p.intent, "plan_first_at") == "high"
    assert acts(p) == ["ask", "review", "plan"] and p.commitment.require_evidence
    assert {s.key: json_name(s, "source") for s in p.sources} == {
        "intent.high_stakes_mode": "default",
        "intent.read_only_acts": "default",
        "intent.plan_first_at": "default",
        "commitment.require_evidence": "default",
    }


def test_a_repeated_tool_sequence_becomes_a_skill_a_run_can_call(sc: Client, skills_vak: Server, unary: str) -> None:
    # Commands of this transport's own: the other transport's runs are another shape.
    body = f"echo {unary}-one\necho {unary}-two"
    prompt = "\n".join(f"/bash {line}" for line in body.splitlines())
    first = sc.create_session()
    run_to_end(sc, first, prompt)
    second = sc.create_session()
    run_to_end(sc, second, prompt)

    p = wait_for_proposal(sc, body)
    assert (json_name(p, "kind"), json_name(p, "state"), p.source.session) == ("script", "pending", second)
    assert p.id.startswith("sp_") and p.name and not p.HasField("duplicate_of") and list(p.tags) == []
    assert os.path.realpath(p.workspace) == os.path.realpath(skills_vak.workspace)

    skill = sc.promote_skill_proposal(p.id)
    assert (skill.name, json_name(skill, "kind"), json_name(skill, "scope"), skill.body) == (p.name, "script", "workspace", body)
    path = Path(skill.path)
    assert path.resolve() == (skills_vak.workspace / ".vak" / "skills" / f"{p.name}.md").resolve()
    assert path.read_text().startswith(f"---\nname: {p.name}\n") and body in path.read_text()
    assert (p.name, body) in [(s.name, s.body) for s in sc.list_skills().skills]
    # A session's skills are its workspace's, the ones its legs offer.
    assert p.name in [s.name for s in sc.list_skills(session_id=second).skills]
    assert [json_name(q, "state") for q in proposals_with_body(sc, body)] == ["promoted"]

    # A run calls it as a tool: its body runs as one bash call.
    got = run_to_end(sc, sc.create_session(), f"/call skill__{p.name} {{}}")
    calls = [e.tool_call.tool for e in got if kind(e) == "tool_call"]
    results = [e.tool_result for e in got if kind(e) == "tool_result"]
    assert calls == [f"skill__{p.name}"] and len(results) == 1
    assert results[0].ok and results[0].output == f"{unary}-one\n{unary}-two\n", results[0]

    with pytest.raises(VakError) as err:
        sc.promote_skill_proposal(p.id)
    assert (err.value.status, err.value.code, err.value.reason) == (409, "conflict", "proposal_settled")

    # The same calls asked for by name are a near copy of the skill, which keeps its name.
    again = sc.create_skill_proposal(second, name=p.name)
    assert (again.body, again.duplicate_of, list(again.tags)) == (body, p.name, [f"duplicate-of:{p.name}"])
    with pytest.raises(VakError) as err:
        sc.promote_skill_proposal(again.id)
    assert (err.value.status, err.value.reason) == (409, "skill_exists")
    assert json_name(sc.reject_skill_proposal(again.id), "state") == "rejected"


def test_a_proposal_asked_for_from_a_range_is_rejected_once(sc: Client, unary: str) -> None:
    sid = sc.create_session()
    got = run_to_end(sc, sid, f"/bash echo {unary}-first\n/bash echo {unary}-second")
    first_call = next(e.seq for e in got if kind(e) == "tool_call")
    p = sc.create_skill_proposal(sid, seq_range=(1, first_call), name=f"first-{unary}")
    assert (p.name, p.body, json_name(p, "kind"), json_name(p, "state")) == (
        f"first-{unary}",
        f"echo {unary}-first",
        "script",
        "pending",
    )
    assert p.source.session == sid and first_call in p.source.seqs and all(s <= first_call for s in p.source.seqs)

    rejected = sc.reject_skill_proposal(p.id)
    assert (rejected.id, json_name(rejected, "state")) == (p.id, "rejected")
    for settle in (sc.reject_skill_proposal, sc.promote_skill_proposal):
        with pytest.raises(VakError) as err:
            settle(p.id)
        assert (err.value.status, err.value.reason) == (409, "proposal_settled"), settle
    assert f"first-{unary}" not in [s.name for s in sc.list_skills().skills]

    with pytest.raises(VakError) as err:
        sc.create_skill_proposal("0" * 32)
    assert err.value.status == 404
    with pytest.raises(VakError) as err:
        sc.create_skill_proposal(sid, name="Not A Name")
    assert err.value.status == 400


def test_pause_is_applied_and_holds_the_next_leg_until_resume(client: Client) -> None:
    sid = client.create_session()
    with client.follow(sid) as events:
        client.run(sid, "/write paused.md hi")
        # The run is live while its write waits for an approval.
        asked = take_until(events, lambda e: kind(e) == "approval_requested", events)[-1].approval_requested

        pause = client.steer(sid, "pause")
        assert json_name(pause, "state") == "applied", pause
        update = take_until(events, lambda e: kind(e) == "goal_update", events)[-1].goal_update.update
        assert (json_name(update, "relation"), update.text, update.request_id) == ("pause", "pause", pause.request_id)
        goal = client.presentation(sid).goal
        assert (goal.objective, json_name(goal, "control")) == ("/write paused.md hi", "paused")
        assert [json_name(u, "relation") for u in goal.updates] == ["pause"]

        more = client.steer(sid, "also say done")
        assert json_name(more, "state") == "queued"
        client.approve(sid, asked.request_id, True)
        # The leg ends; the next one waits for a resume, and the run stays busy.
        held = take_until(events, lambda e: kind(e) == "notice" and "paused" in e.notice.text, events)
        assert not any(finished(e) for e in held)
        goal = client.presentation(sid).goal
        assert (json_name(goal, "control"), list(goal.additions)) == ("paused", ["also say done"])

        resume = client.steer(sid, "resume")
        assert json_name(resume, "state") == "applied"
        got = take_until(events, finished, events)
    assert json_name(got[-1].run_finished, "outcome") == "completed"
    assert any(kind(e) == "user_message" and e.user_message.text == "also say done" for e in got)
    goal = client.presentation(sid).goal
    assert json_name(goal, "control") == "done"
    assert [json_name(u, "relation") for u in goal.updates] == ["pause", "add", "resume"]


def test_async_client(skills_vak: Server, unary: str) -> None:
    async def main() -> None:
        async with AsyncClient(skills_vak.url, skills_vak.token, unary=unary) as c:  # type: ignore[arg-type]
            ex = await c.explain_intent("delete the build folder")
            assert (json_name(ex.reading, "act"), json_name(ex.reading, "stakes")) == ("change", "high")
            assert ex.engagement.plan_first and "bash" in ex.engagement.approvals
            assert json_name((await c.explain_intent("plan the release", stakes="low")).reading, "stakes") == "low"
            assert acts(await c.intent_policy()) == ["ask", "review", "plan"]

            sid = await c.create_session()
            with skills_vak.client(unary=unary) as sync:
                run_to_end(sync, sid, f"/bash echo async-{unary}")
            p = await c.create_skill_proposal(sid, name=f"async-{unary}")
            assert (p.body, json_name(p, "state")) == (f"echo async-{unary}", "pending")
            assert p.id in [q.id for q in (await c.list_skill_proposals()).proposals]
            skill = await c.promote_skill_proposal(p.id, name=f"async-{unary}-skill")
            assert (skill.name, json_name(skill, "scope")) == (f"async-{unary}-skill", "workspace")
            assert skill.name in [s.name for s in (await c.list_skills()).skills]
            with pytest.raises(VakError) as err:
                await c.reject_skill_proposal(p.id)
            assert (err.value.status, err.value.reason) == (409, "proposal_settled")

    run(main)
