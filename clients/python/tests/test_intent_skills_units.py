"""The intent and skill calls without a server: what each sends over gRPC and
REST (the explain query with its enums by their JSON names and `evidence`
comma-separated, present and empty for none; the bodies without the id the
path carries), bad names refused before any call, and how an explanation,
a proposal and a goal state's REST JSON is read."""

from __future__ import annotations

import pytest

from vak_client import VakError, agent_pb2, enum_json_name, json_name
from vak_client._common import parse_json
from vak_client._intent_skills import (
    call_create_skill_proposal,
    call_explain_intent,
    call_intent_policy,
    call_list_skill_proposals,
    call_list_skills,
    call_promote_skill_proposal,
    call_reject_skill_proposal,
)


def route(c: object) -> tuple[str, str, str, object]:
    return (c.rpc, c.http_method, c.path, c.body)  # type: ignore[attr-defined]


def test_explain_sends_only_what_the_caller_knows() -> None:
    plain = call_explain_intent("delete the build folder")
    assert route(plain) == ("ExplainIntent", "GET", "/intent/explain?prompt=delete+the+build+folder", None)
    r = plain.request
    assert (r.prompt, r.surface, r.act, r.horizon, r.stakes, r.HasField("evidence")) == ("delete the build folder", 0, 0, 0, 0, False)

    known = call_explain_intent(
        "a&b=c", surface="task", act="run", horizon="session", stakes="low", evidence=["tool_ok", "approval"]
    )
    assert known.path == (
        "/intent/explain?prompt=a%26b%3Dc&surface=task&act=run&horizon=session&stakes=low&evidence=tool_ok%2Capproval"
    )
    r = known.request
    assert (r.surface, r.act, r.horizon, r.stakes) == (
        agent_pb2.INTENT_SURFACE_TASK,
        agent_pb2.ACT_RUN,
        agent_pb2.HORIZON_SESSION,
        agent_pb2.STAKES_LOW,
    )
    assert list(r.evidence.kinds) == [agent_pb2.REQUIREMENT_KIND_TOOL_OK, agent_pb2.REQUIREMENT_KIND_APPROVAL]

    # [] is "no evidence": present and empty, unlike None.
    none = call_explain_intent("x", evidence=[])
    assert none.path == "/intent/explain?prompt=x&evidence=" and none.request.HasField("evidence")
    assert list(none.request.evidence.kinds) == []


def test_explain_refuses_bad_names_before_any_call() -> None:
    for kwargs, named in (
        ({"act": "destroy"}, "act"),
        ({"surface": "web"}, "surface"),
        ({"horizon": "NOW"}, "horizon"),
        ({"stakes": "extreme"}, "stakes"),
    ):
        with pytest.raises(VakError) as e:
            call_explain_intent("x", **kwargs)
        assert (e.value.status, e.value.code) == (400, "invalid_argument")
        assert named in e.value.message, e.value.message
    with pytest.raises(VakError) as e:
        call_explain_intent("x", evidence=["tool_ok", "file"])
    assert e.value.status == 400 and "evidence 'file' is not one of tool_ok, file_changed, approval" in e.value.message
    with pytest.raises(TypeError, match="not a str"):
        call_explain_intent("x", evidence="tool_ok")


def test_skill_calls_map_onto_their_routes() -> None:
    assert route(call_intent_policy()) == ("GetIntentPolicy", "GET", "/intent/policy", None)
    assert route(call_list_skills()) == ("ListSkills", "GET", "/skills", None)
    assert route(call_list_skills("s1")) == ("ListSkills", "GET", "/skills?session_id=s1", None)
    assert call_list_skills("s1").request.session_id == "s1"
    assert route(call_list_skill_proposals()) == ("ListSkillProposals", "GET", "/skills/proposals", None)

    whole = call_create_skill_proposal("s1")
    assert route(whole) == ("CreateSkillProposal", "POST", "/skills/proposals", {"from_session": "s1"})
    assert not whole.request.HasField("seq_range") and not whole.request.HasField("name")
    ranged = call_create_skill_proposal("s1", seq_range=(2, 9), name="fmt-check")
    assert ranged.body == {"from_session": "s1", "seq_range": {"from": "2", "to": "9"}, "name": "fmt-check"}
    assert (getattr(ranged.request.seq_range, "from"), ranged.request.seq_range.to) == (2, 9)

    promote = call_promote_skill_proposal("sp_0123456789ab")
    assert route(promote) == ("PromoteSkillProposal", "POST", "/skills/proposals/sp_0123456789ab/promote", {})
    assert promote.request.id == "sp_0123456789ab" and not promote.request.HasField("name")
    named = call_promote_skill_proposal("sp/x", scope="global", name="echo-twice")
    assert route(named) == (
        "PromoteSkillProposal",
        "POST",
        "/skills/proposals/sp%2Fx/promote",
        {"scope": "global", "name": "echo-twice"},
    )
    assert named.request.scope == agent_pb2.SKILL_SCOPE_GLOBAL
    with pytest.raises(VakError) as e:
        call_promote_skill_proposal("sp_0123456789ab", scope="home")
    assert (e.value.status, e.value.code) == (400, "invalid_argument") and "workspace, global" in e.value.message

    reject = call_reject_skill_proposal("sp_0123456789ab")
    assert route(reject) == ("RejectSkillProposal", "POST", "/skills/proposals/sp_0123456789ab/reject", {})
    assert reject.request.id == "sp_0123456789ab"


def test_an_explanation_a_proposal_and_a_goal_are_read_with_their_enums_by_name() -> None:
    ex = parse_json(
        '{"surface": "api", "reading": {"act": "change", "horizon": "now", "stakes": "high",'
        ' "evidence": ["file_changed", "approval"], "signals": [{"field": "act", "value": "change", "because": "word \\"delete\\""}]},'
        ' "engagement": {"mode": "plan", "tools": ["bash"], "approvals": ["bash"], "route": "offline/offline", "plan_first": true},'
        ' "baseline_diff": {"mode": "plan", "tools_withheld": [], "approvals_added": ["bash"], "plan_first": true}}',
        agent_pb2.IntentExplanation(),
    )
    assert (json_name(ex, "surface"), json_name(ex.reading, "act"), json_name(ex.reading, "stakes")) == ("api", "change", "high")
    kinds = [enum_json_name(agent_pb2.RequirementKind.DESCRIPTOR, k) for k in ex.reading.evidence]
    assert kinds == ["file_changed", "approval"] and ex.reading.signals[0].because == 'word "delete"'
    assert (json_name(ex.engagement, "mode"), ex.engagement.plan_first, ex.engagement.read_only) == ("plan", True, False)
    assert ex.baseline_diff.HasField("mode") and not parse_json("{}", agent_pb2.BaselineDiff()).HasField("mode")

    p = parse_json(
        '{"id": "sp_80fbd9658b7f", "name": "echo-one", "kind": "script", "source": {"session": "s1", "seqs": [2, 4]},'
        ' "duplicate_of": "echo", "tags": ["duplicate-of:echo"], "state": "pending"}',
        agent_pb2.SkillProposal(),
    )
    assert (json_name(p, "kind"), json_name(p, "state"), p.duplicate_of, list(p.source.seqs)) == ("script", "pending", "echo", [2, 4])

    t = parse_json(
        '{"seq": 7, "goal": {"objective": "o", "additions": ["also x"], "control": "paused",'
        ' "updates": [{"relation": "pause", "text": "pause", "at_seq": 6}]}}',
        agent_pb2.OutputTimeline(),
    )
    assert (json_name(t.goal, "control"), json_name(t.goal.updates[0], "relation"), t.goal.updates[0].at_seq) == ("paused", "pause", 6)
    assert not parse_json('{"seq": 1}', agent_pb2.OutputTimeline()).HasField("goal")
    assert json_name(parse_json('{"state": "applied"}', agent_pb2.Admission()), "state") == "applied"
