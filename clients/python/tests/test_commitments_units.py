"""The commitment calls without a server: what each sends over gRPC and REST
(routes, the close's body without the id the path carries, a bad verdict
refused before any call), how a commitment's REST/SSE JSON is read (enums by
their JSON names), and a refusal's `reason` read from either transport."""

from __future__ import annotations

import grpc
import pytest

from vak_client import VakError, agent_pb2, json_name
from vak_client._commitments import call_close_commitment, call_get_commitment, call_list_commitments
from vak_client._common import grpc_error, parse_json, rest_error


def route(c: object) -> tuple[str, str, str, object]:
    return (c.rpc, c.http_method, c.path, c.body)  # type: ignore[attr-defined]


def test_calls_map_onto_their_routes() -> None:
    assert route(call_list_commitments()) == ("ListCommitments", "GET", "/commitments", None)
    every = call_list_commitments(all=True)
    assert route(every) == ("ListCommitments", "GET", "/commitments?all=true", None) and every.request.all
    assert route(call_get_commitment("s1.tests")) == ("GetCommitment", "GET", "/commitments/s1.tests", None)
    close = call_close_commitment("s1.tests", "fulfilled")
    assert route(close) == ("CloseCommitment", "POST", "/commitments/s1.tests/close", {"verdict": "fulfilled"})
    assert (close.request.id, close.request.verdict) == ("s1.tests", agent_pb2.VERDICT_FULFILLED)
    noted = call_close_commitment("s1/x", "abandoned", "kept the build")
    assert route(noted) == ("CloseCommitment", "POST", "/commitments/s1%2Fx/close", {"verdict": "abandoned", "note": "kept the build"})


def test_a_bad_verdict_is_refused_before_any_call() -> None:
    for bad in ("done", "", "FULFILLED"):
        with pytest.raises(VakError) as e:
            call_close_commitment("s1.tests", bad)
        assert (e.value.status, e.value.code) == (400, "invalid_argument")
        assert "fulfilled, abandoned, superseded" in e.value.message


def test_a_commitment_event_is_read_with_its_enums_by_name() -> None:
    ev = parse_json(
        '{"seq": 9, "commitment": {"change": "closed", "commitment": {"id": "s1.wipe", "item": "wipe",'
        ' "status": "in_progress", "stakes": "high", "requires": [{"kind": "tool_ok", "tool": "bash"}],'
        ' "evidence": ["call_1"], "created_seq": 5, "closed": {"verdict": "abandoned", "note": "n", "at": "t"}}}}',
        agent_pb2.Event(),
    )
    c = ev.commitment.commitment
    assert json_name(ev.commitment, "change") == "closed"
    assert (json_name(c, "status"), json_name(c, "stakes"), json_name(c.requires[0], "kind")) == ("in_progress", "high", "tool_ok")
    assert (json_name(c.closed, "verdict"), c.closed.note, list(c.evidence), c.created_seq) == ("abandoned", "n", ["call_1"], 5)
    listing = parse_json('{"priorities": [{"id": "s1.tests", "score": "20", "reasons": ["stakes: medium (+20)"]}]}', agent_pb2.CommitmentList())
    assert (listing.priorities[0].score, list(listing.priorities[0].reasons)) == (20, ["stakes: medium (+20)"])


def test_a_refusal_s_reason_is_read_from_either_transport() -> None:
    body = b'{"error":{"code":"conflict","reason":"evidence_missing","message":"cannot be closed as fulfilled: Missing: x"}}'
    r = rest_error(409, body)
    assert (r.status, r.code, r.reason, r.message) == (409, "conflict", "evidence_missing", "cannot be closed as fulfilled: Missing: x")
    assert rest_error(404, b'{"error":{"code":"not_found","message":"no such"}}').reason == ""
    g = grpc_error(grpc.StatusCode.FAILED_PRECONDITION, "already closed", "already_closed")
    assert (g.status, g.code, g.reason) == (409, "conflict", "already_closed")
    assert grpc_error(grpc.StatusCode.NOT_FOUND, "x").reason == ""
