"""Resync trials for tests/it/resync.rs (not a pytest module: the Rust test drives it).

    python resync_trials.py <base-url> <token>

The Rust test owns the server, the session and its run, and a proxy in
front of the server (`base-url`) that can hold the server's bytes. For each
line `{"trial": N, "session": S}` on stdin this starts two followers of S
through the proxy, one with a cursor older than the ring (1) and one ahead
of the session, and once both have seen the run end prints one line
`{"trial": N, "variant": V, "followers": [{"start", "text", "resyncs",
"reasons", "duplicates"}, ...]}`: the assistant text each follower ends with (the
transcript handed over with a resync, then the deltas that follow it) and
the resyncs it saw. Trial N uses variant N mod 8: the blocking or the
asyncio client, `follow` or `follow_many`, over SSE or gRPC, so one process
covers the shared resume logic (`_follow.py`) with both drivers. It prints
`{"ready": true}` first, once its connections are up.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from concurrent.futures import Future
from typing import Any

from vak_client import AsyncClient, Backoff, Client, agent_pb2, json_name

AHEAD = 1_000_000_000
STARTS = {"too_old": 1, "ahead": AHEAD}
VARIANTS = [
    (driver, kind, transport)
    for driver in ("sync", "async")
    for kind in ("follow", "follow_many")
    for transport in ("sse", "grpc")
]
BACKOFF = Backoff(initial=0.02, maximum=0.5, give_up_after=30)


def assistant_text(t: agent_pb2.Transcript) -> str:
    return "".join(m.text for m in t.messages if json_name(m, "role") == "assistant")


def run_over(t: agent_pb2.Transcript) -> bool:
    """The test's runs end cancelled, which the transcript records as a `run` entry."""
    return any(json_name(m, "role") == "run" for m in t.messages)


class Tally:
    """What one follower ends with."""

    def __init__(self, start: str) -> None:
        self.start = start
        self.text = ""
        self.resyncs = 0
        self.reasons: list[str] = []
        self.duplicates = 0

    def resync(self, ev: agent_pb2.Event, t: agent_pb2.Transcript | None) -> bool:
        """Shows the transcript in place of what was there; True when the run is over."""
        assert t is not None, "a resync is handed over with its transcript"
        self.resyncs += 1
        self.reasons.append(json_name(ev.resync, "reason"))
        self.text = assistant_text(t)
        return run_over(t)

    def event(self, ev: agent_pb2.Event) -> bool:
        """Applies a session event; True when the run is over."""
        kind = ev.WhichOneof("kind")
        if kind == "text_delta":
            self.text += ev.text_delta.text
        return bool(kind == "run_finished")

    def result(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "text": self.text,
            "resyncs": self.resyncs,
            "reasons": self.reasons,
            "duplicates": self.duplicates,
        }


def sync_follow(client: Client, sid: str, start: str, kind: str, transport: Any) -> dict[str, Any]:
    tally = Tally(start)
    after = STARTS[start]
    if kind == "follow":
        with client.follow(sid, after=after, transport=transport) as events:
            for ev in events:
                if ev.WhichOneof("kind") == "resync":
                    if tally.resync(ev, events.transcript):
                        break
                elif tally.event(ev):
                    break
            tally.duplicates = events.duplicates_dropped
    else:
        with client.follow_many([sid], cursor=f"{sid}:{after}", transport=transport) as stream:
            for session_id, item, message in stream:
                assert session_id == sid
                if item == "resync":
                    assert isinstance(message, agent_pb2.Event)
                    if tally.resync(message, stream.transcripts.get(sid)):
                        break
                elif item == "agent":
                    assert isinstance(message, agent_pb2.Event)
                    if tally.event(message):
                        break
            tally.duplicates = stream.duplicates_dropped
    return tally.result()


async def async_follow(client: AsyncClient, sid: str, start: str, kind: str, transport: Any) -> dict[str, Any]:
    tally = Tally(start)
    after = STARTS[start]
    if kind == "follow":
        async with client.follow(sid, after=after, transport=transport) as events:
            async for ev in events:
                if ev.WhichOneof("kind") == "resync":
                    if tally.resync(ev, events.transcript):
                        break
                elif tally.event(ev):
                    break
            tally.duplicates = events.duplicates_dropped
    else:
        async with client.follow_many([sid], cursor=f"{sid}:{after}", transport=transport) as stream:
            async for session_id, item, message in stream:
                assert session_id == sid
                if item == "resync":
                    assert isinstance(message, agent_pb2.Event)
                    if tally.resync(message, stream.transcripts.get(sid)):
                        break
                elif item == "agent":
                    assert isinstance(message, agent_pb2.Event)
                    if tally.event(message):
                        break
            tally.duplicates = stream.duplicates_dropped
    return tally.result()


def main() -> None:
    url, token = sys.argv[1], sys.argv[2]
    client = Client(url, token, backoff=BACKOFF)
    # The asyncio client lives in a loop of its own, on its own thread.
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    async def make() -> AsyncClient:
        return AsyncClient(url, token, backoff=BACKOFF)

    aclient = asyncio.run_coroutine_threadsafe(make(), loop).result()
    # Connect both gRPC channels now: a new HTTP/2 connection waits for the
    # server's SETTINGS, which the proxy may be holding when a trial starts.
    client.list_sessions()
    asyncio.run_coroutine_threadsafe(aclient.list_sessions(), loop).result()
    print(json.dumps({"ready": True}), flush=True)

    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        trial, sid = req["trial"], req["session"]
        driver, kind, transport = VARIANTS[trial % len(VARIANTS)]
        futures: list[Future[dict[str, Any]]] = []
        for start in STARTS:
            if driver == "sync":
                fut: Future[dict[str, Any]] = Future()

                def work(start: str = start, fut: Future[dict[str, Any]] = fut) -> None:
                    try:
                        fut.set_result(sync_follow(client, sid, start, kind, transport))
                    except BaseException as err:
                        fut.set_exception(err)

                threading.Thread(target=work, daemon=True).start()
                futures.append(fut)
            else:
                futures.append(
                    asyncio.run_coroutine_threadsafe(async_follow(aclient, sid, start, kind, transport), loop)
                )
        followers = [f.result(timeout=60) for f in futures]
        out = {"trial": trial, "variant": f"{driver} {kind} {transport}", "followers": followers}
        print(json.dumps(out), flush=True)
    client.close()
    asyncio.run_coroutine_threadsafe(aclient.close(), loop).result()


if __name__ == "__main__":
    main()
