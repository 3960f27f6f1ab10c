"""A small typed client for the vak agent server.

One `Client` talks to one server over both of its surfaces: gRPC
(`create_session`, `subscribe`) and REST (`run`, `request`). Both use the
same base URL (the server serves gRPC and HTTP/JSON on one port) and the
same bearer token. Messages are the classes generated from
proto/vak/v1/agent.proto by generate.py (see `vak_client._gen.agent_pb2`).

Proxy settings from the environment are ignored: the server is reached
directly.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import grpc
from google.protobuf import json_format

try:
    from vak_client._gen import agent_pb2, agent_pb2_grpc
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the build step
    if not (exc.name or "").startswith("vak_client._gen"):
        raise
    raise ImportError(
        "vak_client: the generated protobuf modules are missing; "
        "run `python clients/python/generate.py` first"
    ) from exc

__all__ = [
    "Admission",
    "Client",
    "Event",
    "RestResponse",
    "Subscription",
    "VakError",
    "agent_pb2",
    "agent_pb2_grpc",
]

Event = agent_pb2.Event
Admission = agent_pb2.Admission


class VakError(Exception):
    """A REST call answered with an unexpected HTTP status.

    `code` and `message` come from the `{"error": {"code", "message"}}`
    envelope when the body has one; otherwise `code` is "" and `message`
    holds the start of the raw body.
    """

    def __init__(self, status: int, code: str, message: str, body: str) -> None:
        super().__init__(f"HTTP {status}: {code or '-'}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.body = body


@dataclass(frozen=True)
class RestResponse:
    status: int
    body: Any  # parsed JSON, or None when the body was empty


class Subscription(Iterator[agent_pb2.Event]):
    """The server stream of one Subscribe call: iterate it for `Event`s.

    Iteration ends cleanly when the server closes the stream or after
    `cancel()`; any other gRPC failure raises `grpc.RpcError`.
    """

    def __init__(self, call: Any) -> None:
        self._call = call
        self._cancelled = False

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> agent_pb2.Event:
        try:
            event: agent_pb2.Event = next(self._call)
        except grpc.RpcError as err:
            if self._cancelled and err.code() == grpc.StatusCode.CANCELLED:
                raise StopIteration from None
            raise
        return event

    def cancel(self) -> None:
        self._cancelled = True
        self._call.cancel()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cancel()


class Client:
    """A client for one vak server.

    `url` is the server's base URL, e.g. "http://127.0.0.1:8080" (what
    `vak serve` prints after "listening on"). `token` is sent as
    `authorization: Bearer <token>` on every call; `None` sends no
    credentials. `timeout` bounds every unary RPC and REST call (seconds).
    """

    def __init__(self, url: str, token: str | None, *, timeout: float = 10.0) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http(s)://host[:port] URL, got {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        host = parts.hostname
        if ":" in host:  # IPv6 literal
            host = f"[{host}]"
        self.base_url = f"{parts.scheme}://{host}:{port}"
        self.token = token
        self.timeout = timeout

        options = [("grpc.enable_http_proxy", 0)]
        target = f"{host}:{port}"
        if parts.scheme == "https":
            self._channel = grpc.secure_channel(target, grpc.ssl_channel_credentials(), options)
        else:
            self._channel = grpc.insecure_channel(target, options)
        # The generated stub is untyped; calls on it return the agent_pb2 messages.
        self.stub: Any = agent_pb2_grpc.AgentServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._http = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    # -- plumbing ---------------------------------------------------------

    @property
    def metadata(self) -> list[tuple[str, str]]:
        """gRPC metadata to pass to any `self.stub` call."""
        return [("authorization", f"Bearer {self.token}")] if self.token is not None else []

    def request(self, method: str, path: str, body: Any = None) -> RestResponse:
        """One REST call. Raises `VakError` for a non-2xx answer."""
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.base_url + path, data=data, headers=headers, method=method)
        try:
            with self._http.open(req, timeout=self.timeout) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as err:
            raw = err.read()
            err.close()
            raise _rest_error(err.code, raw) from None
        try:
            parsed = json.loads(raw) if raw.strip() else None
        except ValueError:
            text = raw.decode("utf-8", "replace")
            raise VakError(status, "", f"response is not JSON: {text[:200]!r}", text) from None
        return RestResponse(status, parsed)

    # -- the API ----------------------------------------------------------

    def create_session(self) -> str:
        """gRPC CreateSession; returns the new session id."""
        resp: agent_pb2.CreateSessionResponse = self.stub.CreateSession(
            agent_pb2.CreateSessionRequest(), metadata=self.metadata, timeout=self.timeout
        )
        return resp.session_id

    def run(self, session_id: str, prompt: str, request_id: str | None = None) -> agent_pb2.Admission:
        """REST `POST /sessions/{id}/run`; expects 202 and returns the admission."""
        body: dict[str, str] = {"prompt": prompt}
        if request_id is not None:
            body["request_id"] = request_id
        path = f"/sessions/{urllib.parse.quote(session_id, safe='')}/run"
        resp = self.request("POST", path, body)
        if resp.status != 202 or not isinstance(resp.body, dict):
            raise VakError(
                resp.status, "", f"expected 202 and a JSON object from {path}", json.dumps(resp.body)
            )
        admission = agent_pb2.Admission()
        json_format.ParseDict(resp.body, admission, ignore_unknown_fields=True)
        return admission

    def subscribe(
        self, session_id: str, after: int | None = None, *, timeout: float | None = None
    ) -> Subscription:
        """gRPC Subscribe: stream_opened first, then replay after `after`
        (when given), then live events. `timeout` bounds the whole stream
        (default: unbounded)."""
        req = agent_pb2.SubscribeRequest(session_id=session_id)
        if after is not None:
            req.after = after
        call = self.stub.Subscribe(req, metadata=self.metadata, timeout=timeout)
        return Subscription(call)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _rest_error(status: int, raw: bytes) -> VakError:
    text = raw.decode("utf-8", "replace")
    try:
        err = json.loads(text)["error"]
        return VakError(status, str(err["code"]), str(err["message"]), text)
    except (ValueError, KeyError, TypeError):
        return VakError(status, "", text[:500], text)
