"""The asyncio client: `AsyncClient`, `AsyncFollower` and
`AsyncStreamFollower`. REST and SSE go through httpx (`httpx.AsyncClient`,
`httpx_sse.EventSource`), gRPC through grpc.aio; the wire logic is shared
with the blocking client (_common.py, _follow.py): this module only makes
the awaited calls."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Generator, Iterable
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

import grpc
import grpc.aio
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
    F,
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
)
from vak_client._gen import agent_pb2

T = TypeVar("T")
M = TypeVar("M")


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


# -- connections ---------------------------------------------------------------------


class _ASseConn(Conn, Generic[T]):
    def __init__(self, response: httpx.Response, convert: Callable[[ServerSentEvent], T | None]) -> None:
        self._response = response
        self._events = EventSource(response).aiter_sse()
        self._convert = convert
        self._socket = socket_of(response)

    async def read(self) -> T | None:
        while True:
            with http_errors("reading the event stream"):
                try:
                    sse = await anext(self._events)
                except StopAsyncIteration:
                    return None
            out = self._convert(sse)
            if out is not None:
                return out

    def abort(self) -> None:
        """Ends a pending read at once (from any task)."""
        shutdown(self._socket)

    async def aclose(self) -> None:
        self.abort()
        with contextlib.suppress(Exception):
            await self._response.aclose()


class _AGrpcConn(Conn, Generic[M, T]):
    def __init__(self, call: grpc.aio.UnaryStreamCall[Any, M], convert: Callable[[M], T | None]) -> None:
        self._call = call
        self._convert = convert
        self._aborted = False

    async def read(self) -> T | None:
        while True:
            try:
                msg = await self._call.read()
            except grpc.RpcError as err:
                raise rpc_error(err) from None
            except asyncio.CancelledError:
                if self._aborted:
                    # grpc.aio reports our own cancel() (from abort()) this way.
                    raise VakError(499, "cancelled", "the stream was cancelled", reached=False) from None
                raise
            if msg is grpc.aio.EOF:
                return None
            out = self._convert(msg)  # type: ignore[arg-type]
            if out is not None:
                return out

    def abort(self) -> None:
        self._aborted = True
        self._call.cancel()

    async def aclose(self) -> None:
        self.abort()


_AnyAConn = _ASseConn[Any] | _AGrpcConn[Any, Any]


# -- the driver ----------------------------------------------------------------------


class _Awaiting(Resume[F, I]):
    """Runs the follower logic of _follow.py with awaits, in one event loop."""

    def _init_driver(self, client: AsyncClient) -> None:
        self._client = client
        self._closed = False
        self._wake = asyncio.Event()
        self._conn: _AnyAConn | None = None
        self._live = False
        self._closing: set[asyncio.Task[None]] = set()

    async def _run(self, steps: Generator[Op, Any, R]) -> R:
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
                value = await self._do(op)
            except BaseException as exc:  # thrown back into the steps
                error = exc

    async def _do(self, op: Op) -> Any:
        if isinstance(op, Read):
            return await self._read(op.conn)
        if isinstance(op, Current):
            return self._conn if self._live and not self._closed else None
        if isinstance(op, Open):
            if self._closed:
                raise Stop
            conn = await self._client._open_stream(op.spec)
            if self._closed:
                await conn.aclose()
                raise Stop
            self._conn, self._live = conn, False
            return conn
        if isinstance(op, Live):
            self._live = self._conn is op.conn
            return None
        if isinstance(op, (Drop, Kick)):
            if self._conn is op.conn:
                self._conn, self._live = None, False
            await op.conn.aclose()  # type: ignore[attr-defined]
            return None
        if isinstance(op, Sleep):
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(op.seconds):
                    await self._wake.wait()
            if self._closed:
                raise Stop
            return None
        if isinstance(op, Call):
            return await self._client._unary(op.call, rest=op.rest)
        raise AssertionError(f"unknown operation {op!r}")

    async def _read(self, conn: Conn) -> Any:
        assert isinstance(conn, (_ASseConn, _AGrpcConn))
        if self._closed:
            raise Stop
        try:
            return await conn.read()
        finally:
            if self._closed:
                conn.abort()
                raise Stop

    @property
    def connected(self) -> bool:
        return self._live

    @property
    def closed(self) -> bool:
        return self._closed

    def _shut(self) -> _AnyAConn | None:
        if self._closed:
            return None
        self._closed = True
        self._wake.set()
        conn, self._conn, self._live = self._conn, None, False
        if conn is not None:
            conn.abort()
        return conn

    def close_nowait(self) -> None:
        """Stops following; a pending `__anext__` ends with StopAsyncIteration.
        (The connection is released by a task; `aclose()` waits for it.)"""
        conn = self._shut()
        if conn is not None:
            with contextlib.suppress(RuntimeError):  # no running loop: nothing left to release
                task = asyncio.get_running_loop().create_task(conn.aclose())
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)

    async def aclose(self) -> None:
        """Stops following and releases the connection."""
        conn = self._shut()
        if conn is not None:
            await conn.aclose()

    async def open(self) -> agent_pb2.StreamOpened:
        """Connects now (if not connected) and returns the `stream_opened`."""
        try:
            return await self._run(self._open_steps())
        except Stop:
            raise VakError(499, "cancelled", "the follower is closed", reached=False) from None
        except BaseException:
            self.close_nowait()
            raise

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> I:
        try:
            return await self._run(self._next_item())
        except Stop:
            await self.aclose()
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
        await self.aclose()


class AsyncFollower(_Awaiting[agent_pb2.Event, agent_pb2.Event], SessionStream, AsyncIterator[agent_pb2.Event]):
    """The asyncio `Follower`: the same resume rules, `async for` it.
    `async with client.follow(sid) as events:` opens the stream first."""

    def __init__(
        self, client: AsyncClient, session_id: str, after: int | None, transport: Transport, backoff: Backoff
    ) -> None:
        self._init_session(session_id, after, transport, backoff)
        self._init_driver(client)


class AsyncStreamFollower(_Awaiting[MuxFrame, StreamItem], MuxStream, AsyncIterator[StreamItem]):
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
        self._init_mux(sessions, cursor, transport, backoff, host, config)
        self._init_driver(client)

    async def follow(self, session_id: str, after: int | None = None) -> list[str]:
        """Adds a session (from `after`, else live); returns the followed sessions.
        When the stream is not live the session is only recorded for the next connection."""
        return await self._run(self._follow_steps(session_id, after))

    async def unfollow(self, session_id: str) -> list[str]:
        """Removes a session; no item of it is handed over afterwards."""
        return await self._run(self._unfollow_steps(session_id))


# -- the client ------------------------------------------------------------------------


class AsyncClient(ClientConfig):
    """The asyncio `Client`: the same methods as coroutines (`follow` and
    `follow_many` return async iterators). gRPC through grpc.aio (its channel
    is created on first use, in the running loop); REST and SSE through
    httpx.AsyncClient. `await client.close()` (or `async with`) when done."""

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
        self._aio_channel: grpc.aio.Channel | None = None
        self._http = httpx.AsyncClient(**self._httpx_options())

    def _channel(self) -> grpc.aio.Channel:
        if self._aio_channel is None:
            credentials = self._grpc_credentials()
            if credentials is not None:
                self._aio_channel = grpc.aio.secure_channel(self.endpoint.target, credentials, GRPC_OPTIONS)
            else:
                self._aio_channel = grpc.aio.insecure_channel(self.endpoint.target, GRPC_OPTIONS)
        return self._aio_channel

    async def _rest(self, method: str, path: str, data: bytes | None, timeout: float | None = None) -> httpx.Response:
        with http_errors(f"{method} {path}"):
            response = await self._http.request(
                method, path, content=data, headers=rest_headers(data), timeout=timeout or httpx.USE_CLIENT_DEFAULT
            )
        check_rest(response)
        return response

    async def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """One raw REST call with a JSON body: (status, parsed JSON or None)."""
        response = await self._rest(method, path, json_body(body))
        return response.status_code, parse_rest_json(response.status_code, response.content)

    async def _unary(self, call: UnaryCall[Req, Resp], *, rest: bool | None = None) -> Resp:
        if self._use_rest(rest):
            raw = (await self._rest(call.http_method, call.path, rest_body(call), self._call_timeout(call))).content
            return rest_response(call, raw)
        rpc = self._channel().unary_unary(
            call.method, request_serializer=_serialize, response_deserializer=call.response.FromString
        )
        try:
            return await rpc(call.request, timeout=self._call_timeout(call), metadata=self.metadata)
        except grpc.RpcError as err:
            raise rpc_error(err) from None

    async def _open_stream(self, spec: SseSpec[Any] | GrpcSpec[Any, Any]) -> _AnyAConn:
        """One attempt to open a follower's stream."""
        if isinstance(spec, GrpcSpec):
            rpc = self._channel().unary_stream(
                spec.method, request_serializer=_serialize, response_deserializer=spec.response.FromString
            )
            return _AGrpcConn(rpc(spec.request, metadata=self.metadata), spec.convert)
        request = self._sse_request(self._http, spec.path, spec.last_event_id)
        with http_errors(f"GET {spec.path}"):
            response = await self._http.send(request, stream=True)
            try:
                if response.status_code != 200:
                    await response.aread()
                check_sse(response, spec.path)
            except BaseException:
                await response.aclose()
                raise
        return _ASseConn(response, spec.convert)

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
        self,
        session_id: str,
        request_id: str,
        approve: bool,
        reason: str = "",
        *,
        always: bool = False,
        mode: str | None = None,
    ) -> agent_pb2.ApproveResponse:
        return await self._unary(call_approve(session_id, request_id, approve, reason, always=always, mode=mode))

    async def set_mode(self, mode: str) -> agent_pb2.SetModeResponse:
        return await self._unary(call_set_mode(mode))

    async def list_rules(self, workspace: str | None = None) -> agent_pb2.ListRulesResponse:
        return await self._unary(call_list_rules(workspace))

    async def delete_rule(self, rule_id: str, workspace: str | None = None) -> agent_pb2.DeleteRuleResponse:
        return await self._unary(call_delete_rule(rule_id, workspace))

    async def get_mcp_config(self) -> agent_pb2.McpConfig:
        return await self._unary(call_get_mcp_config())

    async def put_mcp_config(self, servers: McpServers) -> agent_pb2.McpConfig:
        return await self._unary(call_put_mcp_config(servers))

    # -- scheduled tasks and the digest (docs/protocol.md section 31) ----------

    async def list_tasks(self) -> agent_pb2.ListTasksResponse:
        return await self._unary(call_list_tasks())

    async def create_task(
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
        return (await self._unary(call)).task

    async def get_task(self, task_id: str) -> agent_pb2.Task:
        return (await self._unary(call_get_task(task_id))).task

    async def update_task(self, task_id: str, **fields: Any) -> agent_pb2.Task:
        return (await self._unary(call_update_task(task_id, fields))).task

    async def delete_task(self, task_id: str) -> agent_pb2.DeleteTaskResponse:
        return await self._unary(call_delete_task(task_id))

    async def run_task_now(self, task_id: str) -> agent_pb2.Task:
        return (await self._unary(call_run_task_now(task_id))).task

    async def digest(self, days: int | None = None) -> agent_pb2.Digest:
        return await self._unary(call_digest(days))

    # -- workers, best-of-N, dev servers, the PR view (docs/protocol.md 33) ----

    async def list_workers(self, session_id: str) -> list[agent_pb2.Worker]:
        return list((await self._unary(call_list_workers(session_id))).workers)

    async def steer_worker(self, session_id: str, child_id: str, text: str) -> agent_pb2.Worker:
        return await self._unary(call_steer_worker(session_id, child_id, text))

    async def stop_worker(self, session_id: str, child_id: str) -> agent_pb2.Worker:
        return await self._unary(call_stop_worker(session_id, child_id))

    async def start_best_of_n(self, session_id: str, prompt: str, n: int) -> agent_pb2.StartBestOfNResponse:
        return await self._unary(call_start_best_of_n(session_id, prompt, n))

    async def keep_candidate(self, session_id: str, candidate: str) -> agent_pb2.KeepCandidateResponse:
        return await self._unary(call_keep_candidate(session_id, candidate))

    async def discard_candidate(self, session_id: str, candidate: str) -> agent_pb2.DraftDiscarded:
        return await self._unary(call_discard_candidate(session_id, candidate))

    async def list_launch(self, session_id: str) -> list[agent_pb2.LaunchConfig]:
        return list((await self._unary(call_list_launch(session_id))).configs)

    async def start_launch(self, session_id: str, name: str) -> agent_pb2.LaunchStarted:
        return await self._unary(call_start_launch(session_id, name))

    async def stop_launch(self, session_id: str, name: str) -> agent_pb2.LaunchStopped:
        return await self._unary(call_stop_launch(session_id, name))

    async def launch_logs(self, session_id: str, name: str, tail: int | None = None) -> agent_pb2.LaunchLogs:
        return await self._unary(call_launch_logs(session_id, name, tail))

    async def get_pr(self, session_id: str) -> agent_pb2.PrView:
        return await self._unary(call_get_pr(session_id))

    async def merge_pr(self, session_id: str, number: int, method: str = "squash") -> agent_pb2.MergePrResponse:
        return await self._unary(call_merge_pr(session_id, number, method))

    # -- commitments: the plan the model keeps (docs/protocol.md section 38) ---

    async def list_commitments(self, all: bool = False) -> agent_pb2.CommitmentList:
        return await self._unary(call_list_commitments(all))

    async def get_commitment(self, commitment_id: str) -> agent_pb2.CommitmentDetail:
        return await self._unary(call_get_commitment(commitment_id))

    async def close_commitment(self, commitment_id: str, verdict: str, note: str | None = None) -> agent_pb2.Commitment:
        return await self._unary(call_close_commitment(commitment_id, verdict, note))

    # -- intent: how a prompt reads before it runs (docs/protocol.md section 39) --

    async def explain_intent(
        self,
        prompt: str,
        *,
        surface: str | None = None,
        act: str | None = None,
        horizon: str | None = None,
        stakes: str | None = None,
        evidence: Iterable[str] | None = None,
    ) -> agent_pb2.IntentExplanation:
        return await self._unary(
            call_explain_intent(prompt, surface=surface, act=act, horizon=horizon, stakes=stakes, evidence=evidence)
        )

    async def intent_policy(self) -> agent_pb2.IntentPolicy:
        return await self._unary(call_intent_policy())

    # -- learned skills (docs/protocol.md section 41) ---------------------

    async def list_skills(self, session_id: str | None = None) -> agent_pb2.SkillList:
        return await self._unary(call_list_skills(session_id))

    async def list_skill_proposals(self) -> agent_pb2.SkillProposals:
        return await self._unary(call_list_skill_proposals())

    async def create_skill_proposal(
        self, from_session: str, *, seq_range: tuple[int, int] | None = None, name: str | None = None
    ) -> agent_pb2.SkillProposal:
        return await self._unary(call_create_skill_proposal(from_session, seq_range=seq_range, name=name))

    async def promote_skill_proposal(
        self, proposal_id: str, *, scope: str | None = None, name: str | None = None
    ) -> agent_pb2.Skill:
        return await self._unary(call_promote_skill_proposal(proposal_id, scope=scope, name=name))

    async def reject_skill_proposal(self, proposal_id: str) -> agent_pb2.SkillProposal:
        return await self._unary(call_reject_skill_proposal(proposal_id))

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
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
