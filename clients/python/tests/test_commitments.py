"""Commitments, the plan the model keeps (docs/protocol.md section 38), over
gRPC and over REST (the `unary` fixture), against a server of their own in
the bypass mode (so `/bash` runs without an approval): the offline model's
`/plan-items` makes commitments, streamed as `commitment` events and listed
with their priorities; closing one as fulfilled without evidence is refused
with reason `evidence_missing` naming what is missing, and with a failed
`/bash` cited too; with a successful `/bash` cited it closes; `abandoned`
always closes, and a second close is `already_closed`; bad ids and verdicts
are refused."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping

import pytest
from helpers import STEP, Server, finished, kind, serving, take_until
from helpers import run_async as run
from helpers import take_until_async

from vak_client import AsyncClient, Client, Event, VakError, agent_pb2, json_name

TESTS = {"id": "tests", "text": "run the tests", "status": "pending", "requires": [{"kind": "tool_ok", "tool": "bash"}]}
WIPE = {"id": "wipe", "text": "delete the build folder", "status": "in_progress"}
MISSING_BASH = "tool_ok: a cited `bash` call that ended successfully"


@pytest.fixture(scope="module")
def plan_vak(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = Server(tmp_path_factory.mktemp("vak-commitments"), "--allow-bypass", "--permission-mode", "bypass")
    yield from serving(server)


@pytest.fixture
def pc(plan_vak: Server, unary: str) -> Iterator[Client]:
    with plan_vak.client(unary=unary) as c:
        yield c


def plan_items(*items: Mapping[str, object]) -> str:
    return "/plan-items " + json.dumps([dict(i) for i in items])


def run_to_end(c: Client, sid: str, prompt: str) -> list[Event]:
    """Runs `prompt` in `sid`; the session's events up to the run's end (it must complete)."""
    with c.follow(sid) as events:
        c.run(sid, prompt)
        got = take_until(events, finished, events)
    assert json_name(got[-1].run_finished, "outcome") == "completed", got[-1]
    return got


def commitment_events(events: list[Event]) -> list[tuple[str, str]]:
    return [(json_name(e.commitment, "change"), e.commitment.commitment.item) for e in events if kind(e) == "commitment"]


def of_session(commitments: Iterable[agent_pb2.Commitment], sid: str) -> dict[str, agent_pb2.Commitment]:
    """The commitments of one session (the server lists every session's), by item."""
    return {c.item: c for c in commitments if c.session_id == sid}


def test_plan_items_are_commitments_listed_with_their_priorities(pc: Client, plan_vak: Server) -> None:
    sid = pc.create_session()
    got = run_to_end(pc, sid, plan_items(TESTS, WIPE))
    assert commitment_events(got) == [("created", "tests"), ("created", "wipe")]
    created = [e.commitment.commitment for e in got if kind(e) == "commitment"][0]
    assert created.id == f"{sid}.tests" and created.session_id == sid and created.text == "run the tests"
    assert [json_name(r, "kind") for r in created.requires] == ["tool_ok"] and created.requires[0].tool == "bash"

    listing = pc.list_commitments()
    assert os.path.realpath(listing.workspace) == os.path.realpath(plan_vak.workspace)
    mine = of_session(listing.commitments, sid)
    assert list(mine) == ["tests", "wipe"], "in their natural order (the plan's)"
    tests, wipe = mine["tests"], mine["wipe"]
    assert (json_name(tests, "status"), json_name(tests, "stakes")) == ("pending", "medium")
    # "delete" makes the stakes high, read from the text.
    assert (json_name(wipe, "status"), json_name(wipe, "stakes")) == ("in_progress", "high")
    assert not tests.HasField("closed") and not wipe.HasField("closed")
    assert list(tests.evidence) == [] and tests.created_seq > 0
    # The open ones, highest score first, each with why.
    ranked = [p for p in listing.priorities if p.id.startswith(sid + ".")]
    assert [p.id for p in ranked] == [f"{sid}.wipe", f"{sid}.tests"]
    assert (ranked[0].score, list(ranked[0].reasons)) == (35, ["stakes: high (+30)", "in progress (+5)"])
    assert (ranked[1].score, list(ranked[1].reasons)) == (20, ["stakes: medium (+20)"])
    # all=True lists every workspace's: the same ones, no workspace named.
    everywhere = pc.list_commitments(all=True)
    assert everywhere.workspace == "" and list(of_session(everywhere.commitments, sid)) == ["tests", "wipe"]

    detail = pc.get_commitment(f"{sid}.tests")
    assert detail.commitment.id == f"{sid}.tests"
    assert list(detail.missing) == [MISSING_BASH]
    assert [(json_name(e, "change"), e.commitment.item) for e in detail.events] == [("created", "tests")]
    assert detail.events[0].seq == tests.created_seq


def test_fulfilled_needs_the_cited_evidence_abandoned_always_closes(pc: Client) -> None:
    sid = pc.create_session()
    run_to_end(pc, sid, plan_items(TESTS, WIPE))

    # Nothing cited: refused, naming what is missing.
    with pytest.raises(VakError) as e:
        pc.close_commitment(f"{sid}.tests", "fulfilled")
    assert (e.value.status, e.value.code, e.value.reason) == (409, "conflict", "evidence_missing")
    assert MISSING_BASH in e.value.message and "it cites no tool call" in e.value.message, e.value.message
    assert not pc.get_commitment(f"{sid}.tests").commitment.HasField("closed")

    # A failed bash run cited counts for nothing, and the refusal says what it was.
    run_to_end(pc, sid, "/bash exit 3\n" + plan_items({"id": "tests", "status": "in_progress", "evidence": ["$last"]}))
    with pytest.raises(VakError) as e:
        pc.close_commitment(f"{sid}.tests", "fulfilled")
    assert e.value.reason == "evidence_missing" and "(bash call, failed)" in e.value.message, e.value.message

    # A successful one closes it.
    got = run_to_end(pc, sid, "/bash echo ok\n" + plan_items({"id": "tests", "status": "done", "evidence": ["$last"]}))
    assert commitment_events(got) == [("updated", "tests")]
    detail = pc.get_commitment(f"{sid}.tests")
    assert list(detail.missing) == [] and len(detail.commitment.evidence) == 2
    closed = pc.close_commitment(f"{sid}.tests", "fulfilled", "the tests pass")
    assert closed.id == f"{sid}.tests" and json_name(closed, "status") == "done"
    assert (json_name(closed.closed, "verdict"), closed.closed.note) == ("fulfilled", "the tests pass")
    assert closed.closed.at

    # abandoned closes whatever was cited; the first close stands.
    abandoned = pc.close_commitment(f"{sid}.wipe", "abandoned", "kept the build")
    assert (json_name(abandoned.closed, "verdict"), abandoned.closed.note) == ("abandoned", "kept the build")
    with pytest.raises(VakError) as e:
        pc.close_commitment(f"{sid}.wipe", "superseded")
    assert (e.value.status, e.value.reason) == (409, "already_closed")

    # Both closed: listed so, and neither is ranked any more.
    listing = pc.list_commitments()
    mine = of_session(listing.commitments, sid)
    assert {k: json_name(c.closed, "verdict") for k, c in mine.items()} == {"tests": "fulfilled", "wipe": "abandoned"}
    assert not [p for p in listing.priorities if p.id.startswith(sid + ".")]
    # The closes are the commitments' last events.
    changes = [(json_name(e, "change"), json_name(e.commitment, "status")) for e in pc.get_commitment(f"{sid}.tests").events]
    assert changes == [("created", "pending"), ("updated", "in_progress"), ("updated", "done"), ("closed", "done")]


def test_bad_ids_and_verdicts_are_refused(pc: Client) -> None:
    sid = pc.create_session()
    with pytest.raises(VakError) as e:
        pc.close_commitment(f"{sid}.tests", "done")
    assert (e.value.status, e.value.code) == (400, "invalid_argument")
    assert "fulfilled, abandoned, superseded" in e.value.message, e.value.message
    for bad in ("no-dot", f"{sid}.", f"{sid}.bad item"):
        with pytest.raises(VakError) as e:
            pc.get_commitment(bad)
        assert e.value.status == 400, (bad, e.value)
    with pytest.raises(VakError) as e:
        pc.get_commitment(f"{sid}.nosuch")
    assert e.value.status == 404
    with pytest.raises(VakError) as e:
        pc.close_commitment(f"{'0' * 32}.tests", "abandoned")
    assert e.value.status == 404


def test_async_client(plan_vak: Server, unary: str) -> None:
    async def main() -> None:
        async with AsyncClient(plan_vak.url, plan_vak.token, unary=unary) as c:  # type: ignore[arg-type]
            sid = await c.create_session()
            async with c.follow(sid) as events:
                await c.run(sid, plan_items(TESTS, WIPE))
                await take_until_async(events, finished, timeout=STEP)
                listing = await c.list_commitments()
                assert list(of_session(listing.commitments, sid)) == ["tests", "wipe"]
                assert [p.id for p in listing.priorities if p.id.startswith(sid + ".")] == [f"{sid}.wipe", f"{sid}.tests"]
                assert list((await c.get_commitment(f"{sid}.tests")).missing) == [MISSING_BASH]
                with pytest.raises(VakError) as e:
                    await c.close_commitment(f"{sid}.tests", "fulfilled")
                assert (e.value.status, e.value.reason) == (409, "evidence_missing")
                closed = await c.close_commitment(f"{sid}.wipe", "abandoned")
                assert json_name(closed.closed, "verdict") == "abandoned"
                # The close reaches the session's stream as a commitment event.
                got = await take_until_async(events, lambda ev: kind(ev) == "commitment", timeout=STEP)
            ev = got[-1].commitment
            assert (json_name(ev, "change"), ev.commitment.item, json_name(ev.commitment.closed, "verdict")) == (
                "closed",
                "wipe",
                "abandoned",
            )
            with pytest.raises(VakError) as e:
                await c.close_commitment(f"{sid}.wipe", "abandoned")
            assert e.value.reason == "already_closed"

    run(main)
