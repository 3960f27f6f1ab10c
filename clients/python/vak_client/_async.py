"""The asyncio client: `AsyncClient`, `AsyncFollower` and
`AsyncStreamFollower`. gRPC goes through grpc.aio; REST and SSE through a
small HTTP/1.1 client on asyncio streams (standard library only)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from collections.abc import AsyncIterator, Callable, Iterable
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

import grpc
import grpc.aio
from google.protobuf.message import Message

from vak_client._gen import agent_pb2
from vak_client._common import (
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_TIMEOUT,
    GRPC_OPTIONS,
    HEALTHY_CONNECTION,
    MAX_LINE,
    Backoff,
    Endpoint,
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

_MAX_HEAD = 64 * 1024
_MAX_BODY = 64 * 1024 * 1024


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


def aio_rpc_error(err: grpc.RpcError) -> VakError:
    if isinstance(err, grpc.aio.AioRpcError):
        return grpc_error(err.code(), err.details())
    return grpc_error(None, str(err))


# -- HTTP/1.1 on asyncio streams -------------------------------------------------


class _HttpResponse:
    """A response whose body is read incrementally: Content-Length, chunked,
    or delimited by the connection's end."""

    def __init__(
        self,
        status: int,
        headers: dict[str, str],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.status = status
        self.headers = headers
        self._reader = reader
        self._writer = writer
        self._buf = bytearray()
        self._done = False
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self._chunk_left = 0
        length = headers.get("content-length")
        self._left: int | None = None
        if not self._chunked and length is not None:
            try:
                self._left = int(length)
            except ValueError:
                raise ProtocolError(f"bad Content-Length {length!r}") from None

    async def _fill(self) -> bool:
        """Appends more body bytes to the buffer; False at the end of the body."""
        if self._done:
            return False
        r = self._reader
        if self._chunked:
            if self._chunk_left == 0:
                size_line = await r.readline()
                if not size_line.endswith(b"\n"):
                    raise ConnectionError("the connection ended inside a chunked body")
                try:
                    size = int(size_line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    raise ProtocolError(f"bad chunk size line {size_line[:40]!r}") from None
                if size == 0:
                    while (trailer := await r.readline()) not in (b"\r\n", b"\n", b""):
                        del trailer
                    self._done = True
                    return False
                self._chunk_left = size
            data = await r.read(min(self._chunk_left, 1 << 16))
            if not data:
                raise ConnectionError("the connection ended inside a chunk")
            self._chunk_left -= len(data)
            self._buf += data
            if self._chunk_left == 0:
                await r.readexactly(2)
            return True
        if self._left is not None:
            if self._left == 0:
                self._done = True
                return False
            data = await r.read(min(self._left, 1 << 16))
            if not data:
                raise ConnectionError("the connection ended inside the body")
            self._left -= len(data)
            self._buf += data
            return True
        data = await r.read(1 << 16)
        if not data:
            self._done = True
            return False
        self._buf += data
        return True

    async def readline(self) -> bytes:
        """The next body line with its ending; b"" at the end of the body."""
        while True:
            i = self._buf.find(b"\n")
            if i >= 0:
                line = bytes(self._buf[: i + 1])
                del self._buf[: i + 1]
                return line
            if len(self._buf) > MAX_LINE:
                raise ProtocolError(f"an event stream line is longer than {MAX_LINE} bytes")
            if not await self._fill():
                line = bytes(self._buf)
                self._buf.clear()
                return line

    async def read_all(self, limit: int = _MAX_BODY) -> bytes:
        while await self._fill():
            if len(self._buf) > limit:
                raise ProtocolError(f"a response body is larger than {limit} bytes")
        out = bytes(self._buf)
        self._buf.clear()
        return out

    def abort(self) -> None:
        transport = self._writer.transport
        if not transport.is_closing():
            transport.abort()

    def close(self) -> None:
        self._writer.close()


async def _http_request(
    ep: Endpoint,
    method: str,
    path: str,
    headers: dict[str, str],
    body: bytes | None,
) -> _HttpResponse:
    """Sends one request on a new connection and reads the response head."""
    ssl_ctx = ssl.create_default_context() if ep.scheme == "https" else None
    reader, writer = await asyncio.open_connection(
        ep.connect_host,
        ep.port,
        ssl=ssl_ctx,
        server_hostname=ep.connect_host if ssl_ctx else None,
        limit=_MAX_HEAD,
    )
    try:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {ep.target}", "Connection: close"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b""))
        await writer.drain()
        status_line = await reader.readline()
        parts = status_line.decode("latin-1").split(None, 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            if not status_line:
                raise ConnectionError("the server closed the connection before answering")
            raise ProtocolError(f"bad HTTP status line {status_line[:80]!r}")
        resp_headers: dict[str, str] = {}
        while True:
            line = await reader.readline()
            if not line.endswith(b"\n"):
                raise ConnectionError("the connection ended inside the response head")
            text = line.decode("latin-1").rstrip("\r\n")
            if not text:
                break
            name, _, value = text.partition(":")
            resp_headers[name.strip().lower()] = value.strip()
        return _HttpResponse(int(parts[1]), resp_headers, reader, writer)
    except BaseException:
        writer.transport.abort()
        raise


# -- connections ---------------------------------------------------------------------


class _AConn(Generic[T]):
    frames = 0
    opened_at = 0.0

    async def read(self) -> T | None:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError


class _ASseConn(_AConn[T]):
    def __init__(self, resp: _HttpResponse, idle_timeout: float, convert: Callable[[SseEvent], T | None]) -> None:
        self._resp = resp
        self._idle = idle_timeout
        self._convert = convert
        self._parser = SseParser()

    @classmethod
    async def connect(
        cls,
        client: AsyncClient,
        path: str,
        last_event_id: str | None,
        convert: Callable[[SseEvent], T | None],
    ) -> _ASseConn[T]:
        try:
            async with asyncio.timeout(client.timeout):
                resp = await _http_request(client.endpoint, "GET", path, sse_headers(client.token, last_event_id), None)
                try:
                    if resp.status != 200:
                        raise rest_error(resp.status, await resp.read_all(1 << 20))
                    ctype = resp.headers.get("content-type", "")
                    if not ctype.startswith("text/event-stream"):
                        raise ProtocolError(f"GET {path}: expected text/event-stream, got {ctype!r}")
                except BaseException:
                    resp.abort()
                    raise
        except (OSError, EOFError, asyncio.IncompleteReadError, TimeoutError) as exc:
            raise connection_error(f"GET {path}", exc) from None
        return cls(resp, client.idle_timeout, convert)

    async def read(self) -> T | None:
        while True:
            try:
                async with asyncio.timeout(self._idle):
                    line = await self._resp.readline()
            except (OSError, EOFError, asyncio.IncompleteReadError, TimeoutError) as exc:
                raise connection_error("reading the event stream", exc) from None
            if not line:
                return None
            ev = self._parser.feed(line)
            if ev is None:
                continue
            out = self._convert(ev)
            if out is not None:
                return out

    def abort(self) -> None:
        self._resp.abort()


class _AGrpcConn(_AConn[T], Generic[M, T]):
    def __init__(self, call: grpc.aio.UnaryStreamCall[Any, M], convert: Callable[[M], T | None]) -> None:
        self._call = call
        self._convert = convert
        self._aborted = False

    async def read(self) -> T | None:
        while True:
            try:
                msg = await self._call.read()
            except grpc.RpcError as err:
                raise aio_rpc_error(err) from None
            except asyncio.CancelledError:
                if self._aborted:
                    # grpc.aio reports our own cancel() (from close()) this way.
                    raise VakError(499, "cancelled", "the stream was cancelled") from None
                raise
            if msg is grpc.aio.EOF:
                return None
            out = self._convert(msg)  # type: ignore[arg-type]
            if out is not None:
                return out

    def abort(self) -> None:
        self._aborted = True
        self._call.cancel()


# -- the resuming driver ----------------------------------------------------------------


class _Stop(Exception):
    pass


class _AResuming(Generic[T]):
    def __init__(self, backoff: Backoff) -> None:
        self._backoff = backoff
        self._closed = False
        self._wake = asyncio.Event()
        self._conn: _AConn[T] | None = None
        self._live = False
        self._failures = 0
        self._loss_since: float | None = None
        self._ever_opened = False
        self.reconnects = 0

    async def _open_conn(self) -> _AConn[T]:
        raise NotImplementedError

    def _on_opened(self, first: T) -> None:
        raise NotImplementedError

    def _end_is_final(self) -> bool:
        raise NotImplementedError

    @property
    def connected(self) -> bool:
        return self._live

    @property
    def closed(self) -> bool:
        return self._closed

    def _drop(self, conn: _AConn[T]) -> None:
        if self._conn is conn:
            self._conn, self._live = None, False
        conn.abort()

    async def _read(self, conn: _AConn[T]) -> T | None:
        if self._closed:
            raise _Stop
        try:
            return await conn.read()
        finally:
            if self._closed:
                conn.abort()
                raise _Stop

    async def _ensure(self) -> _AConn[T]:
        while True:
            if self._closed:
                raise _Stop
            if self._conn is not None and self._live:
                return self._conn
            if self._loss_since is None:
                self._loss_since = time.monotonic()
            delay = self._backoff.delay(self._failures)
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._wake.wait()
                if self._closed:
                    raise _Stop
            conn: _AConn[T] | None = None
            try:
                conn = await self._open_conn()
                if self._closed:
                    conn.abort()
                    raise _Stop
                self._conn, self._live = conn, False
                first = await self._read(conn)
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
            self._live = True
            conn.opened_at = time.monotonic()
            if self._ever_opened:
                self.reconnects += 1
            self._ever_opened = True
            self._loss_since = None
            return conn

    async def _next_raw(self) -> T:
        while True:
            conn = await self._ensure()
            try:
                raw = await self._read(conn)
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

    def _lost(self, conn: _AConn[T]) -> None:
        self._drop(conn)
        if conn.frames > 0 or time.monotonic() - conn.opened_at >= HEALTHY_CONNECTION:
            self._failures = 0
        else:
            self._failures += 1

    def close_nowait(self) -> None:
        """Stops following; a pending `__anext__` ends with StopAsyncIteration."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        conn, self._conn, self._live = self._conn, None, False
        if conn is not None:
            conn.abort()

    async def aclose(self) -> None:
        self.close_nowait()


class AsyncFollower(_AResuming[agent_pb2.Event], AsyncIterator[agent_pb2.Event]):
    """The asyncio `Follower`: the same resume rules, `async for` it.
    `async with client.follow(sid) as events:` opens the stream first."""

    def __init__(
        self, client: AsyncClient, session_id: str, after: int | None, transport: Transport, backoff: Backoff
    ) -> None:
        super().__init__(backoff)
        self._client = client
        self.session_id = session_id
        self.transport: Transport = transport
        self._state = SessionCursor(session_id, after)

    @property
    def cursor(self) -> int | None:
        return self._state.cursor

    @property
    def opened(self) -> agent_pb2.StreamOpened | None:
        return self._state.opened

    @property
    def duplicates_dropped(self) -> int:
        return self._state.duplicates

    async def _open_conn(self) -> _AConn[agent_pb2.Event]:
        cursor = self._state.cursor
        if self.transport == "sse":
            return await _ASseConn.connect(
                self._client, events_path(self.session_id), str(cursor) if cursor is not None else None, event_from_sse
            )
        req = agent_pb2.SubscribeRequest(session_id=self.session_id)
        if cursor is not None:
            req.after = cursor
        call = self._client._channel().unary_stream(
            "/vak.v1.AgentService/Subscribe",
            request_serializer=_serialize,
            response_deserializer=agent_pb2.Event.FromString,
        )(req, metadata=self._client.metadata)
        return _AGrpcConn(call, _identity)

    def _on_opened(self, first: agent_pb2.Event) -> None:
        self._state.on_opened(first)

    def _end_is_final(self) -> bool:
        return self._state.finished

    async def open(self) -> agent_pb2.StreamOpened:
        try:
            await self._ensure()
        except _Stop:
            raise VakError(499, "cancelled", "the follower is closed") from None
        except BaseException:
            self.close_nowait()
            raise
        assert self._state.opened is not None
        return self._state.opened

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> agent_pb2.Event:
        try:
            while True:
                if self._state.finished:
                    raise _Stop
                ev = self._state.accept(await self._next_raw())
                if ev is not None:
                    return ev
        except _Stop:
            self.close_nowait()
            raise StopAsyncIteration from None
        except BaseException:
            self.close_nowait()
            raise

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close_nowait()


class AsyncStreamFollower(_AResuming[MuxFrame], AsyncIterator[StreamItem]):
    """The asyncio `StreamFollower`: the same resume rules, `async for` it;
    `follow()` / `unfollow()` are coroutines."""

    def __init__(
        self,
        client: AsyncClient,
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
        return self._state.cursor

    @property
    def stream_id(self) -> str:
        return self._state.stream_id

    @property
    def sessions(self) -> list[str]:
        return list(self._state.sessions)

    @property
    def duplicates_dropped(self) -> int:
        return self._state.duplicates

    async def _open_conn(self) -> _AConn[MuxFrame]:
        sessions, cursor = self._state.request()
        if self.transport == "sse":
            return await _ASseConn.connect(
                self._client, stream_path(sessions, self._host, self._config), cursor or None, mux_from_sse
            )
        req = agent_pb2.StreamRequest(sessions=sessions, cursor=cursor, host=self._host, config=self._config)
        call = self._client._channel().unary_stream(
            "/vak.v1.AgentService/Stream",
            request_serializer=_serialize,
            response_deserializer=agent_pb2.StreamMessage.FromString,
        )(req, metadata=self._client.metadata)
        return _AGrpcConn(call, mux_from_grpc)

    def _on_opened(self, first: MuxFrame) -> None:
        self._state.on_opened(first)

    def _end_is_final(self) -> bool:
        return self._state.saw_closed

    async def open(self) -> agent_pb2.StreamOpened:
        try:
            await self._ensure()
        except _Stop:
            raise VakError(499, "cancelled", "the follower is closed") from None
        except BaseException:
            self.close_nowait()
            raise
        assert self._state.opened is not None
        return self._state.opened

    async def follow(self, session_id: str, after: int | None = None) -> list[str]:
        """Adds a session (from `after`, else live); returns the followed sessions.
        When the stream is not live the session is only recorded for the next connection."""
        resp = await self._control(call_follow(self.stream_id, session_id, after))
        self._state.followed(session_id, after)
        return list(resp.sessions) if resp is not None else self.sessions

    async def unfollow(self, session_id: str) -> list[str]:
        """Removes a session; no item of it is handed over afterwards."""
        resp = await self._control(call_unfollow(self.stream_id, session_id))
        self._state.dropped(session_id)
        return list(resp.sessions) if resp is not None else self.sessions

    async def _control(
        self, call: UnaryCall[Req, agent_pb2.FollowResponse]
    ) -> agent_pb2.FollowResponse | None:
        stream_id = self.stream_id
        if not self.connected or not stream_id or self._conn is None:
            return None
        conn = self._conn
        try:
            return await self._client._unary(call, rest=self.transport == "sse")
        except VakError as err:
            if err.status == 404 and stream_id in err.message:
                # The server no longer knows the stream: its connection is dead.
                self._drop(conn)
                return None
            raise

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> StreamItem:
        try:
            while True:
                item = self._state.accept(await self._next_raw())
                if item is not None:
                    return item
        except _Stop:
            self.close_nowait()
            raise StopAsyncIteration from None
        except BaseException:
            self.close_nowait()
            raise

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close_nowait()


def _identity(x: T) -> T:
    return x


# -- the client ------------------------------------------------------------------------


class AsyncClient:
    """The asyncio `Client`: the same methods as coroutines (`follow` and
    `follow_many` return async iterators). gRPC through grpc.aio (its channel
    is created on first use, in the running loop); REST and SSE on asyncio
    streams. `await client.close()` (or `async with`) when done."""

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
        self._aio_channel: grpc.aio.Channel | None = None

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return auth_metadata(self.token)

    def _channel(self) -> grpc.aio.Channel:
        if self._aio_channel is None:
            if self.endpoint.scheme == "https":
                self._aio_channel = grpc.aio.secure_channel(
                    self.endpoint.target, grpc.ssl_channel_credentials(), GRPC_OPTIONS
                )
            else:
                self._aio_channel = grpc.aio.insecure_channel(self.endpoint.target, GRPC_OPTIONS)
        return self._aio_channel

    async def _rest(self, method: str, path: str, data: bytes | None) -> tuple[int, bytes]:
        headers = {"Accept": "application/json", **auth_headers(self.token)}
        if data is not None:
            headers["Content-Type"] = "application/json"
        try:
            async with asyncio.timeout(self.timeout):
                resp = await _http_request(self.endpoint, method, path, headers, data)
                try:
                    raw = await resp.read_all()
                finally:
                    resp.close()
        except (OSError, EOFError, asyncio.IncompleteReadError, TimeoutError) as exc:
            raise connection_error(f"{method} {path}", exc) from None
        if not 200 <= resp.status < 300:
            raise rest_error(resp.status, raw)
        return resp.status, raw

    async def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """One raw REST call with a JSON body: (status, parsed JSON or None)."""
        data = json.dumps(body).encode() if body is not None else None
        status, raw = await self._rest(method, path, data)
        return status, (json.loads(raw) if raw.strip() else None)

    async def _unary(self, call: UnaryCall[Req, Resp], *, rest: bool | None = None) -> Resp:
        if self.unary == "rest" if rest is None else rest:
            _, raw = await self._rest(call.http_method, call.path, rest_body(call))
            return rest_response(call, raw)
        rpc = self._channel().unary_unary(
            call.method, request_serializer=_serialize, response_deserializer=call.response.FromString
        )
        try:
            return await rpc(call.request, timeout=self.timeout, metadata=self.metadata)
        except grpc.RpcError as err:
            raise aio_rpc_error(err) from None

    async def create_session(self) -> str:
        return (await self._unary(call_create_session())).session_id

    async def list_sessions(self) -> list[agent_pb2.SessionSummary]:
        return list((await self._unary(call_list_sessions())).sessions)

    async def attach(self, session_id: str) -> agent_pb2.SessionSummary:
        return (await self._unary(call_attach(session_id))).session

    async def run(self, session_id: str, prompt: str, request_id: str | None = None) -> agent_pb2.Admission:
        return await self._unary(call_run(session_id, prompt, request_id))

    async def steer(self, session_id: str, text: str, request_id: str | None = None) -> agent_pb2.Admission:
        return await self._unary(call_steer(session_id, text, request_id))

    async def approve(
        self, session_id: str, request_id: str, approve: bool, reason: str = ""
    ) -> agent_pb2.ApproveResponse:
        return await self._unary(call_approve(session_id, request_id, approve, reason))

    async def cancel(self, session_id: str) -> agent_pb2.CancelResponse:
        return await self._unary(call_cancel(session_id))

    async def transcript(self, session_id: str) -> agent_pb2.Transcript:
        return await self._unary(call_transcript(session_id))

    async def transcript_markdown(self, session_id: str) -> str:
        return (await self._unary(call_transcript_markdown(session_id))).markdown

    async def presentation(self, session_id: str) -> agent_pb2.OutputTimeline:
        return await self._unary(call_presentation(session_id))

    def follow(
        self, session_id: str, after: int | None = None, *, transport: Transport | None = None
    ) -> AsyncFollower:
        return AsyncFollower(self, session_id, after, transport or self.transport, self.backoff)

    def follow_many(
        self,
        session_ids: Iterable[str],
        cursor: str | None = None,
        *,
        transport: Transport | None = None,
        host: bool = False,
        config: bool = False,
    ) -> AsyncStreamFollower:
        return AsyncStreamFollower(
            self, session_ids, cursor, transport or self.transport, self.backoff, host, config
        )

    async def close(self) -> None:
        if self._aio_channel is not None:
            await self._aio_channel.close()
            self._aio_channel = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
