"""`AsyncClient`: the unary calls, follow and follow_many over both
transports, and resuming across a connection loss. Each test runs its own
event loop under a deadline."""

from __future__ import annotations

import asyncio
import secrets

import pytest
from helpers import Proxy, Server, assert_gap_free, burst_text, kind, texts
from helpers import run_async as run
from helpers import take_until_async as take_until

from vak_client import AsyncClient, Backoff, Event, StreamItem, VakError, agent_pb2, json_name
from vak_client._common import parse_vector


def finished(ev: Event) -> bool:
    return kind(ev) == "run_finished"


def agent(item: StreamItem) -> Event | None:
    return item.message if item.kind == "agent" and isinstance(item.message, agent_pb2.Event) else None


def test_async_unary_calls(server: Server, unary: str) -> None:
    async def main() -> None:
        async with AsyncClient(server.url, server.token, unary=unary) as c:  # type: ignore[arg-type]
            sid = await c.create_session()
            assert sid in {s.session_id for s in await c.list_sessions()}
            assert (await c.attach(sid)).loaded
            name = f"a-{secrets.token_hex(4)}.txt"
            async with c.follow(sid, after=0) as events:
                admission = await c.run(sid, f"/write {name} hi\n/sleep 60000", request_id="r1")
                assert json_name(admission, "state") == "started"
                requested = await take_until(events, lambda e: kind(e) == "approval_requested")
                rid = requested[-1].approval_requested.request_id
                assert json_name(await c.approve(sid, rid, True), "outcome") == "approved"
                await take_until(events, lambda e: kind(e) == "tool_result")
                assert json_name(await c.steer(sid, "later"), "state") == "queued"
                cancelled = await c.cancel(sid)
                assert cancelled.cancelled and cancelled.discarded == 1
                got = await take_until(events, finished)
            assert json_name(got[-1].run_finished, "outcome") == "cancelled"
            assert (server.workspace / name).read_text() == "hi"
            transcript = await c.transcript(sid)
            assert [json_name(m, "role") for m in transcript.messages][:2] == ["user", "tool"]
            assert (await c.transcript_markdown(sid)).startswith(f"# Session {sid}")
            assert (await c.presentation(sid)).schema_version == 2
            with pytest.raises(VakError) as err:
                await c.run("nosuch", "x")
            assert (err.value.status, err.value.code) == (404, "not_found")
            with pytest.raises(VakError) as err:
                await c.approve(sid, rid, False)
            assert err.value.status == 409

    run(main)


def test_async_run_and_follow(server: Server, transport: str) -> None:
    async def main() -> None:
        async with AsyncClient(server.url, server.token, transport=transport) as c:  # type: ignore[arg-type]
            sid = await c.create_session()
            async with c.follow(sid, after=0) as events:
                await c.run(sid, "hello world\nbye")
                got = await take_until(events, finished)
            assert texts(got) == "echo: hello world\necho: bye"
            assert_gap_free(got, first=1)
            assert events.cursor == got[-1].seq and events.closed

            # A live follow after the run starts at its end.
            async with c.follow(sid) as live:
                assert live.cursor == got[-1].seq
                await c.run(sid, "/burst 300")
                more = await take_until(live, finished)
            assert texts(more) == burst_text(300)
            assert_gap_free(more, first=got[-1].seq + 1)

    run(main)


def test_async_follow_resumes_across_connection_loss(server: Server, proxy: Proxy, transport: str) -> None:
    async def main() -> None:
        async with (
            AsyncClient(server.url, server.token) as direct,
            AsyncClient(proxy.url, server.token, transport=transport) as via,  # type: ignore[arg-type]
        ):
            sid = await direct.create_session()
            cuts: list[str] = []

            def hook(ev: Event) -> None:
                if kind(ev) == "turn_started" and not cuts:
                    cuts.append("turn")
                    proxy.cut()
                elif kind(ev) == "text_delta" and ev.text_delta.text == "t99 ":
                    cuts.append("burst")
                    proxy.cut()

            async with via.follow(sid, after=0) as events:
                await direct.run(sid, "/sleep 300\n/burst 500")
                got = await take_until(events, finished, on_item=hook)
            assert cuts == ["turn", "burst"]
            assert events.reconnects >= 1
            assert texts(got) == burst_text(500)
            assert_gap_free(got, first=1)
            assert events.duplicates_dropped == 0

    run(main)


def test_async_follow_retries_until_the_server_is_back(server: Server, proxy: Proxy, transport: str) -> None:
    async def main() -> None:
        backoff = Backoff(initial=0.02, maximum=0.2, give_up_after=30)
        async with (
            AsyncClient(server.url, server.token) as direct,
            AsyncClient(proxy.url, server.token, transport=transport, backoff=backoff) as via,  # type: ignore[arg-type]
        ):
            sid = await direct.create_session()
            async with via.follow(sid, after=0) as events:
                proxy.hold()
                consumer = asyncio.create_task(take_until(events, finished))
                await asyncio.to_thread(proxy.wait_refused, 3)
                await direct.run(sid, "back again")
                proxy.release()
                got = await consumer
            assert texts(got) == "echo: back again"
            assert_gap_free(got, first=1)
            assert events.reconnects == 1

    run(main)


def test_async_follow_many(server: Server, proxy: Proxy, transport: str) -> None:
    async def main() -> None:
        async with (
            AsyncClient(server.url, server.token) as direct,
            AsyncClient(proxy.url, server.token, transport=transport) as via,  # type: ignore[arg-type]
        ):
            sids = [await direct.create_session() for _ in range(3)]
            waiting = set(sids)
            cuts: list[int] = []
            deltas = [0]

            def stop(item: StreamItem) -> bool:
                ev = agent(item)
                if ev is not None and kind(ev) == "run_finished":
                    waiting.discard(item.session_id)
                return not waiting

            def hook(item: StreamItem) -> None:
                # Cut while the first run sleeps (the stream is idle: a
                # reconnect is certain), then again mid-burst.
                ev = agent(item)
                if ev is not None and kind(ev) == "turn_started" and not cuts:
                    cuts.append(0)
                    proxy.cut()
                elif ev is not None and kind(ev) == "text_delta":
                    deltas[0] += 1
                    if deltas[0] == 300:
                        cuts.append(deltas[0])
                        proxy.cut()

            async with via.follow_many(sids[:2]) as stream:
                first_id = stream.stream_id
                assert await stream.follow(sids[2]) == sids
                for sid in sids:
                    await direct.run(sid, "/sleep 300\n/burst 200")
                items = await take_until(stream, stop, on_item=hook)
                assert cuts == [0, 300]
                assert stream.reconnects >= 1 and stream.stream_id != first_id
                assert await stream.unfollow(sids[0]) == sids[1:]
            by: dict[str, list[Event]] = {s: [] for s in sids}
            for item in items:
                ev = agent(item)
                if ev is not None:
                    by[item.session_id].append(ev)
            for sid in sids:
                assert texts(by[sid]) == burst_text(200)
                assert_gap_free(by[sid], first=1)
            assert stream.duplicates_dropped == 0
            assert set(parse_vector(stream.cursor)) == set(sids[1:])

    run(main)


def test_async_follow_errors(server: Server, transport: str) -> None:
    async def main() -> None:
        async with AsyncClient(server.url, server.token, transport=transport) as c:  # type: ignore[arg-type]
            with pytest.raises(VakError) as err:
                await c.follow("nosuch").open()
            assert err.value.status == 404
            with pytest.raises(VakError) as err:
                await c.follow_many(["nosuch"]).open()
            assert err.value.status == 404
        async with AsyncClient(server.url, "wrong", transport=transport) as bad:  # type: ignore[arg-type]
            with pytest.raises(VakError) as err:
                async for _ in bad.follow("x"):
                    pass
            assert err.value.status == 401

    run(main)


def test_async_unreachable_server_says_so() -> None:
    import socket

    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def main() -> None:
        async with AsyncClient(f"http://127.0.0.1:{port}", "t", unary="rest", timeout=5) as c:
            with pytest.raises(VakError) as err:
                await c.list_sessions()
        assert str(err.value) == f"could not connect to http://127.0.0.1:{port}: connection refused (GET /sessions)"
        assert (err.value.status, err.value.reached, err.value.retryable) == (503, False, True)

    run(main)
