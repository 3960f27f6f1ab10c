"""The blocking client: `Client`, and its resuming followers `Follower`
(one session) and `StreamFollower` (the multiplexed stream). REST and SSE go
through httpx (`httpx.Client`, `httpx_sse.EventSource`), gRPC through grpcio;
the wire logic is shared with the asyncio client (_common.py, _follow.py):
this module only makes the blocking calls."""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

import grpc
import httpx
from google.protobuf.message import Message
from httpx_sse import EventSource, ServerSentEvent

from vak_client._common import (
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_TIMEOUT,
    GRPC_OPTIONS,
    Backoff,
    McpServers,
    ClientConfig,
    MuxFrame,
    Req,
    Resp,
    StreamItem,
    Transport,
    Unary,
    UnaryCall,
    VakError,
    call_approve,
    call_delete_rule,
    call_get_mcp_config,
    call_put_mcp_config,
    call_list_rules,
    call_set_mode,
    call_attach,
    call_cancel,
    call_create_session,
    call_list_sessions,
    call_presentation,
    call_run,
    call_steer,
    call_transcript,
    call_transcript_markdown,
    check_rest,
    check_sse,
    http_errors,
    json_body,
    parse_rest_json,
    rest_body,
    rest_headers,
    rest_response,
    rpc_error,
    shutdown,
    socket_of,
)
from vak_client._workbench import (
    call_discard_candidate,
    call_get_pr,
    call_keep_candidate,
    call_launch_logs,
    call_list_launch,
    call_list_workers,
    call_merge_pr,
    call_start_best_of_n,
    call_start_launch,
    call_steer_worker,
    call_stop_launch,
    call_stop_worker,
)
from vak_client._commitments import (
    call_close_commitment,
    call_get_commitment,
    call_list_commitments,
)
from vak_client._intent_skills import (
    call_create_skill_proposal,
    call_explain_intent,
    call_intent_policy,
    call_list_skill_proposals,
    call_list_skills,
    call_promote_skill_proposal,
    call_reject_skill_proposal,
)
from vak_client._tasks import (
    call_create_task,
    call_delete_task,
    call_digest,
    call_get_task,
    call_list_tasks,
    call_run_task_now,
    call_update_task,
)
from vak_client._follow import (
    Call,
    Conn,
    Current,
    Drop,
    GrpcSpec,
    I,
    Kick,
    Live,
    MuxStream,
    Op,
    Open,
    R,
    Read,
    Resume,
    SessionStream,
    Sleep,
    SseSpec,
    Stop,
    F,
)
from vak_client._gen import agent_pb2

T = TypeVar("T")
M = TypeVar("M")


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


@dataclass(frozen=True)
class RestResponse:
    status: int
    body: Any  # parsed JSON, or None when the body was empty


# -- connections (one attempt each) ---------------------------------------------


class _SseConn(Conn, Generic[T]):
    """An open event stream. `abort()` may be called from another thread
    while `read()` blocks."""

    def __init__(self, response: httpx.Response, convert: Callable[[ServerSentEvent], T | None]) -> None:
        self._response = response
        self._events = EventSource(response).iter_sse()
        self._convert = convert
        self._socket = socket_of(response)

    def read(self) -> T | None:
        while True:
            with http_errors("reading the event stream"):
                try:
                    sse = next(self._events)
                except StopIteration:
                    return None
            out = self._convert(sse)
            if out is not None:
                return out

    def abort(self) -> None:
        shutdown(self._socket)

    def close(self) -> None:
        self.abort()
        self._response.close()


class _GrpcConn(Conn, Generic[M, T]):
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


_AnyConn = _SseConn[Any] | _GrpcConn[Any, Any]


# -- the driver ------------------------------------------------------------------


class _Blocking(Resume[F, I]):
    """Runs the follower logic of _follow.py with blocking calls. `close()`
    may come from another thread: the connection state is under a lock, and
    a read in progress is aborted (its thread then closes the connection)."""

    def _init_driver(self, client: Client) -> None:
        self._client = client
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._conn: _AnyConn | None = None
        self._live = False  # stream_opened was read on self._conn
        self._reading = False

    def _run(self, steps: Generator[Op, Any, R]) -> R:
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                op = steps.throw(error) if error is not None else steps.send(value)
            except StopIteration as done:
                result: R = done.value
                return result
            value, error = None, None
            try:
                value = self._do(op)
            except BaseException as exc:  # thrown back into the steps
                error = exc

    def _do(self, op: Op) -> Any:
        if isinstance(op, Read):
            return self._read(op.conn)
        if isinstance(op, Current):
            with self._lock:
                return self._conn if self._live and not self._closed else None
        if isinstance(op, Open):
            with self._lock:
                if self._closed:
                    raise Stop
            conn = self._client._open_stream(op.spec)
            with self._lock:
                if not self._closed:
                    self._conn, self._live = conn, False
                    return conn
            conn.close()
            raise Stop
        if isinstance(op, Live):
            with self._lock:
                self._live = self._conn is op.conn
            return None
        if isinstance(op, Drop):
            with self._lock:
                if self._conn is op.conn:
                    self._conn, self._live = None, False
            op.conn.close()  # type: ignore[attr-defined]
            return None
        if isinstance(op, Sleep):
            if self._wake.wait(op.seconds):
                raise Stop
            return None
        if isinstance(op, Call):
            return self._client._unary(op.call, rest=op.rest)
        if isinstance(op, Kick):
            with self._lock:
                reading = self._reading
                if self._conn is op.conn and not reading:
                    self._conn, self._live = None, False
            if reading:
                op.conn.abort()  # type: ignore[attr-defined]  # the reading thread drops it
            else:
                op.conn.close()  # type: ignore[attr-defined]
            return None
        raise AssertionError(f"unknown operation {op!r}")

    def _read(self, conn: Conn) -> Any:
        assert isinstance(conn, (_SseConn, _GrpcConn))
        with self._lock:
            if self._closed:
                raise Stop
            self._reading = True
        try:
            return conn.read()
        finally:
            with self._lock:
                self._reading = False
                closed = self._closed
            if closed:
                conn.close()
                raise Stop

    @property
    def connected(self) -> bool:
        """Whether a stream is open right now."""
        with self._lock:
            return self._live

    @property
    def closed(self) -> bool:
        with self._lock:
            return self._closed

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

    def open(self) -> agent_pb2.StreamOpened:
        """Connects now (if not connected) and returns the `stream_opened`."""
        try:
            return self._run(self._open_steps())
        except Stop:
            raise VakError(499, "cancelled", "the follower is closed", reached=False) from None
        except BaseException:
            self.close()
            raise

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> I:
        try:
            return self._run(self._next_item())
        except Stop:
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


class Follower(_Blocking[agent_pb2.Event, agent_pb2.Event], SessionStream, Iterator[agent_pb2.Event]):
    """The events of one session, resuming transparently after a connection loss.

    Iterate it for `Event`s. It remembers the seq of the last event it
    handed over (`cursor`) and reconnects with it (SSE `Last-Event-ID`, gRPC
    `after`) with bounded exponential backoff, so the caller sees every
    session event exactly once, in order, across reconnects.

    Stream-level frames: `stream_opened` is consumed, never yielded (see
    `open()` and `opened`); `resync` is yielded once the follower has acted
    on it: the cursor could not be served exactly, so it stopped reading that
    stream, fetched the transcript (`transcript`, exact as of its `seq`),
    set the cursor to that seq and opened a new stream after it; show the
    transcript in place of what you had, and the events that follow continue
    it. `session_closed` (server shutdown) is yielded and ends the iteration.
    Only session events and a resync move the cursor.

    With `after=None` the follower starts live: `cursor` becomes the
    session's latest seq when the stream opens, so what follows is still
    exact across reconnects. Use it as a context manager (the stream is open
    once the `with` body starts) or call `open()`; `close()` ends it, from
    any thread.
    """

    def __init__(
        self, client: Client, session_id: str, after: int | None, transport: Transport, backoff: Backoff
    ) -> None:
        self._init_session(session_id, after, transport, backoff)
        self._init_driver(client)


class StreamFollower(_Blocking[MuxFrame, StreamItem], MuxStream, Iterator[StreamItem]):
    """Many sessions on one multiplexed stream (`GET /stream` or the `Stream`
    RPC), resuming transparently with the cursor vector.

    Iterate it for `StreamItem(session_id, kind, message)`; see StreamItem
    for the kinds. `cursor` is the cursor vector as of the last item handed
    over; a reconnect resumes from it (SSE `Last-Event-ID`, gRPC `cursor`)
    and agent frames at or below a session's entry are never handed over
    twice. `stream_opened` is consumed, not yielded: it sets `stream_id`
    (which changes on every reconnect). `resync` is yielded once the
    follower has acted on it: it stopped reading that stream, fetched that
    session's transcript (`transcripts[session_id]`, exact as of its `seq`)
    and opened the stream again with that session's entry set to that seq;
    show the transcript in place of what you had for that session. The iteration ends after the server closed the
    stream with `session_closed` frames (shutdown), or on `close()`.

    `follow()` / `unfollow()` change the live stream (over REST
    `POST /stream/{stream_id}/follow` over SSE, the `Follow` RPC
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
        self._init_mux(sessions, cursor, transport, backoff, host, config)
        self._init_driver(client)

    def follow(self, session_id: str, after: int | None = None) -> list[str]:
        """Adds a session (from `after`, else live); returns the followed sessions.

        When the stream is not live (not opened yet, or reconnecting) the
        session is only recorded: the next connection includes it."""
        return self._run(self._follow_steps(session_id, after))

    def unfollow(self, session_id: str) -> list[str]:
        """Removes a session; no item of it is handed over afterwards."""
        return self._run(self._unfollow_steps(session_id))


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


class Client(ClientConfig):
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
        super().__init__(
            url,
            token,
            timeout=timeout,
            unary=unary,
            transport=transport,
            backoff=backoff,
            idle_timeout=idle_timeout,
        )
        credentials = self._grpc_credentials()
        if credentials is not None:
            self._channel = grpc.secure_channel(self.endpoint.target, credentials, GRPC_OPTIONS)
        else:
            self._channel = grpc.insecure_channel(self.endpoint.target, GRPC_OPTIONS)
        self._subscribe_rpc = self._channel.unary_stream(
            "/vak.v1.AgentService/Subscribe",
            request_serializer=_serialize,
            response_deserializer=agent_pb2.Event.FromString,
        )
        self._http = httpx.Client(**self._httpx_options())
        self._stub: Any = None

    # -- plumbing ---------------------------------------------------------

    @property
    def stub(self) -> Any:
        """The generated `AgentServiceStub` on this client's channel, for raw gRPC."""
        if self._stub is None:
            from vak_client._gen import agent_pb2_grpc

            self._stub = agent_pb2_grpc.AgentServiceStub(self._channel)  # type: ignore[no-untyped-call]
        return self._stub

    def _rest(self, method: str, path: str, data: bytes | None, timeout: float | None = None) -> httpx.Response:
        with http_errors(f"{method} {path}"):
            response = self._http.request(
                method, path, content=data, headers=rest_headers(data), timeout=timeout or httpx.USE_CLIENT_DEFAULT
            )
        check_rest(response)
        return response

    def request(self, method: str, path: str, body: Any = None) -> RestResponse:
        """One raw REST call with a JSON body; raises `VakError` for a non-2xx answer."""
        response = self._rest(method, path, json_body(body))
        return RestResponse(response.status_code, parse_rest_json(response.status_code, response.content))

    def _unary(self, call: UnaryCall[Req, Resp], *, rest: bool | None = None) -> Resp:
        if self._use_rest(rest):
            raw = self._rest(call.http_method, call.path, rest_body(call), self._call_timeout(call)).content
            return rest_response(call, raw)
        rpc = self._channel.unary_unary(
            call.method, request_serializer=_serialize, response_deserializer=call.response.FromString
        )
        try:
            return rpc(call.request, timeout=self._call_timeout(call), metadata=self.metadata)
        except grpc.RpcError as err:
            raise rpc_error(err) from None

    def _open_stream(self, spec: SseSpec[Any] | GrpcSpec[Any, Any]) -> _AnyConn:
        """One attempt to open a follower's stream."""
        if isinstance(spec, GrpcSpec):
            rpc = self._channel.unary_stream(
                spec.method, request_serializer=_serialize, response_deserializer=spec.response.FromString
            )
            return _GrpcConn(rpc(spec.request, metadata=self.metadata), spec.convert)
        request = self._sse_request(self._http, spec.path, spec.last_event_id)
        with http_errors(f"GET {spec.path}"):
            response = self._http.send(request, stream=True)
            try:
                if response.status_code != 200:
                    response.read()
                check_sse(response, spec.path)
            except BaseException:
                response.close()
                raise
        return _SseConn(response, spec.convert)

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
        self,
        session_id: str,
        request_id: str,
        approve: bool,
        reason: str = "",
        *,
        always: bool = False,
        mode: str | None = None,
    ) -> agent_pb2.ApproveResponse:
        """Answers the pending approval `request_id` (the `ap_...` id of approval_requested).

        `always=True` (with `approve=True`, on a bash, write_file, edit_file or
        MCP tool call) also stores an always-allow rule for what the call does
        (for an MCP tool, of kind "tool": every call of that tool): the
        answer's `persisted` says whether it was stored, `rule` is the rule.
        `mode` ("accept-edits" or "default") answers an exit_plan_mode approval."""
        return self._unary(call_approve(session_id, request_id, approve, reason, always=always, mode=mode))

    def set_mode(self, mode: str) -> agent_pb2.SetModeResponse:
        """Switches the server's permission mode ("default", "accept-edits",
        "plan", "bypass"); a change denies pending approvals and cancels runs first."""
        return self._unary(call_set_mode(mode))

    def list_rules(self, workspace: str | None = None) -> agent_pb2.ListRulesResponse:
        """The always-allow rules of the server's workspace, or of the open
        workspace at `workspace` (an absolute path, as `/workspaces` lists it)."""
        return self._unary(call_list_rules(workspace))

    def delete_rule(self, rule_id: str, workspace: str | None = None) -> agent_pb2.DeleteRuleResponse:
        """Deletes an always-allow rule of the server's workspace or of the open
        `workspace` (`VakError` with code "not_found" for an unknown id or workspace)."""
        return self._unary(call_delete_rule(rule_id, workspace))

    def get_mcp_config(self) -> agent_pb2.McpConfig:
        """The MCP servers (`GET /config/mcp`): by name, each its definition and
        live state: `json_name(server, "state")` is "starting", "ready",
        "failed" or "disabled"; `tools` (the model-facing names
        `mcp__<server>__<tool>`), `tool_count`, `pid`, `restarts`, `last_error`."""
        return self._unary(call_get_mcp_config())

    def put_mcp_config(self, servers: McpServers) -> agent_pb2.McpConfig:
        """Replaces the MCP servers (`PUT /config/mcp`): the whole table by name
        (a server left out is removed), each an `McpServer` (what
        `get_mcp_config` answered can be put back as it is) or its JSON
        (`{"command": "python3", "args": ["server.py"]}`, `{"url": ...}`).
        Applied without a restart; answers the new table once the servers it
        started are ready or failed (up to 30 s, which this call waits). An
        invalid table is `VakError` 400 naming the field (`servers.NAME.FIELD`)."""
        return self._unary(call_put_mcp_config(servers))

    # -- scheduled tasks and the digest (docs/protocol.md section 31) ----------

    def list_tasks(self) -> agent_pb2.ListTasksResponse:
        """Every task, oldest first (`tasks`), and the time zone schedules are read in (`timezone`)."""
        return self._unary(call_list_tasks())

    def create_task(
        self,
        name: str,
        prompt: str | None = None,
        script: str | None = None,
        schedule: str | None = None,
        session_id: str | None = None,
        model_pin: str | None = None,
        enabled: bool | None = None,
        workspace: str | None = None,
    ) -> agent_pb2.Task:
        """Creates a task (`POST /tasks`): exactly one of `prompt` (run by the
        model in `session_id`, or in a new session per fire) and `script` (a
        shell command whose trimmed stdout is delivered to its session as a
        `background_result`); `schedule` a 5-field cron (None: run-now only).
        A refused task is `VakError` 400 whose message starts with the field
        (`schedule: ...`); past the most tasks kept, 429."""
        call = call_create_task(
            name,
            prompt=prompt,
            script=script,
            schedule=schedule,
            session_id=session_id,
            model_pin=model_pin,
            enabled=enabled,
            workspace=workspace,
        )
        return self._unary(call).task

    def get_task(self, task_id: str) -> agent_pb2.Task:
        """One task, with `next_fire` and `last_fire` (`json_name(task.last_fire, "outcome")`)."""
        return self._unary(call_get_task(task_id)).task

    def update_task(self, task_id: str, **fields: Any) -> agent_pb2.Task:
        """Changes the fields given (`name`, `prompt`, `script`, `schedule`,
        `session_id`, `model_pin`, `enabled`): `update_task(id, enabled=False)`;
        an empty string clears `schedule`, `session_id` or `model_pin`, and
        setting `prompt` or `script` replaces the other."""
        return self._unary(call_update_task(task_id, fields)).task

    def delete_task(self, task_id: str) -> agent_pb2.DeleteTaskResponse:
        """Deletes a task (`VakError` 404 for an unknown id); a fire in flight finishes."""
        return self._unary(call_delete_task(task_id))

    def run_task_now(self, task_id: str) -> agent_pb2.Task:
        """Fires a task now and resets its schedule from now (`POST
        /tasks/ID/run-now`, 202): answers once the fire has started; its result
        arrives on the session's stream (`background_result`, or the run)."""
        return self._unary(call_run_task_now(task_id)).task

    def digest(self, days: int | None = None) -> agent_pb2.Digest:
        """Spend and usage per day (`GET /digest?days=N`, 1 to 90; None: the
        server's default, 7): `days` oldest first, each with `by_model` and
        `by_session` maps of `DigestUsage`; `total`, `unpriced`, `today_usd`."""
        return self._unary(call_digest(days))

    # -- workers, best-of-N, dev servers, the PR view (docs/protocol.md 33) ----

    def list_workers(self, session_id: str) -> list[agent_pb2.Worker]:
        """The session's children, workers and best-of-N candidates, oldest
        first: each with `id` (its own session id, followable), `kind`,
        `state`, `branch`, `worktree`, `summary` and `diff_stat`
        (`json_name(w, "state")` gives "running", "finished", ...)."""
        return list(self._unary(call_list_workers(session_id)).workers)

    def steer_worker(self, session_id: str, child_id: str, text: str) -> agent_pb2.Worker:
        """Queues `text` for one child (`VakError` 404 unless it is the session's)."""
        return self._unary(call_steer_worker(session_id, child_id, text))

    def stop_worker(self, session_id: str, child_id: str) -> agent_pb2.Worker:
        """Cancels one child's run and kills its processes."""
        return self._unary(call_stop_worker(session_id, child_id))

    def start_best_of_n(self, session_id: str, prompt: str, n: int) -> agent_pb2.StartBestOfNResponse:
        """`n` isolated runs of `prompt`, each on its own branch and worktree
        (`bestofn_id`, `candidates`); outside git `VakError` 400, reason
        `not_a_git_repo`."""
        return self._unary(call_start_best_of_n(session_id, prompt, n))

    def keep_candidate(self, session_id: str, candidate: str) -> agent_pb2.KeepCandidateResponse:
        """Merges a finished candidate's branch into the workspace's branch and
        discards the others; `VakError` 409 while it runs or on a conflict."""
        return self._unary(call_keep_candidate(session_id, candidate))

    def discard_candidate(self, session_id: str, candidate: str) -> agent_pb2.DraftDiscarded:
        """Removes a candidate's worktree and branch (stopping it first)."""
        return self._unary(call_discard_candidate(session_id, candidate))

    def list_launch(self, session_id: str) -> list[agent_pb2.LaunchConfig]:
        """The workspace's dev servers (`.vak/launch.toml`, package.json's
        dev/start/serve scripts), each with `running`, `pid`, `exit_code`."""
        return list(self._unary(call_list_launch(session_id)).configs)

    def start_launch(self, session_id: str, name: str) -> agent_pb2.LaunchStarted:
        """Starts a dev server (`VakError` 409 when it runs already)."""
        return self._unary(call_start_launch(session_id, name))

    def stop_launch(self, session_id: str, name: str) -> agent_pb2.LaunchStopped:
        """Stops a dev server: SIGTERM, SIGKILL after 5 s (`was_running`)."""
        return self._unary(call_stop_launch(session_id, name))

    def launch_logs(self, session_id: str, name: str, tail: int | None = None) -> agent_pb2.LaunchLogs:
        """A dev server's latest output `lines` (the last `tail`; None: all the ring holds)."""
        return self._unary(call_launch_logs(session_id, name, tail))

    def get_pr(self, session_id: str) -> agent_pb2.PrView:
        """The pull request of the workspace's branch; none is a `reason`
        (`json_name(pr, "reason")`: "no_pr", "gh_unavailable",
        "not_a_git_repo"), not an error."""
        return self._unary(call_get_pr(session_id))

    def merge_pr(self, session_id: str, number: int, method: str = "squash") -> agent_pb2.MergePrResponse:
        """`gh pr merge NUMBER --auto --METHOD` ("squash", "merge" or
        "rebase"); gh's failure is `VakError` 502 with its stderr's tail."""
        return self._unary(call_merge_pr(session_id, number, method))

    # -- commitments: the plan the model keeps (docs/protocol.md section 38) ---

    def list_commitments(self, all: bool = False) -> agent_pb2.CommitmentList:
        """The commitments of the server's workspace's sessions (`all=True`:
        every workspace's) in their natural order (`commitments`), and beside
        them the open ones highest score first (`priorities`: `id`, `score`,
        `reasons` such as "stakes: high (+30)"); `workspace` is the one listed
        ("" with `all=True`). `json_name(c, "status")` is "pending",
        "in_progress", "done" or "dropped"; `c.HasField("closed")` once closed."""
        return self._unary(call_list_commitments(all))

    def get_commitment(self, commitment_id: str) -> agent_pb2.CommitmentDetail:
        """One commitment (`<session id>.<item>`): `commitment`, its recent
        `events` (`seq`, `change`, `commitment`) oldest first, and `missing`:
        what a fulfilled close would still need, in words (empty: it would
        close). `VakError` 404 for an unknown one, 400 for a malformed id."""
        return self._unary(call_get_commitment(commitment_id))

    def close_commitment(self, commitment_id: str, verdict: str, note: str | None = None) -> agent_pb2.Commitment:
        """Closes a commitment as "fulfilled", "abandoned" or "superseded"
        (another verdict is `VakError` 400 before any call); answers it with
        `closed` (`verdict`, `note`, `at`). A fulfilled close the cited
        evidence does not support is `VakError` 409 with `reason`
        "evidence_missing", whose message names each missing piece; one
        already closed is 409 with `reason` "already_closed"."""
        return self._unary(call_close_commitment(commitment_id, verdict, note))

    # -- intent: how a prompt reads before it runs (docs/protocol.md section 39) --

    def explain_intent(
        self,
        prompt: str,
        *,
        surface: str | None = None,
        act: str | None = None,
        horizon: str | None = None,
        stakes: str | None = None,
        evidence: Iterable[str] | None = None,
    ) -> agent_pb2.IntentExplanation:
        """Reads `prompt` without running it (no model call, nothing written):
        `reading` (`act`, `horizon`, `stakes`, `evidence`, and the `signals`
        that set them: `field`, `value`, `because`), the `engagement` that
        implies (`mode`, `tools`, `approvals`, `route`, `plan_first`,
        `read_only`) and `baseline_diff`, how it differs from bypass mode
        with every tool. `surface` ("api", "app", "term", "ide", "task"),
        `act`, `horizon`, `stakes` (by their JSON names) and `evidence` (a
        list of "tool_ok", "file_changed", "approval"; `[]`: none) are what
        the caller already knows and win over the words; None leaves one to
        the words. A name no enum has is `VakError` 400 before any call."""
        return self._unary(
            call_explain_intent(prompt, surface=surface, act=act, horizon=horizon, stakes=stakes, evidence=evidence)
        )

    def intent_policy(self) -> agent_pb2.IntentPolicy:
        """The `[intent]` and `[commitment]` policy in effect (`intent`:
        `high_stakes_mode`, `read_only_acts`, `plan_first_at`; `commitment`:
        `require_evidence`), and each value's `sources` (`key`, `source`:
        "default" or "file")."""
        return self._unary(call_intent_policy())

    # -- learned skills (docs/protocol.md section 41) ---------------------

    def list_skills(self, session_id: str | None = None) -> agent_pb2.SkillList:
        """The skills promoted for the server's `workspace` (or, given
        `session_id`, that session's), its own then the home's (`skills`:
        `name`, `description`, `kind` "prompt" or "script", `body`, `scope`
        "workspace" or "global", `path`). Each is a slash command: a prompt
        `/NAME ARGUMENTS` asks the model to use it."""
        return self._unary(call_list_skills(session_id))

    def list_skill_proposals(self) -> agent_pb2.SkillProposals:
        """Every kept skill proposal, oldest first (`proposals`: `id`, `name`,
        `body`, `kind`, `source` (`session`, `seqs`), `duplicate_of`, `tags`,
        `state` "pending", "promoted" or "rejected", `workspace`, ...). A tool
        sequence completed twice in a workspace makes one, shortly after the
        second run finishes."""
        return self._unary(call_list_skill_proposals())

    def create_skill_proposal(
        self, from_session: str, *, seq_range: tuple[int, int] | None = None, name: str | None = None
    ) -> agent_pb2.SkillProposal:
        """A proposal made at once from the messages of `from_session` with
        seq in `seq_range` (`(from, to)`, inclusive; None: the whole
        session), named `name` (None: from its body's first words)."""
        return self._unary(call_create_skill_proposal(from_session, seq_range=seq_range, name=name))

    def promote_skill_proposal(
        self, proposal_id: str, *, scope: str | None = None, name: str | None = None
    ) -> agent_pb2.Skill:
        """Writes a pending proposal as a skill file, in its workspace's
        `.vak/skills/` (`scope` "workspace", the default) or the home's
        (`scope="global"`), under `name` when given; answers the `Skill`.
        `VakError` 409 with `reason` "skill_exists" when a skill there has
        the name, "proposal_settled" when it was promoted or rejected."""
        return self._unary(call_promote_skill_proposal(proposal_id, scope=scope, name=name))

    def reject_skill_proposal(self, proposal_id: str) -> agent_pb2.SkillProposal:
        """Settles a pending proposal without a file; answers it ("rejected").
        `VakError` 409 with `reason` "proposal_settled" when already settled."""
        return self._unary(call_reject_skill_proposal(proposal_id))

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
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
