"""The blocking client: `Client`, and its resuming followers `Follower`
(one session) and `StreamFollower` (the multiplexed stream)."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

import grpc
from google.protobuf.message import Message

from vak_client._gen import agent_pb2
from vak_client._common import (
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_TIMEOUT,
    GRPC_OPTIONS,
    HEALTHY_CONNECTION,
    MAX_LINE,
    Backoff,
    MuxFrame,
    ProtocolError,
    Req,
    Resp,
    SessionCursor,
    SseEvent,
    SseParser,
    StreamItem,
    Transport,
    Unary,
    UnaryCall,
    VakError,
    VectorCursor,
    auth_headers,
    auth_metadata,
    call_approve,
    call_attach,
    call_cancel,
    call_create_session,
    call_follow,
    call_list_sessions,
    call_presentation,
    call_run,
    call_steer,
    call_transcript,
    call_transcript_markdown,
    call_unfollow,
    connection_error,
    event_from_sse,
    events_path,
    grpc_error,
    mux_from_grpc,
    mux_from_sse,
    parse_url,
    rest_body,
    rest_error,
    rest_response,
    sse_headers,
    stream_path,
)

T = TypeVar("T")
M = TypeVar("M")


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


def rpc_error(err: grpc.RpcError) -> VakError:
    """A gRPC failure as a VakError."""
    if isinstance(err, grpc.Call):
        return grpc_error(err.code(), err.details())
    return grpc_error(None, str(err))


@dataclass(frozen=True)
class RestResponse:
    status: int
    body: Any  # parsed JSON, or None when the body was empty


# -- connections (one attempt each) ---------------------------------------------


class _Conn(Generic[T]):
    """One open stream. `read()` blocks for the next frame (None: the
    server ended the stream); `abort()` may be called from another thread
    while a read blocks; `close()` releases everything."""

    frames = 0
    opened_at = 0.0

    def read(self) -> T | None:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class _SseConn(_Conn[T]):
    def __init__(
        self,
        client: Client,
        path: str,
        last_event_id: str | None,
        convert: Callable[[SseEvent], T | None],
    ) -> None:
        self._convert = convert
        self._parser = SseParser()
        ep = client.endpoint
        conn: http.client.HTTPConnection
        if ep.scheme == "https":
            conn = http.client.HTTPSConnection(ep.connect_host, ep.port, timeout=client.timeout)
        else:
            conn = http.client.HTTPConnection(ep.connect_host, ep.port, timeout=client.timeout)
        self._http = conn
        try:
            conn.request("GET", path, headers=sse_headers(client.token, last_event_id))
            resp = conn.getresponse()
            if resp.status != 200:
                raise rest_error(resp.status, resp.read(1 << 20))
            ctype = resp.getheader("content-type", "")
            if not ctype.startswith("text/event-stream"):
                raise ProtocolError(f"GET {path}: expected text/event-stream, got {ctype!r}")
            if conn.sock is not None:
                conn.sock.settimeout(client.idle_timeout)
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise connection_error(f"GET {path}", exc) from None
        except BaseException:
            conn.close()
            raise
        self._resp = resp

    def read(self) -> T | None:
        while True:
            try:
                line = self._resp.readline(MAX_LINE + 1)
            except (OSError, ValueError, http.client.HTTPException) as exc:
                raise connection_error("reading the event stream", exc) from None
            if not line:
                return None
            if len(line) > MAX_LINE:
                raise ProtocolError(f"an event stream line is longer than {MAX_LINE} bytes")
            ev = self._parser.feed(line)
            if ev is None:
                continue
            out = self._convert(ev)
            if out is not None:
                return out

    def abort(self) -> None:
        sock = self._http.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.abort()
        self._http.close()


class _GrpcConn(_Conn[T], Generic[M, T]):
    def __init__(self, call: grpc._CallIterator[M], convert: Callable[[M], T | None]) -> None:
        self._call = call
        self._convert = convert

    def read(self) -> T | None:
        while True:
            try:
                msg = next(self._call)
            except StopIteration:
                return None
            except grpc.RpcError as err:
                raise rpc_error(err) from None
            out = self._convert(msg)
            if out is not None:
                return out

    def abort(self) -> None:
        self._call.cancel()

    def close(self) -> None:
        self._call.cancel()


# -- the resuming driver ----------------------------------------------------------


class _Stop(Exception):
    """Iteration is over: closed by the caller, or the stream finished."""


class _Resuming(Generic[T]):
    """Connects, reads, and reconnects with backoff, delegating what to
    send and how to read the first frame to the subclass."""

    def __init__(self, backoff: Backoff) -> None:
        self._backoff = backoff
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._conn: _Conn[T] | None = None
        self._live = False  # stream_opened was read on self._conn
        self._reading = False
        self._failures = 0
        self._loss_since: float | None = None
        self._ever_opened = False
        self.reconnects = 0
        """How many times the stream was reopened after a loss."""

    # subclass hooks
    def _open_conn(self) -> _Conn[T]:
        raise NotImplementedError

    def _on_opened(self, first: T) -> None:
        raise NotImplementedError

    def _end_is_final(self) -> bool:
        raise NotImplementedError

    @property
    def connected(self) -> bool:
        """Whether a stream is open right now."""
        with self._lock:
            return self._live

    def _read(self, conn: _Conn[T]) -> T | None:
        with self._lock:
            if self._closed:
                raise _Stop
            self._reading = True
        try:
            return conn.read()
        finally:
            with self._lock:
                self._reading = False
                closed = self._closed
            if closed:
                conn.close()
                raise _Stop

    def _drop(self, conn: _Conn[T]) -> None:
        with self._lock:
            if self._conn is conn:
                self._conn = None
                self._live = False
        conn.close()

    def _ensure(self) -> _Conn[T]:
        """The open stream, connecting (with backoff) when there is none."""
        while True:
            with self._lock:
                if self._closed:
                    raise _Stop
                if self._conn is not None and self._live:
                    return self._conn
            if self._loss_since is None:
                self._loss_since = time.monotonic()
            delay = self._backoff.delay(self._failures)
            if delay > 0 and self._wake.wait(delay):
                raise _Stop
            conn: _Conn[T] | None = None
            try:
                conn = self._open_conn()
                with self._lock:
                    if self._closed:
                        conn.close()
                        raise _Stop
                    self._conn, self._live = conn, False
                first = self._read(conn)
                if first is None:
                    raise VakError(503, "unavailable", "the stream ended before stream_opened")
                self._on_opened(first)
            except VakError as err:
                if conn is not None:
                    self._drop(conn)
                if not err.retryable:
                    raise
                self._failures += 1
                limit = self._backoff.give_up_after
                if limit is not None and time.monotonic() - self._loss_since > limit:
                    raise
                continue
            with self._lock:
                self._live = True
            conn.opened_at = time.monotonic()
            if self._ever_opened:
                self.reconnects += 1
            self._ever_opened = True
            self._loss_since = None
            return conn

    def _next_raw(self) -> T:
        while True:
            conn = self._ensure()
            try:
                raw = self._read(conn)
            except VakError as err:
                self._lost(conn)
                if not err.retryable:
                    raise
                continue
            if raw is None:
                self._lost(conn)
                if self._end_is_final():
                    raise _Stop
                continue
            conn.frames += 1
            return raw

    def _lost(self, conn: _Conn[T]) -> None:
        self._drop(conn)
        if conn.frames > 0 or time.monotonic() - conn.opened_at >= HEALTHY_CONNECTION:
            self._failures = 0
        else:
            self._failures += 1

    def close(self) -> None:
        """Stops following: a blocked iteration (in another thread too) ends."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            conn, reading = self._conn, self._reading
            self._conn, self._live = None, False
        self._wake.set()
        if conn is not None:
            if reading:
                conn.abort()  # the reading thread closes it
            else:
                conn.close()

    @property
    def closed(self) -> bool:
        with self._lock:
            return self._closed


class Follower(_Resuming[agent_pb2.Event], Iterator[agent_pb2.Event]):
    """The events of one session, resuming transparently after a connection loss.

    Iterate it for `Event`s. It remembers the seq of the last event it
    handed over (`cursor`) and reconnects with it (SSE `Last-Event-ID`, gRPC
    `after`) with bounded exponential backoff, so the caller sees every
    session event exactly once, in order, across reconnects.

    Stream-level frames: `stream_opened` is consumed, never yielded (see
    `open()` and `opened`); `resync` is yielded (the cursor could not be
    served exactly: refetch the transcript; the retained frames follow);
    `session_closed` (server shutdown) is yielded and ends the iteration.
    None of them moves the cursor.

    With `after=None` the follower starts live: `cursor` becomes the
    session's latest seq when the stream opens, so what follows is still
    exact across reconnects. Use it as a context manager (the stream is open
    once the `with` body starts) or call `open()`; `close()` ends it, from
    any thread.
    """

    def __init__(
        self,
        client: Client,
        session_id: str,
        after: int | None,
        transport: Transport,
        backoff: Backoff,
    ) -> None:
        super().__init__(backoff)
        self._client = client
        self.session_id = session_id
        self.transport: Transport = transport
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

    def _open_conn(self) -> _Conn[agent_pb2.Event]:
        cursor = self._state.cursor
        if self.transport == "sse":
            return _SseConn(
                self._client,
                events_path(self.session_id),
                str(cursor) if cursor is not None else None,
                event_from_sse,
            )
        req = agent_pb2.SubscribeRequest(session_id=self.session_id)
        if cursor is not None:
            req.after = cursor
        call = self._client._subscribe_rpc(req, metadata=self._client.metadata)
        return _GrpcConn(call, _identity)

    def _on_opened(self, first: agent_pb2.Event) -> None:
        self._state.on_opened(first)

    def _end_is_final(self) -> bool:
        return self._state.finished

    def open(self) -> agent_pb2.StreamOpened:
        """Connects now (if not connected) and returns the `stream_opened`."""
        try:
            self._ensure()
        except _Stop:
            raise VakError(499, "cancelled", "the follower is closed") from None
        except BaseException:
            self.close()
            raise
        assert self._state.opened is not None
        return self._state.opened

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> agent_pb2.Event:
        try:
            while True:
                if self._state.finished:
                    raise _Stop
                ev = self._state.accept(self._next_raw())
                if ev is not None:
                    return ev
        except _Stop:
            self.close()
            raise StopIteration from None
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Self:
        self.open()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class StreamFollower(_Resuming[MuxFrame], Iterator[StreamItem]):
    """Many sessions on one multiplexed stream (`GET /stream` or the `Stream`
    RPC), resuming transparently with the cursor vector.

    Iterate it for `StreamItem(session_id, kind, message)`; see StreamItem
    for the kinds. `cursor` is the cursor vector as of the last item handed
    over; a reconnect resumes from it (SSE `Last-Event-ID`, gRPC `cursor`)
    and agent frames at or below a session's entry are never handed over
    twice. `stream_opened` is consumed, not yielded: it sets `stream_id`
    (which changes on every reconnect). `resync` is yielded (refetch that
    session's transcript). The iteration ends after the server closed the
    stream with `session_closed` frames (shutdown), or on `close()`.

    `follow()` / `unfollow()` change the followed sessions of the live
    stream (`POST /stream/{stream_id}/follow` over SSE, the `Follow` RPC
    over gRPC); the follower remembers them for its reconnects.
    """

    def __init__(
        self,
        client: Client,
        sessions: Iterable[str],
        cursor: str | None,
        transport: Transport,
        backoff: Backoff,
        host: bool,
        config: bool,
    ) -> None:
        super().__init__(backoff)
        self._client = client
        self.transport: Transport = transport
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
    def duplicates_dropped(self) -> int:
        return self._state.duplicates

    def _open_conn(self) -> _Conn[MuxFrame]:
        sessions, cursor = self._state.request()
        if self.transport == "sse":
            return _SseConn(
                self._client, stream_path(sessions, self._host, self._config), cursor or None, mux_from_sse
            )
        req = agent_pb2.StreamRequest(sessions=sessions, cursor=cursor, host=self._host, config=self._config)
        call = self._client._stream_rpc(req, metadata=self._client.metadata)
        return _GrpcConn(call, mux_from_grpc)

    def _on_opened(self, first: MuxFrame) -> None:
        self._state.on_opened(first)

    def _end_is_final(self) -> bool:
        return self._state.saw_closed

    def open(self) -> agent_pb2.StreamOpened:
        """Connects now (if not connected) and returns the `stream_opened`."""
        try:
            self._ensure()
        except _Stop:
            raise VakError(499, "cancelled", "the follower is closed") from None
        except BaseException:
            self.close()
            raise
        assert self._state.opened is not None
        return self._state.opened

    def follow(self, session_id: str, after: int | None = None) -> list[str]:
        """Adds a session (from `after`, else live); returns the followed sessions.

        When the stream is not live (not opened yet, or reconnecting) the
        session is only recorded: the next connection includes it."""
        resp = self._control(call_follow(self.stream_id, session_id, after))
        self._state.followed(session_id, after)
        return list(resp.sessions) if resp is not None else self.sessions

    def unfollow(self, session_id: str) -> list[str]:
        """Removes a session; no item of it is handed over afterwards."""
        resp = self._control(call_unfollow(self.stream_id, session_id))
        self._state.dropped(session_id)
        return list(resp.sessions) if resp is not None else self.sessions

    def _control(
        self, call: UnaryCall[Req, agent_pb2.FollowResponse]
    ) -> agent_pb2.FollowResponse | None:
        """Follow/Unfollow on the live stream; None when there is none (any
        more: the server no longer knows its id, so the connection is dead
        and is dropped; the next read reconnects)."""
        stream_id = self.stream_id
        if not self.connected or not stream_id:
            return None
        try:
            return self._client._unary(call, rest=self.transport == "sse")
        except VakError as err:
            if err.status == 404 and stream_id in err.message:
                self._kick()
                return None
            raise

    def _kick(self) -> None:
        with self._lock:
            conn, reading = self._conn, self._reading
            if not reading:
                self._conn, self._live = None, False
        if conn is not None:
            if reading:
                conn.abort()
            else:
                conn.close()

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> StreamItem:
        try:
            while True:
                item = self._state.accept(self._next_raw())
                if item is not None:
                    return item
        except _Stop:
            self.close()
            raise StopIteration from None
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Self:
        self.open()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _identity(x: T) -> T:
    return x


class Subscription(Iterator[agent_pb2.Event]):
    """A raw gRPC Subscribe stream (no resume): iterate it for `Event`s.

    Iteration ends cleanly when the server closes the stream or after
    `cancel()`; any other gRPC failure raises `grpc.RpcError`.
    """

    def __init__(self, call: grpc._CallIterator[agent_pb2.Event]) -> None:
        self._call = call
        self._cancelled = False

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> agent_pb2.Event:
        try:
            return next(self._call)
        except grpc.RpcError as err:
            if self._cancelled and isinstance(err, grpc.Call) and err.code() == grpc.StatusCode.CANCELLED:
                raise StopIteration from None
            raise

    def cancel(self) -> None:
        self._cancelled = True
        self._call.cancel()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cancel()


# -- the client --------------------------------------------------------------------


class Client:
    """A blocking client for one vak server.

    `url` is the server's base URL (what `vak serve` prints after "listening
    on"); `token` is sent as `Bearer <token>` on every call (None: no
    credentials). Unary calls go over gRPC (`unary="rest"`: REST/JSON);
    followers read SSE by default (`transport="grpc"`: gRPC streams).
    `timeout` bounds every unary call and every connection attempt;
    `idle_timeout` is how long an SSE stream may stay silent (the server
    sends a keepalive every 15 s) before it counts as lost; `backoff` is the
    followers' reconnect policy. Every failure raises `VakError`.
    Thread-safe; close it (or use it as a context manager) when done.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        unary: Unary = "grpc",
        transport: Transport = "sse",
        backoff: Backoff | None = None,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
    ) -> None:
        if unary not in ("grpc", "rest"):
            raise ValueError(f"unary must be 'grpc' or 'rest', not {unary!r}")
        if transport not in ("sse", "grpc"):
            raise ValueError(f"transport must be 'sse' or 'grpc', not {transport!r}")
        self.endpoint = parse_url(url)
        self.base_url = self.endpoint.base_url
        self.token = token
        self.timeout = timeout
        self.unary: Unary = unary
        self.transport: Transport = transport
        self.backoff = backoff or Backoff()
        self.idle_timeout = idle_timeout

        if self.endpoint.scheme == "https":
            self._channel = grpc.secure_channel(self.endpoint.target, grpc.ssl_channel_credentials(), GRPC_OPTIONS)
        else:
            self._channel = grpc.insecure_channel(self.endpoint.target, GRPC_OPTIONS)
        self._subscribe_rpc = self._channel.unary_stream(
            "/vak.v1.AgentService/Subscribe",
            request_serializer=_serialize,
            response_deserializer=agent_pb2.Event.FromString,
        )
        self._stream_rpc = self._channel.unary_stream(
            "/vak.v1.AgentService/Stream",
            request_serializer=_serialize,
            response_deserializer=agent_pb2.StreamMessage.FromString,
        )
        self._http = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self._stub: Any = None

    # -- plumbing ---------------------------------------------------------

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """gRPC metadata (the bearer token) to pass to any `self.stub` call."""
        return auth_metadata(self.token)

    @property
    def stub(self) -> Any:
        """The generated `AgentServiceStub` on this client's channel, for raw gRPC."""
        if self._stub is None:
            from vak_client._gen import agent_pb2_grpc

            self._stub = agent_pb2_grpc.AgentServiceStub(self._channel)  # type: ignore[no-untyped-call]
        return self._stub

    def _rest(self, method: str, path: str, data: bytes | None) -> tuple[int, bytes]:
        headers = {"Accept": "application/json", **auth_headers(self.token)}
        if data is not None:
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(self.base_url + path, data=data, headers=headers, method=method)
        try:
            with self._http.open(req, timeout=self.timeout) as resp:
                status: int = resp.status
                raw: bytes = resp.read()
                return status, raw
        except urllib.error.HTTPError as err:
            raw = err.read()
            err.close()
            raise rest_error(err.code, raw) from None
        except (OSError, http.client.HTTPException) as exc:
            raise connection_error(f"{method} {path}", exc) from None

    def request(self, method: str, path: str, body: Any = None) -> RestResponse:
        """One raw REST call with a JSON body; raises `VakError` for a non-2xx answer."""
        data = json.dumps(body).encode() if body is not None else None
        status, raw = self._rest(method, path, data)
        try:
            parsed = json.loads(raw) if raw.strip() else None
        except ValueError:
            text = raw.decode("utf-8", "replace")
            raise VakError(status, "", f"response is not JSON: {text[:200]!r}", text) from None
        return RestResponse(status, parsed)

    def _unary(self, call: UnaryCall[Req, Resp], *, rest: bool | None = None) -> Resp:
        if self.unary == "rest" if rest is None else rest:
            _, raw = self._rest(call.http_method, call.path, rest_body(call))
            return rest_response(call, raw)
        rpc = self._channel.unary_unary(
            call.method, request_serializer=_serialize, response_deserializer=call.response.FromString
        )
        try:
            return rpc(call.request, timeout=self.timeout, metadata=self.metadata)
        except grpc.RpcError as err:
            raise rpc_error(err) from None

    # -- the API ----------------------------------------------------------

    def create_session(self) -> str:
        """Creates an empty session; returns its id."""
        return self._unary(call_create_session()).session_id

    def list_sessions(self) -> list[agent_pb2.SessionSummary]:
        """The persisted sessions, newest first."""
        return list(self._unary(call_list_sessions()).sessions)

    def attach(self, session_id: str) -> agent_pb2.SessionSummary:
        """Loads a persisted session into memory; returns its summary."""
        return self._unary(call_attach(session_id)).session

    def run(self, session_id: str, prompt: str, request_id: str | None = None) -> agent_pb2.Admission:
        """Admits a prompt: "started", "queued" or "duplicate" (same request_id again)."""
        return self._unary(call_run(session_id, prompt, request_id))

    def steer(self, session_id: str, text: str, request_id: str | None = None) -> agent_pb2.Admission:
        """Admits steering input (same rules as `run`)."""
        return self._unary(call_steer(session_id, text, request_id))

    def approve(
        self, session_id: str, request_id: str, approve: bool, reason: str = ""
    ) -> agent_pb2.ApproveResponse:
        """Answers the pending approval `request_id` (the `ap_...` id of approval_requested)."""
        return self._unary(call_approve(session_id, request_id, approve, reason))

    def cancel(self, session_id: str) -> agent_pb2.CancelResponse:
        """Stops the run in flight and discards queued input."""
        return self._unary(call_cancel(session_id))

    def transcript(self, session_id: str) -> agent_pb2.Transcript:
        """Messages and usage, folded from the session's events."""
        return self._unary(call_transcript(session_id))

    def transcript_markdown(self, session_id: str) -> str:
        """The transcript rendered as Markdown."""
        return self._unary(call_transcript_markdown(session_id)).markdown

    def presentation(self, session_id: str) -> agent_pb2.OutputTimeline:
        """The session's presentation timeline."""
        return self._unary(call_presentation(session_id))

    def follow(
        self, session_id: str, after: int | None = None, *, transport: Transport | None = None
    ) -> Follower:
        """A resuming iterator over the session's events after seq `after`
        (None: live only). See `Follower`."""
        return Follower(self, session_id, after, transport or self.transport, self.backoff)

    def follow_many(
        self,
        session_ids: Iterable[str],
        cursor: str | None = None,
        *,
        transport: Transport | None = None,
        host: bool = False,
        config: bool = False,
    ) -> StreamFollower:
        """A resuming iterator over the multiplexed stream of `session_ids`,
        resuming from the cursor vector `cursor` (sessions it does not name
        start live). `host` / `config` ask for those frames. See `StreamFollower`."""
        return StreamFollower(self, session_ids, cursor, transport or self.transport, self.backoff, host, config)

    def subscribe(self, session_id: str, after: int | None = None, *, timeout: float | None = None) -> Subscription:
        """A raw gRPC Subscribe (no resume, stream_opened included). `timeout`
        bounds the whole stream (default: unbounded)."""
        req = agent_pb2.SubscribeRequest(session_id=session_id)
        if after is not None:
            req.after = after
        return Subscription(self._subscribe_rpc(req, timeout=timeout, metadata=self.metadata))

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
