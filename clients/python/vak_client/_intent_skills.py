"""The unary calls of intent, how a prompt reads before it runs, and of
learned skills (docs/protocol.md sections 39 and 41, issue 35): request
building for gRPC and REST, shared by the sync and the asyncio client."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable
from typing import Any, cast

from vak_client._common import UnaryCall, VakError, _request_enum, quote, to_json
from vak_client._gen import agent_pb2

# The evidence kinds `explain_intent` accepts, by their JSON names.
EVIDENCE = {
    "tool_ok": agent_pb2.REQUIREMENT_KIND_TOOL_OK,
    "file_changed": agent_pb2.REQUIREMENT_KIND_FILE_CHANGED,
    "approval": agent_pb2.REQUIREMENT_KIND_APPROVAL,
}


def call_explain_intent(
    prompt: str,
    *,
    surface: str | None = None,
    act: str | None = None,
    horizon: str | None = None,
    stakes: str | None = None,
    evidence: Iterable[str] | None = None,
) -> UnaryCall[agent_pb2.ExplainIntentRequest, agent_pb2.IntentExplanation]:
    # None leaves a parameter out: the server reads it from the prompt. Enum
    # values go by their JSON names; one no enum has is refused here (400), as
    # the server refuses it over REST, before any call.
    req = agent_pb2.ExplainIntentRequest(prompt=prompt)
    query = {"prompt": prompt}
    given = (
        ("surface", surface, agent_pb2.IntentSurface.DESCRIPTOR),
        ("act", act, agent_pb2.Act.DESCRIPTOR),
        ("horizon", horizon, agent_pb2.Horizon.DESCRIPTOR),
        ("stakes", stakes, agent_pb2.Stakes.DESCRIPTOR),
    )
    for field, value, enum in given:
        if value is not None:
            setattr(req, field, _request_enum(enum, value, field))
            query[field] = value
    if evidence is not None:
        if isinstance(evidence, str):
            raise TypeError("explain_intent: evidence is a list of kinds (tool_ok, file_changed, approval), not a str")
        kinds = list(evidence)
        for k in kinds:
            if k not in EVIDENCE:
                raise VakError(400, "invalid_argument", f"evidence {k!r} is not one of {', '.join(EVIDENCE)}")
        # Present and empty is "none" (`evidence=`); absent is "read it from the prompt".
        req.evidence.SetInParent()
        req.evidence.kinds.extend(cast("list[agent_pb2.RequirementKind]", [EVIDENCE[k] for k in kinds]))
        query["evidence"] = ",".join(kinds)
    path = "/intent/explain?" + urllib.parse.urlencode(query)
    return UnaryCall("ExplainIntent", req, agent_pb2.IntentExplanation, "GET", path)


def call_intent_policy() -> UnaryCall[agent_pb2.GetIntentPolicyRequest, agent_pb2.IntentPolicy]:
    return UnaryCall("GetIntentPolicy", agent_pb2.GetIntentPolicyRequest(), agent_pb2.IntentPolicy, "GET", "/intent/policy")


def call_list_skills(session_id: str | None = None) -> UnaryCall[agent_pb2.ListSkillsRequest, agent_pb2.SkillList]:
    # `session_id`: the skills that session's legs offer (its workspace's); None: the server's workspace's.
    if session_id is None:
        return UnaryCall("ListSkills", agent_pb2.ListSkillsRequest(), agent_pb2.SkillList, "GET", "/skills")
    path = "/skills?" + urllib.parse.urlencode({"session_id": session_id})
    return UnaryCall("ListSkills", agent_pb2.ListSkillsRequest(session_id=session_id), agent_pb2.SkillList, "GET", path)


def call_list_skill_proposals() -> UnaryCall[agent_pb2.ListSkillProposalsRequest, agent_pb2.SkillProposals]:
    return UnaryCall(
        "ListSkillProposals", agent_pb2.ListSkillProposalsRequest(), agent_pb2.SkillProposals, "GET", "/skills/proposals"
    )


def call_create_skill_proposal(
    from_session: str, *, seq_range: tuple[int, int] | None = None, name: str | None = None
) -> UnaryCall[agent_pb2.CreateSkillProposalRequest, agent_pb2.SkillProposal]:
    # `seq_range`: (from, to), inclusive; None: the whole session. `name`:
    # None makes it from the body's first words. The server checks both.
    given: dict[str, Any] = {"from_session": from_session}
    if seq_range is not None:
        first, last = seq_range
        given["seq_range"] = agent_pb2.SeqRange(**{"from": first, "to": last})
    if name is not None:
        given["name"] = name
    req = agent_pb2.CreateSkillProposalRequest(**given)
    return UnaryCall("CreateSkillProposal", req, agent_pb2.SkillProposal, "POST", "/skills/proposals", to_json(req))


def _proposal_path(proposal_id: str) -> str:
    return f"/skills/proposals/{quote(proposal_id)}"


def call_promote_skill_proposal(
    proposal_id: str, *, scope: str | None = None, name: str | None = None
) -> UnaryCall[agent_pb2.PromoteSkillProposalRequest, agent_pb2.Skill]:
    # `scope`: "workspace" (None: the server's default, the same) or "global".
    req = agent_pb2.PromoteSkillProposalRequest(id=proposal_id)
    if scope is not None:
        req.scope = cast("agent_pb2.SkillScope", _request_enum(agent_pb2.SkillScope.DESCRIPTOR, scope, "scope"))
    if name is not None:
        req.name = name
    body = to_json(req)
    body.pop("id", None)  # in the path
    return UnaryCall("PromoteSkillProposal", req, agent_pb2.Skill, "POST", _proposal_path(proposal_id) + "/promote", body)


def call_reject_skill_proposal(
    proposal_id: str,
) -> UnaryCall[agent_pb2.RejectSkillProposalRequest, agent_pb2.SkillProposal]:
    return UnaryCall(
        "RejectSkillProposal",
        agent_pb2.RejectSkillProposalRequest(id=proposal_id),
        agent_pb2.SkillProposal,
        "POST",
        _proposal_path(proposal_id) + "/reject",
        {},
    )
