"""The followers' logic, written once for the blocking and the asyncio clients.

A follower's work (connect, read the first frame, hand items over, reconnect
with backoff after a loss, follow/unfollow on the live stream) is written
here as generators that never do I/O themselves: they yield an operation
(`Open`, `Read`, `Sleep`, ...) and receive its result, or have its
exception thrown back in. `_sync.py` runs them with blocking calls and
`_async.py` with awaits; those drivers are the only code that differs.

The stream kinds are mixins: `SessionStream` (`follow()`: one session's
`Event`s, resumed with a seq) and `MuxStream` (`follow_many()`: the
multiplexed stream, resumed with a cursor vector).

The resync rule (docs/protocol.md, section 8) is here too: on a `resync`
frame the follower stops reading that stream, fetches the session's
transcript (exact as of its `seq`), hands the resync over with that
transcript, and opens a new stream after the transcript's seq. It never
lines frames up with the transcript by comparing seqs: under backpressure
the server merges consecutive deltas into one frame that carries only the
last seq it covers, so a frame after a resync may hold text from both sides
of the transcript's seq.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeAlias, TypeVar

from httpx_sse import ServerSentEvent

from vak_client._common import (
    HEALTHY_CONNECTION,
    Backoff,
    MuxFrame,
    Req,
    SessionCursor,
    StreamItem,
    Transport,
    UnaryCall,
    VakError,
    VectorCursor,
    call_follow,
    call_transcript,
    call_unfollow,
    event_from_sse,
    events_path,
    mux_from_grpc,
    mux_from_sse,
    stream_path,
    unreachable,
)
from vak_client._gen import agent_pb2

F = TypeVar("F")  # a frame as read from a connection
I = TypeVar("I")  # an item handed to the caller
R = TypeVar("R")
M = TypeVar("M")


class Stop(Exception):
    """Iteration is over: closed by the caller, or the stream finished."""


# -- what to open -------------------------------------------------------------


@dataclass(frozen=True)
class SseSpec(Generic[F]):
    """An SSE stream: GET `path`, resuming after `last_event_id`."""

    path: str
    last_event_id: str | None
    convert: Callable[[ServerSentEvent], F | None]


@dataclass(frozen=True)
class GrpcSpec(Generic[M, F]):
    """A server-streaming RPC."""

    method: str
    request: Any
    response: type[M]
    convert: Callable[[M], F | None]


Spec: TypeAlias = "SseSpec[Any] | GrpcSpec[Any, Any]"


class Conn:
    """What the drivers' connections have in common (the rest is theirs)."""

    frames = 0
    opened_at = 0.0


# -- the operations a driver performs ----------------------------------------------


@dataclass(frozen=True)
class Open:
    """Open a connection for `spec` and make it the current (not yet live) one."""

    spec: Spec


@dataclass(frozen=True)
class Read:
    """The next frame of `conn`, None when the server ended the stream."""

    conn: Conn


@dataclass(frozen=True)
class Drop:
    """Forget `conn` (if current) and close it."""

    conn: Conn


@dataclass(frozen=True)
class Live:
    """`conn` read its stream_opened: it is the live connection."""

    conn: Conn


@dataclass(frozen=True)
class Sleep:
    """Wait `seconds` (or until the follower is closed)."""

    seconds: float


@dataclass(frozen=True)
class Current:
    """The live connection, or None."""


@dataclass(frozen=True)
class Call:
    """A unary call through the client (over REST when `rest`)."""

    call: UnaryCall[Any, Any]
    rest: bool


@dataclass(frozen=True)
class Kick:
    """`conn` is dead although no read failed yet: drop it (the next read reconnects)."""

    conn: Conn


Op: TypeAlias = Open | Read | Drop | Live | Sleep | Current | Call | Kick
Steps: TypeAlias = Generator[Op, Any, R]


def _identity(x: R) -> R:
    return x


# -- the resume protocol --------------------------------------------------------------


class Resume(Generic[F, I]):
    """Connects, reads, and reconnects with backoff; the stream kind says
    what to open and how to read the frames."""

    transport: Transport
    reconnects: int
    """How many times the stream was reopened after a loss."""
    resyncs: int
    """How many resyncs were handed over (each reopened the stream after a transcript)."""

    def _init_resume(self, transport: Transport, backoff: Backoff) -> None:
        self.transport = transport
        self._backoff = backoff
        self._failures = 0
        self._loss_since: float | None = None
        self._ever_opened = False
        self._after_resync = False
        self.reconnects = 0
        self.resyncs = 0

    # the stream kind's part
    def _spec(self) -> Spec:
        raise NotImplementedError

    def _on_opened(self, first: F) -> None:
        raise NotImplementedError

    def _end_is_final(self) -> bool:
        raise NotImplementedError

    def _finished(self) -> bool:
        raise NotImplementedError

    def _accept(self, frame: F) -> I | None:
        raise NotImplementedError

    def _resync_of(self, frame: F) -> str | None:
        """The session a `resync` frame is about (None: not a resync to act on)."""
        raise NotImplementedError

    def _on_resync(self, frame: F, transcript: agent_pb2.Transcript) -> I:
        """Resume after the transcript's seq; the item handing the resync over."""
        raise NotImplementedError

    # the protocol
    def _ensure(self) -> Steps[Conn]:
        """The live connection, connecting (with backoff) when there is none."""
        while True:
            live = yield Current()
            if live is not None:
                return live  # type: ignore[no-any-return]
            if self._loss_since is None:
                self._loss_since = time.monotonic()
            delay = self._backoff.delay(self._failures)
            if delay > 0:
                yield Sleep(delay)
            conn: Conn | None = None
            try:
                conn = yield Open(self._spec())
                assert conn is not None
                first = yield Read(conn)
                if first is None:
                    raise unreachable("the stream ended before stream_opened")
                self._on_opened(first)
            except VakError as err:
                if conn is not None:
                    yield Drop(conn)
                if not err.retryable:
                    raise
                self._failures += 1
                limit = self._backoff.give_up_after
                if limit is not None and time.monotonic() - self._loss_since > limit:
                    raise
                continue
            yield Live(conn)
            conn.opened_at = time.monotonic()
            if self._ever_opened and not self._after_resync:
                self.reconnects += 1
            self._ever_opened = True
            self._after_resync = False
            self._loss_since = None
            return conn

    def _next_frame(self) -> Steps[F]:
        while True:
            conn = yield from self._ensure()
            try:
                frame = yield Read(conn)
            except VakError as err:
                yield from self._lost(conn)
                if not err.retryable:
                    raise
                continue
            if frame is None:
                yield from self._lost(conn)
                if self._end_is_final():
                    raise Stop
                continue
            conn.frames += 1
            return frame  # type: ignore[no-any-return]

    def _lost(self, conn: Conn) -> Steps[None]:
        yield Drop(conn)
        if conn.frames > 0 or time.monotonic() - conn.opened_at >= HEALTHY_CONNECTION:
            self._failures = 0
        else:
            self._failures += 1

    def _next_item(self) -> Steps[I]:
        while True:
            if self._finished():
                raise Stop
            frame = yield from self._next_frame()
            session_id = self._resync_of(frame)
            if session_id is not None:
                return (yield from self._resync(frame, session_id))
            item = self._accept(frame)
            if item is not None:
                return item

    def _resync(self, frame: F, session_id: str) -> Steps[I]:
        """The resync rule: nothing more is read from this stream; the
        transcript (exact as of its seq) stands for everything up to that
        seq, and a new stream opens after it. Over SSE the transcript comes
        over REST, over gRPC from the GetTranscript RPC; a failure that
        retrying can fix is retried with the reconnect backoff."""
        live = yield Current()
        if live is not None:
            yield Drop(live)
        failures = 0
        since = time.monotonic()
        while True:
            try:
                transcript: agent_pb2.Transcript = yield Call(call_transcript(session_id), self.transport == "sse")
                break
            except VakError as err:
                if not err.retryable:
                    raise
                failures += 1
                limit = self._backoff.give_up_after
                if limit is not None and time.monotonic() - since > limit:
                    raise
                yield Sleep(self._backoff.delay(failures))
        # The server answered: the new stream opens at once, and is no reconnect.
        self._failures = 0
        self._after_resync = True
        self.resyncs += 1
        return self._on_resync(frame, transcript)

    def _open_steps(self) -> Steps[agent_pb2.StreamOpened]:
        yield from self._ensure()
        opened = self._opened()
        assert opened is not None
        return opened

    def _opened(self) -> agent_pb2.StreamOpened | None:
        raise NotImplementedError


class SessionStream(Resume[agent_pb2.Event, agent_pb2.Event]):
    """`follow()`: the events of one session, resumed with the last seq handed over."""

    session_id: str

    def _init_session(
        self, session_id: str, after: int | None, transport: Transport, backoff: Backoff
    ) -> None:
        self._init_resume(transport, backoff)
        self.session_id = session_id
        self._state = SessionCursor(session_id, after)

    @property
    def cursor(self) -> int | None:
        """The seq of the last session event handed over (or the start point)."""
        return self._state.cursor

    @property
    def opened(self) -> agent_pb2.StreamOpened | None:
        """The `stream_opened` of the current (or last) connection."""
        return self._state.opened

    @property
    def duplicates_dropped(self) -> int:
        """Events the server sent again at or below the cursor (dropped)."""
        return self._state.duplicates

    @property
    def transcript(self) -> agent_pb2.Transcript | None:
        """The transcript fetched for the last `resync` handed over (None
        before any): the session exactly as of its `seq`, which is where the
        events handed over after that resync continue."""
        return self._state.transcript

    def _opened(self) -> agent_pb2.StreamOpened | None:
        return self._state.opened

    def _spec(self) -> Spec:
        cursor = self._state.cursor
        if self.transport == "sse":
            return SseSpec(events_path(self.session_id), str(cursor) if cursor is not None else None, event_from_sse)
        req = agent_pb2.SubscribeRequest(session_id=self.session_id)
        if cursor is not None:
            req.after = cursor
        return GrpcSpec("/vak.v1.AgentService/Subscribe", req, agent_pb2.Event, _identity)

    def _on_opened(self, first: agent_pb2.Event) -> None:
        self._state.on_opened(first)

    def _end_is_final(self) -> bool:
        return self._state.finished

    def _finished(self) -> bool:
        return self._state.finished

    def _accept(self, frame: agent_pb2.Event) -> agent_pb2.Event | None:
        return self._state.accept(frame)

    def _resync_of(self, frame: agent_pb2.Event) -> str | None:
        return self.session_id if frame.WhichOneof("kind") == "resync" else None

    def _on_resync(self, frame: agent_pb2.Event, transcript: agent_pb2.Transcript) -> agent_pb2.Event:
        self._state.resynced(transcript)
        return frame


class MuxStream(Resume[MuxFrame, StreamItem]):
    """`follow_many()`: the multiplexed stream, resumed with the cursor vector."""

    def _init_mux(
        self,
        sessions: Iterable[str],
        cursor: str | None,
        transport: Transport,
        backoff: Backoff,
        host: bool,
        config: bool,
    ) -> None:
        self._init_resume(transport, backoff)
        self._host = host
        self._config = config
        try:
            self._state = VectorCursor.new(sessions, cursor)
        except ValueError as err:
            raise VakError(400, "invalid_argument", str(err)) from None

    @property
    def cursor(self) -> str:
        """The cursor vector "<session>:<seq>,..." as of the last item handed over."""
        return self._state.cursor

    @property
    def stream_id(self) -> str:
        """The id of the live stream ("" before it opens; new on every reconnect)."""
        return self._state.stream_id

    @property
    def sessions(self) -> list[str]:
        """The sessions this follower follows (and resumes with)."""
        return list(self._state.sessions)

    @property
    def opened(self) -> agent_pb2.StreamOpened | None:
        """The `stream_opened` of the current (or last) connection."""
        return self._state.opened

    @property
    def duplicates_dropped(self) -> int:
        return self._state.duplicates

    @property
    def transcripts(self) -> dict[str, agent_pb2.Transcript]:
        """Per session, the transcript fetched for its last `resync` handed
        over: that session exactly as of the transcript's `seq`, where its
        agent frames handed over after that resync continue."""
        return dict(self._state.transcripts)

    def _opened(self) -> agent_pb2.StreamOpened | None:
        return self._state.opened

    def _spec(self) -> Spec:
        sessions, cursor = self._state.request()
        if self.transport == "sse":
            return SseSpec(stream_path(sessions, self._host, self._config), cursor or None, mux_from_sse)
        req = agent_pb2.StreamRequest(sessions=sessions, cursor=cursor, host=self._host, config=self._config)
        return GrpcSpec("/vak.v1.AgentService/Stream", req, agent_pb2.StreamMessage, mux_from_grpc)

    def _on_opened(self, first: MuxFrame) -> None:
        self._state.on_opened(first)

    def _end_is_final(self) -> bool:
        return self._state.saw_closed

    def _finished(self) -> bool:
        return False

    def _accept(self, frame: MuxFrame) -> StreamItem | None:
        return self._state.accept(frame)

    def _resync_of(self, frame: MuxFrame) -> str | None:
        if frame.kind != "resync" or frame.session_id in self._state.unfollowed:
            return None
        return frame.session_id

    def _on_resync(self, frame: MuxFrame, transcript: agent_pb2.Transcript) -> StreamItem:
        # The new stream resumes this session after the transcript, every
        # other one after the last agent frame handed over.
        self._state.resynced(frame.session_id, transcript)
        return StreamItem(frame.session_id, frame.kind, frame.message)

    def _follow_steps(self, session_id: str, after: int | None) -> Steps[list[str]]:
        resp = yield from self._control(call_follow(self.stream_id, session_id, after))
        self._state.followed(session_id, after)
        return list(resp.sessions) if resp is not None else self.sessions

    def _unfollow_steps(self, session_id: str) -> Steps[list[str]]:
        resp = yield from self._control(call_unfollow(self.stream_id, session_id))
        self._state.dropped(session_id)
        return list(resp.sessions) if resp is not None else self.sessions

    def _control(self, call: UnaryCall[Req, agent_pb2.FollowResponse]) -> Steps[agent_pb2.FollowResponse | None]:
        """Follow/Unfollow on the live stream; None when there is none (any
        more: the server no longer knows its id, so the connection is dead
        and is dropped; the next read reconnects). Over SSE the call goes
        over REST, over gRPC as an RPC."""
        stream_id = self.stream_id
        live = yield Current()
        if live is None or not stream_id:
            return None
        try:
            resp: agent_pb2.FollowResponse = yield Call(call, self.transport == "sse")
            return resp
        except VakError as err:
            if err.status == 404 and stream_id in err.message:
                yield Kick(live)
                return None
            raise
