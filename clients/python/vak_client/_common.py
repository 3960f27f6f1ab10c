"""What the sync and the asyncio clients share: errors, URLs, the client
configuration (httpx and gRPC channel options), the unary call table (gRPC
and REST: request building and response/error mapping), SSE frame decoding,
and the cursor bookkeeping of the followers (pure state machines, no I/O).
The followers' resume logic is in _follow.py."""

from __future__ import annotations

import json
import random
import socket
import ssl
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, NamedTuple, TypeAlias, TypeVar, cast

import grpc
import httpx
from google.protobuf import json_format
from google.protobuf.descriptor import EnumDescriptor
from google.protobuf.message import Message
from httpx_sse import ServerSentEvent

try:
    from vak_client._gen import agent_pb2, http_pb2
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the build step
    if not (exc.name or "").startswith("vak_client._gen"):
        raise
    raise ImportError(
        "vak_client: the generated protobuf modules (vak_client._gen) are missing: "
        "install the package with pip (`pip install ./clients/python`, or `pip install -e` "
        "for development), whose build generates them from proto/"
    ) from exc

Transport: TypeAlias = Literal["sse", "grpc"]
"""How a follower reads its stream: Server-Sent Events or gRPC."""

Unary: TypeAlias = Literal["grpc", "rest"]
"""How a client makes its unary calls: gRPC (default) or REST/JSON."""

SERVICE = "vak.v1.AgentService"
DEFAULT_TIMEOUT = 10.0
# The server sends a keepalive comment every 15 s on SSE; three missed ones
# mean the connection is dead.
DEFAULT_IDLE_TIMEOUT = 45.0

GRPC_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.enable_http_proxy", 0),
    # Messages may be as large as the server's own limits allow.
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    # Detect a dead connection under a long-lived stream.
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    # Reconnect quickly after a connection loss; the followers have their own
    # backoff. (Not grpc.min_reconnect_backoff_ms: it is also the timeout of
    # one connection attempt, 20 s by default, and a small value fails
    # connections to a busy server.)
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]


# -- errors ---------------------------------------------------------------


class VakError(Exception):
    """A call failed: the server refused it, or the server could not be reached.

    The same error for both transports. `status` is the HTTP status (a gRPC
    status is mapped to the HTTP status the REST facade would have answered,
    per docs/protocol.md section 6); `code` the protocol's code string
    (`invalid_argument`, `unauthenticated`, `forbidden`, `not_found`,
    `conflict`, `unavailable`, ...); `message` the server's human text;
    `body` the raw REST body ("" for gRPC); `grpc_code` the gRPC status code
    when the call was made over gRPC. `reason` is the machine-readable reason
    some refusals carry beside `code` ("" when none): `evidence_missing` and
    `already_closed` (closing a commitment), `side_busy`, `not_a_git_repo`,
    an upstream failure's `network` or `timeout`, ... (REST: the body's
    `error.reason`; gRPC: the `vak-error-reason` metadata). `retryable` says
    whether the followers retry it.

    `reached` is False when no answer came back over REST/SSE: the client
    could not connect, the connection broke, or the server did not answer in
    time. Such an error is `503 unavailable` (retryable), and its text says
    what happened ("could not connect to http://127.0.0.1:8901: connection
    refused (GET /v1/sessions)"), never an HTTP status the server did not
    send. Over gRPC the library reports these failures itself as
    `UNAVAILABLE` (or `DEADLINE_EXCEEDED`) with its own words; the text of a
    gRPC error names the gRPC code, not an HTTP status.
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        body: str = "",
        grpc_code: grpc.StatusCode | None = None,
        *,
        reached: bool = True,
        reason: str = "",
    ) -> None:
        if not reached:
            text = message
        elif grpc_code is not None:
            text = f"gRPC {grpc_code.name}: {message}"
        else:
            text = f"HTTP {status}: {code or '-'}: {message}"
        super().__init__(text)
        self.status = status
        self.code = code
        self.message = message
        self.body = body
        self.grpc_code = grpc_code
        self.reached = reached
        self.reason = reason

    @property
    def retryable(self) -> bool:
        return self.status in (429, 500, 502, 503, 504)


class ProtocolError(VakError):
    """The server answered something this client cannot read (never retried)."""

    def __init__(self, message: str) -> None:
        super().__init__(0, "protocol_error", message)


def unreachable(message: str) -> VakError:
    """No answer came back from the server (`503 unavailable`, retryable)."""
    return VakError(503, "unavailable", message, reached=False)


def _origin(exc: httpx.RequestError) -> str:
    """scheme://host:port of the request that failed ("the server" when unknown)."""
    try:
        url = exc.request.url
    except RuntimeError:  # no request attached
        return "the server"
    port = f":{url.port}" if url.port is not None else ""
    host = f"[{url.host}]" if ":" in url.host else url.host
    return f"{url.scheme}://{host}{port}"


def _os_reason(exc: BaseException) -> str | None:
    """What the operating system said under an httpx error, in lower case words."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cur, ConnectionResetError):
            return "connection reset by the server"
        if isinstance(cur, socket.gaierror):
            return f"cannot resolve the host name ({cur.strerror or cur})"
        if isinstance(cur, ssl.SSLError):
            return f"TLS handshake failed ({cur.reason or cur})"
        if isinstance(cur, OSError) and cur.strerror:
            return cur.strerror[:1].lower() + cur.strerror[1:]
        cur = cur.__cause__ or cur.__context__
    return None


def transport_message(what: str, exc: BaseException) -> str:
    """What went wrong with a REST/SSE request that got no usable answer."""
    detail = _os_reason(exc) or str(exc) or type(exc).__name__
    if isinstance(exc, httpx.RequestError):
        origin = _origin(exc)
        if isinstance(exc, httpx.ConnectTimeout):
            said = f"could not connect to {origin}: no answer to the connection attempt in time"
        elif isinstance(exc, httpx.ConnectError):
            said = f"could not connect to {origin}: {detail}"
        elif isinstance(exc, httpx.ReadTimeout):
            said = f"{origin} sent nothing within the read timeout"
        elif isinstance(exc, httpx.TimeoutException):
            said = f"the request to {origin} timed out ({type(exc).__name__})"
        elif isinstance(exc, httpx.RemoteProtocolError):
            said = f"the connection to {origin} broke: {detail}"
        elif isinstance(exc, (httpx.ReadError, httpx.WriteError, httpx.CloseError)):
            said = f"the connection to {origin} broke: {detail}"
        elif isinstance(exc, httpx.DecodingError):
            said = f"could not decode the answer from {origin}: {detail}"
        else:
            said = f"request to {origin} failed: {detail}"
    else:
        said = f"{type(exc).__name__}: {detail}"
    return f"{said} ({what})"


def connection_error(what: str, exc: BaseException) -> VakError:
    return unreachable(transport_message(what, exc))


@contextmanager
def http_errors(what: str) -> Iterator[None]:
    """Turns httpx's transport failures inside the block into `503
    unavailable` errors with `reached=False` whose text says what happened."""
    try:
        yield
    except (httpx.TransportError, httpx.DecodingError, httpx.StreamError) as exc:
        raise connection_error(what, exc) from None


_GRPC_TO_HTTP: dict[grpc.StatusCode, tuple[int, str]] = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_argument"),
    grpc.StatusCode.OUT_OF_RANGE: (400, "invalid_argument"),
    grpc.StatusCode.UNAUTHENTICATED: (401, "unauthenticated"),
    grpc.StatusCode.PERMISSION_DENIED: (403, "forbidden"),
    grpc.StatusCode.NOT_FOUND: (404, "not_found"),
    grpc.StatusCode.FAILED_PRECONDITION: (409, "conflict"),
    grpc.StatusCode.ALREADY_EXISTS: (409, "conflict"),
    grpc.StatusCode.ABORTED: (409, "conflict"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "resource_exhausted"),
    grpc.StatusCode.UNIMPLEMENTED: (501, "unimplemented"),
    grpc.StatusCode.UNAVAILABLE: (503, "unavailable"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "deadline_exceeded"),
}


# The trailing metadata with a refusal's machine-readable reason (docs/protocol.md section 6).
REASON_METADATA = "vak-error-reason"


def grpc_error(code: grpc.StatusCode | None, details: str | None, reason: str = "") -> VakError:
    """A gRPC status as a VakError (any unlisted code is 500 internal)."""
    status, name = _GRPC_TO_HTTP.get(code, (500, "internal")) if code is not None else (500, "internal")
    return VakError(status, name, details or (code.name if code is not None else "unknown"), "", code, reason=reason)


def _grpc_reason(err: grpc.RpcError) -> str:
    """The `vak-error-reason` of a failed call's trailing metadata ("" when none)."""
    trailing = getattr(err, "trailing_metadata", None)
    # (None when the call got no answer: the library's own UNAVAILABLE.)
    pairs = trailing() if callable(trailing) else None
    for key, value in pairs or ():
        if key == REASON_METADATA:
            return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return ""


def rpc_error(err: grpc.RpcError) -> VakError:
    """A failed gRPC call (blocking or grpc.aio) as a VakError."""
    code = getattr(err, "code", None)
    details = getattr(err, "details", None)
    if callable(code) and callable(details):
        return grpc_error(code(), details(), _grpc_reason(err))
    return grpc_error(None, str(err))


def rest_error(status: int, raw: bytes) -> VakError:
    """A non-2xx REST answer as a VakError, reading the `{"error": {...}}` envelope."""
    text = raw.decode("utf-8", "replace")
    try:
        err = json.loads(text)["error"]
        reason = err.get("reason")
        return VakError(status, str(err["code"]), str(err["message"]), text, reason=reason if isinstance(reason, str) else "")
    except (ValueError, KeyError, TypeError):
        return VakError(status, "", text[:500], text)


# -- URLs and auth ----------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    scheme: str
    host: str  # bracketed when IPv6
    port: int

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    @property
    def target(self) -> str:
        """host:port, for gRPC channels."""
        return f"{self.host}:{self.port}"


def parse_url(url: str) -> Endpoint:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected an http(s)://host[:port] URL, got {url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    return Endpoint(parts.scheme, host, port)


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token is not None else ()


def auth_headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token is not None else {}


class ClientConfig:
    """What `Client` and `AsyncClient` are configured with, and how their
    httpx clients and gRPC channels are set up."""

    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        timeout: float,
        unary: Unary,
        transport: Transport,
        backoff: Backoff | None,
        idle_timeout: float,
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

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """gRPC metadata (the bearer token) to pass to any raw gRPC call."""
        return auth_metadata(self.token)

    def _httpx_options(self) -> dict[str, Any]:
        """Keyword arguments for httpx.Client / httpx.AsyncClient."""
        return {
            "base_url": self.base_url,
            "headers": auth_headers(self.token),
            "timeout": self.timeout,
            # The server is reached directly: no proxy or netrc from the environment.
            "trust_env": False,
            # Each open event stream holds a connection: no pool limit.
            "limits": httpx.Limits(max_connections=None, max_keepalive_connections=8),
            # The system's CA store (as ssl.create_default_context() finds it).
            "verify": ssl.create_default_context() if self.endpoint.scheme == "https" else True,
        }

    def _grpc_credentials(self) -> grpc.ChannelCredentials | None:
        """TLS credentials for an https URL (None: a plaintext channel)."""
        return grpc.ssl_channel_credentials() if self.endpoint.scheme == "https" else None

    def _sse_request(self, http: httpx.Client | httpx.AsyncClient, path: str, last_event_id: str | None) -> httpx.Request:
        """The GET that opens an event stream. A read may wait idle_timeout
        (the server sends a keepalive every 15 s)."""
        return http.build_request(
            "GET",
            path,
            headers=sse_headers(last_event_id),
            timeout=httpx.Timeout(self.timeout, read=self.idle_timeout),
        )

    def _call_timeout(self, call: UnaryCall[Any, Any]) -> float:
        """A unary call's deadline: the client's, or longer for a call the server may answer slowly."""
        return max(self.timeout, call.slow or 0.0)

    def _use_rest(self, rest: bool | None) -> bool:
        return self.unary == "rest" if rest is None else rest


def quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")


# -- backoff ----------------------------------------------------------------


@dataclass(frozen=True)
class Backoff:
    """How a follower reconnects after losing its stream.

    The first attempt after a loss is immediate; each failed attempt then
    waits `initial * factor**(n-1)` seconds, capped at `maximum`, with
    jitter (a random 50-100% of that). After `give_up_after` seconds
    without a successful connection (None: never) the follower raises the
    last error. Errors that retrying cannot fix (4xx, such as an unknown
    session or a wrong token) are raised at once.
    """

    initial: float = 0.05
    maximum: float = 2.0
    factor: float = 2.0
    give_up_after: float | None = 30.0

    def delay(self, failures: int) -> float:
        if failures <= 0:
            return 0.0
        base = min(self.maximum, self.initial * self.factor ** (failures - 1))
        return base * random.uniform(0.5, 1.0)


# A connection that lived at least this long counts as healthy: the next
# loss starts the backoff sequence over.
HEALTHY_CONNECTION = 2.0


# -- unary calls --------------------------------------------------------------

Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp", bound=Message)


@dataclass(frozen=True)
class UnaryCall(Generic[Req, Resp]):
    """One unary RPC and its REST equivalent."""

    rpc: str
    request: Req
    response: type[Resp]
    http_method: str
    path: str
    body: dict[str, Any] | None = None
    # The REST answer is text (not JSON), to be put in this field of the response.
    text_field: str | None = None
    # How long the server may take to answer at most, when that can be longer
    # than a client's timeout (the call then waits this long).
    slow: float | None = None

    @property
    def method(self) -> str:
        return f"/{SERVICE}/{self.rpc}"


def _prefix(enum: EnumDescriptor) -> str:
    """`RunOutcome` -> `RUN_OUTCOME_`."""
    return "".join("_" + c if c.isupper() and i else c.upper() for i, c in enumerate(enum.name)) + "_"


def enum_json_name(enum: EnumDescriptor, number: int) -> str:
    """The name vak's REST/SSE JSON gives an enum value (proto/vak/v1/http.proto,
    `(json)`): the value's name without its enum's prefix, lower-cased, "" for
    UNSPECIFIED, unless its `(json)` option says otherwise. These are the strings
    the fields carried before they were enums ("completed", "accept-edits")."""
    value = enum.values_by_number[number]
    options = value.GetOptions()
    ext: Any = http_pb2.json  # typed as a plain FieldDescriptor by the generated stub
    if options.HasExtension(ext):
        return str(options.Extensions[ext])
    rest = value.name.removeprefix(_prefix(enum))
    return "" if rest == "UNSPECIFIED" else rest.lower()


def json_name(message: Message, field: str) -> str:
    """The JSON name of the value an enum field of `message` holds:
    `json_name(admission, "state") == "started"`."""
    enum: Any = message.DESCRIPTOR.fields_by_name[field].enum_type
    if enum is None:
        raise ValueError(f"{type(message).__name__}.{field} is not an enum")
    return enum_json_name(enum, getattr(message, field))


def enum_from_json_name(enum: EnumDescriptor, name: str) -> int:
    """The number of the value `name` (a JSON name) names; ValueError if none."""
    for value in enum.values:
        if enum_json_name(enum, value.number) == name:
            return value.number
    raise ValueError(f"unknown {enum.name} {name!r}")


def _request_enum(enum: EnumDescriptor, name: str, field: str) -> int:
    """A request's enum field by its JSON name; an unknown name is refused as the
    server refuses it over REST (400 invalid_argument), before any call."""
    try:
        return enum_from_json_name(enum, name)
    except ValueError:
        names = [enum_json_name(enum, v.number) for v in enum.values]
        expected = ", ".join(n for n in names if n)
        raise VakError(400, "invalid_argument", f"unknown {field} {name!r}: expected one of {expected}") from None


def _map_enums(obj: Any, desc: Any, convert: Any) -> Any:
    """A JSON object of `desc` with `convert(enum, value)` applied to the value
    of every vak enum field, in nested messages, lists and maps too."""
    if not isinstance(obj, dict):
        return obj
    out = {}
    for key, value in obj.items():
        f = desc.fields_by_name.get(key) or desc.fields_by_camelcase_name.get(key)
        m = f.message_type if f is not None else None
        if m is not None and m.GetOptions().map_entry:
            # A map: its keys are strings; its values may be enums or messages.
            if isinstance(value, dict):
                entry = m.fields_by_name["value"]
                value = {k: _map_value(v, entry, convert) for k, v in value.items()}
        elif f is not None:
            value = [_map_value(v, f, convert) for v in value] if isinstance(value, list) else _map_value(value, f, convert)
        out[key] = value
    return out


def _map_value(value: Any, f: Any, convert: Any) -> Any:
    """One value of field `f` (one element of a repeated field) through `_map_enums`."""
    if f.enum_type is not None and f.enum_type.full_name.startswith("vak."):
        return convert(f.enum_type, value)
    if f.message_type is not None and not f.message_type.full_name.startswith("google."):
        return _map_enums(value, f.message_type, convert)
    return value


def _to_number(e: EnumDescriptor, v: Any) -> Any:
    if not isinstance(v, str):
        return v
    try:
        return enum_from_json_name(e, v)
    except ValueError:
        return v  # left to the parser, which ignores a value it does not know


def _to_name(e: EnumDescriptor, v: Any) -> Any:
    return enum_json_name(e, v) if isinstance(v, int) and v in e.values_by_number else v


def _enum_numbers(obj: Any, desc: Any) -> Any:
    """A JSON object of `desc` with every enum value's JSON name replaced by its
    number (which the protobuf JSON parser takes; it knows only proto names)."""
    return _map_enums(obj, desc, _to_number)


def to_json(message: Message) -> dict[str, Any]:
    """`message` as vak's REST JSON: proto field names, enums by their JSON
    names (what the server reads; it refuses the proto names)."""
    obj = json_format.MessageToDict(message, preserving_proto_field_name=True, use_integers_for_enums=True)
    return cast("dict[str, Any]", _map_enums(obj, message.DESCRIPTOR, _to_name))


def parse_json(data: str | bytes, message: Resp) -> Resp:
    """The proto3 JSON mapping of `message`, tolerant of fields this client
    does not know (a newer server); enums by vak's JSON names."""
    try:
        obj = json.loads(data)
        json_format.ParseDict(_enum_numbers(obj, message.DESCRIPTOR), message, ignore_unknown_fields=True)
    except (ValueError, json_format.ParseError) as err:
        raise ProtocolError(f"cannot read {type(message).__name__} from {str(data)[:200]!r}: {err}") from None
    return message


def rest_response(call: UnaryCall[Req, Resp], raw: bytes) -> Resp:
    msg = call.response()
    if call.text_field is not None:
        setattr(msg, call.text_field, raw.decode("utf-8", "replace"))
        return msg
    if not raw.strip():
        return msg
    return parse_json(raw, msg)


def rest_body(call: UnaryCall[Req, Resp]) -> bytes | None:
    return json.dumps(call.body).encode() if call.body is not None else None


def json_body(body: Any) -> bytes | None:
    return json.dumps(body).encode() if body is not None else None


def rest_headers(data: bytes | None) -> dict[str, str]:
    headers = {"Accept": "application/json"}
    if data is not None:
        headers["Content-Type"] = "application/json"
    return headers


def check_rest(response: httpx.Response) -> bytes:
    """The body of a (read) REST answer; a non-2xx answer raises its VakError."""
    if not 200 <= response.status_code < 300:
        raise rest_error(response.status_code, response.content)
    return response.content


def parse_rest_json(status: int, raw: bytes) -> Any:
    """A raw REST answer's JSON body (None when empty)."""
    try:
        return json.loads(raw) if raw.strip() else None
    except ValueError:
        text = raw.decode("utf-8", "replace")
        raise VakError(status, "", f"response is not JSON: {text[:200]!r}", text) from None


def _with_request_id(body: dict[str, Any], request_id: str | None) -> dict[str, Any]:
    if request_id is not None:
        body["request_id"] = request_id
    return body


def call_create_session() -> UnaryCall[agent_pb2.CreateSessionRequest, agent_pb2.CreateSessionResponse]:
    return UnaryCall(
        "CreateSession", agent_pb2.CreateSessionRequest(), agent_pb2.CreateSessionResponse, "POST", "/sessions"
    )


def call_list_sessions() -> UnaryCall[agent_pb2.ListSessionsRequest, agent_pb2.ListSessionsResponse]:
    return UnaryCall("ListSessions", agent_pb2.ListSessionsRequest(), agent_pb2.ListSessionsResponse, "GET", "/sessions")


def call_attach(session_id: str) -> UnaryCall[agent_pb2.AttachSessionRequest, agent_pb2.AttachSessionResponse]:
    return UnaryCall(
        "AttachSession",
        agent_pb2.AttachSessionRequest(session_id=session_id),
        agent_pb2.AttachSessionResponse,
        "POST",
        f"/sessions/{quote(session_id)}/attach",
    )


def call_run(
    session_id: str, prompt: str, request_id: str | None
) -> UnaryCall[agent_pb2.RunRequest, agent_pb2.Admission]:
    return UnaryCall(
        "Run",
        agent_pb2.RunRequest(session_id=session_id, prompt=prompt, request_id=request_id or ""),
        agent_pb2.Admission,
        "POST",
        f"/sessions/{quote(session_id)}/run",
        _with_request_id({"prompt": prompt}, request_id),
    )


def call_steer(
    session_id: str, text: str, request_id: str | None
) -> UnaryCall[agent_pb2.SteerRequest, agent_pb2.Admission]:
    return UnaryCall(
        "Steer",
        agent_pb2.SteerRequest(session_id=session_id, text=text, request_id=request_id or ""),
        agent_pb2.Admission,
        "POST",
        f"/sessions/{quote(session_id)}/steering",
        _with_request_id({"text": text}, request_id),
    )


def call_approve(
    session_id: str, request_id: str, approve: bool, reason: str, *, always: bool = False, mode: str | None = None
) -> UnaryCall[agent_pb2.ApproveRequest, agent_pb2.ApproveResponse]:
    req = agent_pb2.ApproveRequest(session_id=session_id, request_id=request_id, approve=approve, reason=reason)
    body: dict[str, Any] = {"approve": approve, "reason": reason}
    if always:
        req.always = True
        body["always"] = True
    if mode is not None:
        req.mode = cast("agent_pb2.PlanExitMode", _request_enum(agent_pb2.PlanExitMode.DESCRIPTOR, mode, "mode"))
        body["mode"] = mode
    return UnaryCall(
        "Approve",
        req,
        agent_pb2.ApproveResponse,
        "POST",
        f"/sessions/{quote(session_id)}/approvals/{quote(request_id)}",
        body,
    )


def call_set_mode(mode: str) -> UnaryCall[agent_pb2.SetModeRequest, agent_pb2.SetModeResponse]:
    return UnaryCall(
        "SetMode",
        agent_pb2.SetModeRequest(
            mode=cast("agent_pb2.PermissionMode", _request_enum(agent_pb2.PermissionMode.DESCRIPTOR, mode, "mode"))
        ),
        agent_pb2.SetModeResponse,
        "POST",
        "/config/mode",
        {"mode": mode},
    )


def call_get_mcp_config() -> UnaryCall[agent_pb2.GetMcpConfigRequest, agent_pb2.McpConfig]:
    return UnaryCall("GetMcpConfig", agent_pb2.GetMcpConfigRequest(), agent_pb2.McpConfig, "GET", "/config/mcp")


McpServers: TypeAlias = Mapping[str, agent_pb2.McpServer | Mapping[str, Any]]
"""The MCP server table `put_mcp_config` takes: by name, each an `McpServer` (as
`get_mcp_config` answers it) or its REST JSON (`{"command": ..., "args": [...]}`)."""


def _mcp_server(name: str, server: agent_pb2.McpServer | Mapping[str, Any]) -> agent_pb2.McpServer:
    if isinstance(server, agent_pb2.McpServer):
        return server
    out = agent_pb2.McpServer()
    try:
        # Strict, as the server's REST parser is: a misspelt field is refused, not dropped.
        json_format.ParseDict(_enum_numbers(dict(server), out.DESCRIPTOR), out)
    except (json_format.ParseError, TypeError, AttributeError) as err:
        raise VakError(400, "invalid_argument", f"servers.{name}: {err}") from None
    return out


def call_put_mcp_config(
    servers: McpServers,
) -> UnaryCall[agent_pb2.PutMcpConfigRequest, agent_pb2.McpConfig]:
    req = agent_pb2.PutMcpConfigRequest()
    for name, server in servers.items():
        req.servers[name].CopyFrom(_mcp_server(name, server))
    # The server answers once the servers it started are ready or failed, after 30 s at most.
    return UnaryCall("PutMcpConfig", req, agent_pb2.McpConfig, "PUT", "/config/mcp", to_json(req), slow=35.0)


def _workspace_query(workspace: str | None) -> str:
    """`?workspace=…` for the rules routes (absent: the server's own workspace)."""
    return "" if workspace is None else "?" + urllib.parse.urlencode({"workspace": workspace})


def call_list_rules(
    workspace: str | None = None,
) -> UnaryCall[agent_pb2.ListRulesRequest, agent_pb2.ListRulesResponse]:
    return UnaryCall(
        "ListRules",
        agent_pb2.ListRulesRequest(workspace=workspace),
        agent_pb2.ListRulesResponse,
        "GET",
        "/permissions/rules" + _workspace_query(workspace),
    )


def call_delete_rule(
    rule_id: str, workspace: str | None = None
) -> UnaryCall[agent_pb2.DeleteRuleRequest, agent_pb2.DeleteRuleResponse]:
    return UnaryCall(
        "DeleteRule",
        agent_pb2.DeleteRuleRequest(id=rule_id, workspace=workspace),
        agent_pb2.DeleteRuleResponse,
        "DELETE",
        f"/permissions/rules/{quote(rule_id)}" + _workspace_query(workspace),
    )


def call_cancel(session_id: str) -> UnaryCall[agent_pb2.CancelRequest, agent_pb2.CancelResponse]:
    return UnaryCall(
        "Cancel",
        agent_pb2.CancelRequest(session_id=session_id),
        agent_pb2.CancelResponse,
        "POST",
        f"/sessions/{quote(session_id)}/cancel",
    )


def call_transcript(session_id: str) -> UnaryCall[agent_pb2.GetTranscriptRequest, agent_pb2.Transcript]:
    return UnaryCall(
        "GetTranscript",
        agent_pb2.GetTranscriptRequest(session_id=session_id),
        agent_pb2.Transcript,
        "GET",
        f"/sessions/{quote(session_id)}/transcript",
    )


def call_transcript_markdown(
    session_id: str,
) -> UnaryCall[agent_pb2.GetTranscriptRequest, agent_pb2.TranscriptMarkdown]:
    return UnaryCall(
        "GetTranscriptMarkdown",
        agent_pb2.GetTranscriptRequest(session_id=session_id),
        agent_pb2.TranscriptMarkdown,
        "GET",
        f"/sessions/{quote(session_id)}/transcript.md",
        text_field="markdown",
    )


def call_presentation(session_id: str) -> UnaryCall[agent_pb2.GetPresentationRequest, agent_pb2.OutputTimeline]:
    return UnaryCall(
        "GetPresentation",
        agent_pb2.GetPresentationRequest(session_id=session_id),
        agent_pb2.OutputTimeline,
        "GET",
        f"/sessions/{quote(session_id)}/presentation",
    )


def call_follow(
    stream_id: str, session_id: str, after: int | None
) -> UnaryCall[agent_pb2.FollowRequest, agent_pb2.FollowResponse]:
    req = agent_pb2.FollowRequest(stream_id=stream_id, session_id=session_id)
    body: dict[str, Any] = {"session_id": session_id}
    if after is not None:
        req.after = after
        body["after"] = after
    return UnaryCall("Follow", req, agent_pb2.FollowResponse, "POST", f"/stream/{quote(stream_id)}/follow", body)


def call_unfollow(stream_id: str, session_id: str) -> UnaryCall[agent_pb2.UnfollowRequest, agent_pb2.FollowResponse]:
    return UnaryCall(
        "Unfollow",
        agent_pb2.UnfollowRequest(stream_id=stream_id, session_id=session_id),
        agent_pb2.FollowResponse,
        "POST",
        f"/stream/{quote(stream_id)}/unfollow",
        {"session_id": session_id},
    )


# -- server-sent events -------------------------------------------------------
# Frames are decoded by httpx-sse (httpx_sse.EventSource); these turn them into
# messages.


def sse_headers(last_event_id: str | None) -> dict[str, str]:
    # identity: an event must not wait in a decompressor's buffer.
    headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache", "Accept-Encoding": "identity"}
    if last_event_id:
        headers["Last-Event-ID"] = last_event_id
    return headers


def check_sse(response: httpx.Response, path: str) -> None:
    """Raises for an answer that is not an open event stream (its body, if
    any, must have been read)."""
    if response.status_code != 200:
        raise rest_error(response.status_code, response.content)
    ctype = response.headers.get("content-type", "")
    if not ctype.startswith("text/event-stream"):
        raise ProtocolError(f"GET {path}: expected text/event-stream, got {ctype!r}")


def socket_of(response: httpx.Response) -> socket.socket | None:
    """The socket under a streaming response (to shut it down from another
    thread or task, which ends a blocked read at once)."""
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    return sock if isinstance(sock, socket.socket) else None


def shutdown(sock: socket.socket | None) -> None:
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def events_path(session_id: str) -> str:
    return f"/sessions/{quote(session_id)}/events"


def stream_path(sessions: Iterable[str], host: bool, config: bool) -> str:
    query: list[tuple[str, str]] = [("session", s) for s in sessions]
    if host:
        query.append(("host", "1"))
    if config:
        query.append(("config", "1"))
    return "/stream" + (f"?{urllib.parse.urlencode(query)}" if query else "")


def event_from_sse(ev: ServerSentEvent) -> agent_pb2.Event | None:
    """A /events frame (None for one without data, which carries nothing)."""
    if not ev.data:
        return None
    return parse_json(ev.data, agent_pb2.Event())


# -- the multiplexed stream ---------------------------------------------------

StreamMessage: TypeAlias = (
    agent_pb2.StreamOpened
    | agent_pb2.Event
    | agent_pb2.PresentationEvent
    | agent_pb2.Coworking
    | agent_pb2.HostInfo
    | agent_pb2.ConfigInfo
)


class StreamItem(NamedTuple):
    """One frame of a multiplexed stream.

    `kind` names the frame (the `StreamMessage.frame` case and the SSE event
    name): "agent" (an `Event` of the session), "presentation" (a
    `PresentationEvent`), "resync" (an `Event` whose kind is `resync`: the
    follower has fetched that session's transcript, `transcripts[session_id]`,
    and its agent frames continue after the transcript's seq), "coworking" (`Coworking`), "session_closed"
    (an `Event`), "host" (`HostInfo`) or "config" (`ConfigInfo`). `session_id`
    is "" for host and config frames.
    """

    session_id: str
    kind: str
    message: StreamMessage


class MuxFrame(NamedTuple):
    """A frame as read from either transport, before the resume logic."""

    kind: str
    session_id: str
    message: StreamMessage
    id: str | None  # the cursor vector after this frame (agent and presentation frames)


_MUX_TYPES: dict[str, type[StreamMessage]] = {
    "stream_opened": agent_pb2.StreamOpened,
    "agent": agent_pb2.Event,
    "resync": agent_pb2.Event,
    "session_closed": agent_pb2.Event,
    "presentation": agent_pb2.PresentationEvent,
    "coworking": agent_pb2.Coworking,
    "host": agent_pb2.HostInfo,
    "config": agent_pb2.ConfigInfo,
}


# The /stream frames whose SSE id is theirs (a cursor vector). Other frames
# have none, and an SSE decoder reports the last id seen for them.
_MUX_WITH_ID = frozenset({"agent", "presentation"})


def mux_from_sse(ev: ServerSentEvent) -> MuxFrame | None:
    """A /stream SSE event as a frame; None for a kind this client does not
    know (or a frame without data)."""
    cls = _MUX_TYPES.get(ev.event)
    if cls is None or not ev.data:
        return None
    msg = parse_json(ev.data, cls())
    sid = msg.session_id if isinstance(msg, (agent_pb2.Event, agent_pb2.PresentationEvent, agent_pb2.Coworking)) else ""
    return MuxFrame(ev.event, sid, msg, (ev.id or None) if ev.event in _MUX_WITH_ID else None)


def mux_from_grpc(m: agent_pb2.StreamMessage) -> MuxFrame | None:
    kind = m.WhichOneof("frame")
    if kind is None:
        return None
    msg: StreamMessage = getattr(m, kind)
    return MuxFrame(kind, m.session_id, msg, m.id or None)


def parse_vector(raw: str) -> dict[str, int]:
    """A cursor vector "<session>:<seq>,..." as an ordered dict."""
    out: dict[str, int] = {}
    for entry in raw.split(","):
        entry = entry.strip()
        if not entry:
            continue
        sid, sep, seq = entry.rpartition(":")
        if not sep or not sid or not seq.isdigit():
            raise ValueError(f"malformed cursor vector entry {entry!r}: expected <session>:<seq>")
        out[sid] = int(seq)
    return out


def format_vector(vector: dict[str, int]) -> str:
    return ",".join(f"{sid}:{seq}" for sid, seq in vector.items())


# -- resume logic ---------------------------------------------------------------


@dataclass
class SessionCursor:
    """The resume state of `follow()`: the last seq handed to the caller.

    Stream-level frames (seq 0) never move it. `stream_opened` is consumed
    (its `latest_seq` is the start point of a live-only follow);
    `session_closed` is handed over. A session event at or below the cursor
    is dropped (counted in `duplicates`). A `resync` never reaches `accept`:
    the follower fetches the transcript and `resynced` sets the cursor to its
    seq (lower than before for a cursor that was ahead of the session).
    """

    session_id: str
    cursor: int | None
    opened: agent_pb2.StreamOpened | None = None
    finished: bool = False
    duplicates: int = 0
    transcript: agent_pb2.Transcript | None = None

    def on_opened(self, first: agent_pb2.Event) -> None:
        if first.WhichOneof("kind") != "stream_opened":
            raise ProtocolError(f"the stream did not start with stream_opened (seq {first.seq})")
        self.opened = first.stream_opened
        if self.cursor is None:
            self.cursor = first.stream_opened.latest_seq

    def resynced(self, transcript: agent_pb2.Transcript) -> None:
        self.transcript = transcript
        self.cursor = transcript.seq

    def accept(self, ev: agent_pb2.Event) -> agent_pb2.Event | None:
        kind = ev.WhichOneof("kind")
        if kind == "stream_opened":
            return None
        if kind == "session_closed":
            self.finished = True
            return ev
        if ev.seq == 0:
            return ev  # a stream-level frame of a newer server
        if self.cursor is not None and ev.seq <= self.cursor:
            self.duplicates += 1
            return None
        self.cursor = ev.seq
        return ev


@dataclass
class VectorCursor:
    """The resume state of `follow_many()`: the cursor vector of what was
    handed to the caller, the followed sessions, and the live stream's id.

    The vector is the client's own: each agent frame handed over sets its
    session's entry to its seq. The server's vectors (`stream_opened.cursor`,
    the `id` of agent and presentation frames) only add entries for sessions
    this follower has none for yet (a live start point, a session followed
    through the stream id by somebody else), so a server that resent old
    frames could not make the client skip anything: the resent frames are
    dropped (counted in `duplicates`). A resync of a session sets its entry
    to the seq of the transcript fetched for it (`resynced`); the stream is
    then opened again with that vector. `stream_opened` is consumed (it sets
    `stream_id`); frames of a session unfollowed through this follower are
    dropped."""

    sessions: list[str]
    vector: dict[str, int]
    stream_id: str = ""
    opened: agent_pb2.StreamOpened | None = None
    duplicates: int = 0
    saw_closed: bool = False
    unfollowed: set[str] = field(default_factory=set)
    transcripts: dict[str, agent_pb2.Transcript] = field(default_factory=dict)

    @classmethod
    def new(cls, sessions: Iterable[str], cursor: str | None) -> VectorCursor:
        vector = parse_vector(cursor or "")
        order: list[str] = []
        for s in [*sessions, *vector]:
            if s not in order:
                order.append(s)
        return cls(order, vector)

    @property
    def cursor(self) -> str:
        return format_vector(self.vector)

    def request(self) -> tuple[list[str], str]:
        """What to (re)open the stream with: the sessions and the cursor vector."""
        return list(self.sessions), self.cursor

    def on_opened(self, first: MuxFrame) -> None:
        if first.kind != "stream_opened" or not isinstance(first.message, agent_pb2.StreamOpened):
            raise ProtocolError(f"the stream did not start with stream_opened (got {first.kind})")
        self.opened = first.message
        self.stream_id = first.message.stream_id
        self._adopt(first.message.cursor)
        self.saw_closed = False

    def followed(self, session_id: str, after: int | None) -> None:
        self.unfollowed.discard(session_id)
        if session_id not in self.sessions:
            self.sessions.append(session_id)
        if after is not None:
            # An explicit start point, also for a session already followed
            # (the server then resubscribes it from there).
            self.vector[session_id] = after

    def dropped(self, session_id: str) -> None:
        self.unfollowed.add(session_id)
        if session_id in self.sessions:
            self.sessions.remove(session_id)
        self.vector.pop(session_id, None)

    def resynced(self, session_id: str, transcript: agent_pb2.Transcript) -> None:
        self.transcripts[session_id] = transcript
        self.vector[session_id] = transcript.seq
        if session_id not in self.sessions:
            self.sessions.append(session_id)

    def accept(self, f: MuxFrame) -> StreamItem | None:
        if f.kind == "stream_opened":
            return None
        if f.session_id and f.session_id in self.unfollowed:
            return None
        if f.kind == "agent" and isinstance(f.message, agent_pb2.Event):
            seq = f.message.seq
            last = self.vector.get(f.session_id)
            if last is not None and seq <= last:
                self.duplicates += 1
                return None
            if seq > 0:
                self.vector[f.session_id] = seq
        elif f.kind == "session_closed":
            self.saw_closed = True
        self._adopt(f.id)
        return StreamItem(f.session_id, f.kind, f.message)

    def _adopt(self, raw: str | None) -> None:
        """Takes the server's entries for sessions this follower has none for."""
        if not raw:
            return
        try:
            vector = parse_vector(raw)
        except ValueError as err:
            raise ProtocolError(f"the server sent a malformed cursor vector: {err}") from None
        for sid, seq in vector.items():
            if sid not in self.vector and sid not in self.unfollowed:
                self.vector[sid] = seq
                if sid not in self.sessions:
                    self.sessions.append(sid)
