"""`Client.follow_many`: many sessions on one multiplexed stream, resumed
across connection losses with the cursor vector; follow/unfollow on the live
stream; a resync of one session resumed after its transcript."""

from __future__ import annotations

import re
from collections import defaultdict

from helpers import Proxy, Server, burst_text, kind, take_until

from vak_client import Client, Event, StreamItem, agent_pb2, json_name
from vak_client._common import parse_vector


def agent(item: StreamItem) -> Event | None:
    return item.message if item.kind == "agent" and isinstance(item.message, agent_pb2.Event) else None


class RunsDone:
    """A stop condition: every session in `sessions` has published run_finished."""

    def __init__(self, sessions: list[str]) -> None:
        self.waiting = set(sessions)

    def __call__(self, item: StreamItem) -> bool:
        ev = agent(item)
        if ev is not None and kind(ev) == "run_finished":
            self.waiting.discard(item.session_id)
        return not self.waiting


def per_session(items: list[StreamItem]) -> dict[str, list[Event]]:
    out: dict[str, list[Event]] = defaultdict(list)
    for item in items:
        ev = agent(item)
        if ev is not None:
            out[item.session_id].append(ev)
    return out


def assert_exact(events: list[Event], expected_text: str, first: int) -> None:
    seqs = [e.seq for e in events]
    assert seqs == list(range(first, first + len(seqs))), f"not gap-free from {first}: {seqs}"
    assert "".join(e.text_delta.text for e in events if kind(e) == "text_delta") == expected_text
    assert kind(events[-1]) == "run_finished" and json_name(events[-1].run_finished, "outcome") == "completed"


def test_follow_many_three_sessions(direct: Client, transport: str) -> None:
    sids = [direct.create_session() for _ in range(3)]
    with direct.follow_many(sids, transport=transport, host=True, config=True) as stream:  # type: ignore[arg-type]
        assert re.fullmatch(r"st_[0-9a-f]{32}", stream.stream_id), stream.stream_id
        assert parse_vector(stream.cursor) == {s: 0 for s in sids}
        for i, sid in enumerate(sids):
            direct.run(sid, f"hello {i}")
        items = take_until(stream, RunsDone(sids), stream)
    kinds = {i.kind for i in items}
    assert {"agent", "presentation", "coworking", "host", "config"} <= kinds, kinds
    host = next(i.message for i in items if i.kind == "host")
    assert isinstance(host, agent_pb2.HostInfo) and host.version
    config = next(i.message for i in items if i.kind == "config")
    assert isinstance(config, agent_pb2.ConfigInfo) and json_name(config, "permission_mode") == "default"
    by = per_session(items)
    for i, sid in enumerate(sids):
        assert_exact(by[sid], f"echo: hello {i}", first=1)
        assert all(e.session_id == sid for e in by[sid])
    assert parse_vector(stream.cursor) == {sid: by[sid][-1].seq for sid in sids}
    assert stream.duplicates_dropped == 0


def test_follow_many_resumes_across_connection_loss(
    server: Server, direct: Client, proxy: Proxy, transport: str
) -> None:
    sids = [direct.create_session() for _ in range(3)]
    cuts: list[str] = []
    deltas = [0]

    def hook(item: StreamItem) -> None:
        ev = agent(item)
        if ev is None:
            return
        if kind(ev) == "turn_started" and not cuts:
            cuts.append("turn")
            proxy.cut()
        elif kind(ev) == "text_delta":
            deltas[0] += 1
            if deltas[0] == 150:
                cuts.append("burst")
                proxy.cut()

    with Client(proxy.url, server.token, transport=transport) as via:  # type: ignore[arg-type]
        with via.follow_many(sids) as stream:
            first_stream = stream.stream_id
            for sid in sids:
                direct.run(sid, "/sleep 300\n/burst 200")
            items = take_until(stream, RunsDone(sids), stream, on_item=hook)
    assert cuts == ["turn", "burst"]
    assert stream.reconnects >= 1 and stream.stream_id != first_stream
    by = per_session(items)
    for sid in sids:
        assert_exact(by[sid], burst_text(200), first=1)
    assert stream.duplicates_dropped == 0, "the server resent frames at or below the cursor vector"
    assert parse_vector(stream.cursor) == {sid: by[sid][-1].seq for sid in sids}
    if transport == "sse":
        # Each reconnect sent the cursor vector of every followed session.
        for request in proxy.requests[1:]:
            m = re.search(rb"(?i)last-event-id: *([^\r\n]+)", request)
            assert m, request
            assert set(parse_vector(m.group(1).decode())) == set(sids)


def test_follow_many_resumes_from_a_given_cursor(direct: Client, transport: str) -> None:
    sids = [direct.create_session() for _ in range(2)]
    with direct.follow_many(sids, transport=transport) as stream:  # type: ignore[arg-type]
        for sid in sids:
            direct.run(sid, "one two")
        take_until(stream, RunsDone(sids), stream)
        full = stream.cursor
    # A later stream from an older vector replays exactly what follows it.
    older = ",".join(f"{sid}:4" for sid in sids)
    with direct.follow_many([], cursor=older, transport=transport) as replay:  # type: ignore[arg-type]
        assert replay.sessions == sids
        items = take_until(replay, RunsDone(sids), replay)
    by = per_session(items)
    for sid in sids:
        assert by[sid][0].seq == 5
        assert [e.seq for e in by[sid]] == list(range(5, by[sid][-1].seq + 1))
    assert replay.cursor == full


def test_follow_and_unfollow_on_the_live_stream(direct: Client, transport: str) -> None:
    a, b, c = (direct.create_session() for _ in range(3))
    direct.run(c, "earlier")
    earlier = take_until(
        direct.follow(c, after=0), lambda e: kind(e) == "run_finished", direct.follow(c)
    )
    with direct.follow_many([a], transport=transport) as stream:  # type: ignore[arg-type]
        assert stream.follow(b) == [a, b]
        assert stream.follow(c, after=0) == [a, b, c]  # replays c from the start
        assert stream.sessions == [a, b, c]
        direct.run(b, "to b")
        items = take_until(stream, RunsDone([b, c]), stream)
        by = per_session(items)
        assert_exact(by[b], "echo: to b", first=1)
        assert [e.seq for e in by[c]] == [e.seq for e in earlier]

        assert stream.unfollow(a) == [b, c]
        assert stream.sessions == [b, c]
        direct.run(a, "to a")
        direct.run(b, "to b again")
        later = take_until(stream, RunsDone([b]), stream)
    assert not [i for i in later if i.session_id == a], "frames of an unfollowed session"
    assert a not in parse_vector(stream.cursor)


def test_follow_many_resyncs_one_session_from_its_transcript(ring_server: Server, transport: str) -> None:
    with ring_server.client(transport=transport) as c:
        sids = [c.create_session() for _ in range(2)]
        with c.follow_many(sids) as stream:
            for sid in sids:
                c.run(sid, "/burst 20")
            take_until(stream, RunsDone(sids), stream)
            latest = parse_vector(stream.cursor)
        # The first entry is ahead of its session (a cursor from a home that was reset).
        stale = f"{sids[0]}:{latest[sids[0]] + 50},{sids[1]}:{latest[sids[1]]}"
        with c.follow_many(sids, cursor=stale) as stream:
            first = take_until(stream, lambda i: i.kind == "resync", stream)
            transcript = stream.transcripts[sids[0]]
            assert parse_vector(stream.cursor) == latest
            for sid in sids:
                c.run(sid, "again")
            items = take_until(stream, RunsDone(sids), stream)
    assert not [i for i in first if i.kind == "agent"], "no agent frame before the resync"
    resync = first[-1]
    assert resync.session_id == sids[0]
    assert isinstance(resync.message, agent_pb2.Event) and json_name(resync.message.resync, "reason") == "cursor_ahead"
    assert transcript.seq == latest[sids[0]]
    assert [m.text for m in transcript.messages if json_name(m, "role") == "assistant"] == [burst_text(20)]
    assert not [i for i in items if i.kind == "resync"]
    # Both sessions go on exactly after their entries: the resynced one after the transcript.
    for sid in sids:
        seqs = [e.seq for e in per_session(items)[sid]]
        assert seqs == list(range(latest[sid] + 1, latest[sid] + 1 + len(seqs))), (sid, seqs)
    assert stream.resyncs == 1
