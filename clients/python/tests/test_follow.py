"""`Client.follow`: one session's events over SSE and gRPC, resumed across
connection losses without a duplicate or a gap, and resynced from the
transcript."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
from helpers import (
    Proxy,
    Server,
    assert_gap_free,
    burst_text,
    deadline,
    finished,
    kind,
    take_until,
    texts,
    wait_finished,
)

from vak_client import Backoff, Client, Event, VakError, json_name


def test_follow_yields_the_whole_echo(direct: Client, transport: str) -> None:
    sid = direct.create_session()
    with direct.follow(sid, after=0, transport=transport) as events:  # type: ignore[arg-type]
        assert events.opened is not None and events.opened.session_id == sid
        direct.run(sid, "hello world\nbye")
        got = take_until(events, finished, events)
    assert [kind(e) for e in got[:3]] == ["status", "user_message", "turn_started"]
    assert texts(got) == "echo: hello world\necho: bye"
    assert all(e.session_id == sid for e in got)
    assert_gap_free(got, first=1)
    assert events.cursor == got[-1].seq
    assert events.reconnects == 0 and events.duplicates_dropped == 0


def test_live_follow_starts_at_the_latest_seq(direct: Client, transport: str) -> None:
    sid = direct.create_session()
    direct.run(sid, "first")
    first = wait_finished(direct, sid)
    with direct.follow(sid, transport=transport) as events:  # type: ignore[arg-type]
        # Live only: the cursor is the latest seq when the stream opened.
        assert events.cursor == first[-1].seq
        direct.run(sid, "second")
        got = take_until(events, finished, events)
    assert texts(got) == "echo: second"
    assert_gap_free(got, first=first[-1].seq + 1)


def test_follow_replays_after_a_cursor(direct: Client, transport: str) -> None:
    sid = direct.create_session()
    direct.run(sid, "one two")
    whole = wait_finished(direct, sid)
    with direct.follow(sid, after=4, transport=transport) as events:  # type: ignore[arg-type]
        got = take_until(events, finished, events)
    assert [e.seq for e in got] == [e.seq for e in whole if e.seq > 4]


def _cut_twice(proxy: Proxy) -> tuple[list[str], object]:
    """An on_item hook: cut at turn_started (the connection is idle during
    `/sleep`) and again at the 100th text delta (mid-burst)."""
    seen: list[str] = []

    def hook(ev: Event) -> None:
        k = kind(ev)
        if k == "turn_started" and "turn" not in seen:
            seen.append("turn")
            proxy.cut()
        elif k == "text_delta" and ev.text_delta.text == "t99 ":
            seen.append("burst")
            proxy.cut()

    return seen, hook


def test_follow_resumes_across_connection_loss(server: Server, direct: Client, proxy: Proxy, transport: str) -> None:
    sid = direct.create_session()
    cuts, hook = _cut_twice(proxy)
    with Client(proxy.url, server.token, transport=transport) as via:  # type: ignore[arg-type]
        with via.follow(sid, after=0) as events:
            direct.run(sid, "/sleep 300\n/burst 500")
            got = take_until(events, finished, events, on_item=hook)  # type: ignore[arg-type]
    assert cuts == ["turn", "burst"]
    assert events.reconnects >= 1, "the cut did not make the follower reconnect"
    assert proxy.accepted >= 2
    assert texts(got) == burst_text(500)
    assert_gap_free(got, first=1)
    assert events.duplicates_dropped == 0, "the server resent frames at or below the cursor"
    if transport == "sse":
        # Every reconnect resumed from the last seq handed over.
        resumed = [re.search(rb"(?i)last-event-id: *(\d+)", r) for r in proxy.requests[1:]]
        assert all(resumed), proxy.requests
        assert int(resumed[0].group(1)) >= 3  # type: ignore[union-attr]


def test_follow_resyncs_from_the_transcript_when_the_cursor_is_ahead(
    ring_server: Server, ring_proxy: Proxy, transport: str
) -> None:
    """A cursor ahead of the session (its home was reset, say) cannot be
    served: the stream starts with `resync`, the follower fetches the
    transcript and goes on after its seq (nothing of that stream is handed
    over), so the next run follows exactly. (A cursor merely older than the
    ring is replayed from the server's ledger, with no resync.)"""
    direct = ring_server.client()
    sid = direct.create_session()
    direct.run(sid, "/burst 40")
    done = wait_finished(direct, sid, after=0)
    latest = done[-1].seq
    backoff = Backoff(initial=0.02, maximum=0.2, give_up_after=30)
    with Client(ring_proxy.url, ring_server.token, transport=transport, backoff=backoff) as via:  # type: ignore[arg-type]
        with via.follow(sid, after=latest + 50) as events:
            resync = next(events)
            assert events.transcript is not None
            transcript = events.transcript
            direct.run(sid, "next")
            after = take_until(events, finished, events)
    assert kind(resync) == "resync"
    assert resync.seq == 0
    assert json_name(resync.resync, "reason") == "cursor_ahead"
    assert resync.resync.latest_seq == latest
    assert transcript.seq == latest
    assert [m.text for m in transcript.messages if json_name(m, "role") == "assistant"] == [burst_text(40)]
    # The new stream starts right after the transcript: the second run, whole.
    assert_gap_free(after, first=latest + 1)
    assert texts(after) == "echo: next"
    assert events.cursor == after[-1].seq
    assert events.resyncs == 1
    direct.close()


def test_follow_retries_until_the_server_is_back(server: Server, direct: Client, proxy: Proxy, transport: str) -> None:
    sid = direct.create_session()
    backoff = Backoff(initial=0.02, maximum=0.2, give_up_after=30)
    with Client(proxy.url, server.token, transport=transport, backoff=backoff) as via:  # type: ignore[arg-type]
        events = via.follow(sid, after=0)
        events.open()
        proxy.hold()
        result: list[list[Event]] = []
        consumer = threading.Thread(target=lambda: result.append(take_until(events, finished, events)), daemon=True)
        consumer.start()  # its reads fail, then its reconnects are refused
        proxy.wait_refused(3)
        direct.run(sid, "hello again")
        proxy.release()
        consumer.join(30)
        events.close()
    assert result, "the follower did not deliver the run"
    assert texts(result[0]) == "echo: hello again"
    assert_gap_free(result[0], first=1)
    assert events.reconnects == 1


def test_follow_an_old_cursor_is_replayed_and_one_ahead_resyncs(ring_server: Server, transport: str) -> None:
    with ring_server.client(transport=transport) as c:
        sid = c.create_session()
        c.run(sid, "/burst 20")
        latest = wait_finished(c, sid)[-1].seq
        # Older than the ring: the server replays it from its ledger, exactly.
        with c.follow(sid, after=1) as events:
            old = take_until(events, finished, events)
        assert_gap_free(old, first=2)
        assert old[-1].seq == latest and events.resyncs == 0
        # Ahead of the session: resync, the transcript, then on after its seq.
        with c.follow(sid, after=latest + 100) as events:
            resync = next(events)
            transcript = events.transcript
            c.run(sid, "more")
            got = take_until(events, finished, events)
    assert kind(resync) == "resync"
    assert json_name(resync.resync, "reason") == "cursor_ahead"
    assert transcript is not None and transcript.seq == latest
    assert [m.text for m in transcript.messages if json_name(m, "role") == "assistant"] == [burst_text(20)]
    # After the resync the stream goes on after the transcript's seq, even
    # below a cursor that was ahead; no retained frame is handed over again.
    assert_gap_free(got, first=latest + 1)
    assert texts(got) == "echo: more"
    assert events.duplicates_dropped == 0 and events.resyncs == 1


def test_follow_errors_that_retrying_cannot_fix(server: Server, transport: str) -> None:
    with server.client(transport=transport) as c:
        with pytest.raises(VakError) as err:
            c.follow("nosuch").open()
        assert (err.value.status, err.value.code) == (404, "not_found")
        with pytest.raises(VakError) as err:
            next(iter(c.follow("bad.id")))
        assert err.value.status == 400
    with Client(server.url, "wrong", transport=transport) as wrong:  # type: ignore[arg-type]
        with pytest.raises(VakError) as err:
            wrong.follow("nosuch").open()
        assert err.value.status == 401


def test_follow_gives_up_on_a_dead_server(transport: str) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backoff = Backoff(initial=0.01, maximum=0.05, give_up_after=0.5)
    with Client(f"http://127.0.0.1:{port}", "t", transport=transport, backoff=backoff) as c:  # type: ignore[arg-type]
        follower = c.follow("abc")
        with deadline(20, follower) as fired, pytest.raises(VakError) as err:
            follower.open()
        assert not fired.is_set()
    assert err.value.status == 503
    assert "HTTP" not in str(err.value) and "connection refused" in str(err.value).lower(), err.value


def test_close_from_another_thread_ends_iteration(direct: Client, transport: str) -> None:
    sid = direct.create_session()
    events = direct.follow(sid, transport=transport)  # type: ignore[arg-type]
    events.open()
    started = threading.Event()
    result: list[object] = []

    def consume() -> None:
        started.set()
        result.append(list(events))

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    started.wait(5)
    events.close()
    t.join(10)
    assert not t.is_alive() and result == [[]]


def test_follow_resumes_across_a_server_crash_and_restart(tmp_path: Path, transport: str) -> None:
    """SIGKILL mid-run, a new server on the same home: the follower resumes
    from the ledger-backed ring and sees the interrupted run settle."""
    first = Server(tmp_path)
    second: Server | None = None
    proxy = Proxy(first.port)
    backoff = Backoff(initial=0.02, maximum=0.2, give_up_after=30)
    try:
        with first.client() as direct:
            sid = direct.create_session()
        with Client(proxy.url, first.token, transport=transport, backoff=backoff) as via:  # type: ignore[arg-type]
            with via.follow(sid, after=0) as events:
                with first.client() as direct:
                    direct.run(sid, "before\n/sleep 60000")
                before = take_until(events, lambda e: kind(e) == "text_delta" and e.text_delta.text == "before", events)
                first.kill()
                second = Server(tmp_path, token=first.token)
                proxy.retarget(second.port)
                after = take_until(events, finished, events)
        got = before + after
        assert_gap_free(got, first=1)
        assert texts(got) == "echo: before"
        assert json_name(got[-1].run_finished, "outcome") == "failed"
        assert got[-1].run_finished.message == "interrupted: the server stopped during this run"
        assert events.reconnects >= 1 and events.duplicates_dropped == 0
        assert second.terminate() == 0
    finally:
        proxy.close()
        first.kill()
        if second is not None:
            second.kill()


def test_session_closed_ends_the_follower(tmp_path: Path, transport: str) -> None:
    server = Server(tmp_path)
    try:
        with server.client(transport=transport) as c:
            sid = c.create_session()
            with c.follow(sid, after=0) as events:
                c.run(sid, "/sleep 60000")
                take_until(events, lambda e: kind(e) == "turn_started", events)
                stopper = threading.Thread(target=lambda: result.append(server.terminate()), daemon=True)
                result: list[int] = []
                stopper.start()
                with deadline(20, events) as fired:
                    rest = list(events)
                assert not fired.is_set()
            stopper.join(20)
        assert result == [0]
        assert [kind(e) for e in rest][-3:] == ["status", "run_finished", "session_closed"]
        assert json_name(rest[-2].run_finished, "outcome") == "cancelled"
        assert rest[-1].session_closed.reason == "server shutting down"
    finally:
        server.kill()
