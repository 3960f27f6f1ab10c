"""The pure parts, without a server: SSE decoding, cursor vectors, the
resume state machines, backoff and error mapping."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import httpx
import pytest
from httpx_sse import EventSource, ServerSentEvent

from vak_client import Backoff, ProtocolError, VakError, agent_pb2, json_name
from vak_client._common import (
    call_approve,
    call_put_mcp_config,
    call_set_mode,
    parse_json,
    MuxFrame,
    SessionCursor,
    VectorCursor,
    event_from_sse,
    format_vector,
    grpc_error,
    mux_from_sse,
    parse_vector,
    rest_error,
)


def sse_events(stream: bytes, chunk: int) -> list[ServerSentEvent]:
    """Decodes `stream` as the client does (httpx-sse on an httpx response),
    delivered in chunks of `chunk` bytes."""
    parts = [stream[i : i + chunk] for i in range(0, len(stream), chunk)]
    response = httpx.Response(200, headers={"content-type": "text/event-stream"}, content=iter(parts))
    return list(EventSource(response).iter_sse())


@pytest.mark.parametrize("chunk", [1, 7, 1 << 20])
def test_sse_decoding(chunk: int) -> None:
    delta = '{"seq":5,"session_id":"s","text_delta":{"text":"a\u2028b\u0085c é"}}'
    stream = (
        b": keepalive\n\n"
        b"event: agent\r\ndata: {\"a\":\r\ndata:1}\r\nid: s:1\r\n\r\n"
        b"id: 7\nevent: text_delta\ndata:{}\n\n"
        b"data: x\nid: bad\0id\n\n"
        + b"event: text_delta\rdata: " + delta.encode() + b"\rid: 5\r\r"
    )
    got = [(e.event, e.data, e.id) for e in sse_events(stream, chunk)]
    assert got == [
        ("agent", '{"a":\n1}', "s:1"),
        ("text_delta", "{}", "7"),
        ("message", "x", "7"),  # an id with NUL is ignored; the last id stays
        ("text_delta", delta, "5"),  # only CR, LF and CRLF end a line
    ]
    ev = event_from_sse(sse_events(stream, chunk)[-1])
    assert ev is not None and ev.seq == 5 and ev.text_delta.text == "a\u2028b\u0085c é"


def test_mux_from_sse_types_and_session() -> None:
    f = mux_from_sse(
        ServerSentEvent("agent", '{"seq":3,"session_id":"a","text_delta":{"text":"hi"},"new_field":1}', "a:3")
    )
    assert f is not None and f.kind == "agent" and f.session_id == "a" and f.id == "a:3"
    assert isinstance(f.message, agent_pb2.Event) and f.message.text_delta.text == "hi"
    # Only agent and presentation frames carry a cursor vector of their own.
    host = mux_from_sse(ServerSentEvent("host", '{"version":"1","workspace":"/w"}', "a:3"))
    assert host is not None and host.session_id == "" and host.id is None
    assert isinstance(host.message, agent_pb2.HostInfo)
    assert mux_from_sse(ServerSentEvent("from_the_future", "{}", None)) is None
    assert mux_from_sse(ServerSentEvent("agent", "", None)) is None


def test_vectors() -> None:
    assert parse_vector("a:1, b-2:0 ,c_3:18446744073709551615") == {"a": 1, "b-2": 0, "c_3": 2**64 - 1}
    assert parse_vector("") == {}
    assert format_vector({"a": 1, "b": 2}) == "a:1,b:2"
    for bad in ["a", "a:", ":1", "a:x"]:
        with pytest.raises(ValueError):
            parse_vector(bad)


def ev(seq: int, kind: str = "text_delta") -> agent_pb2.Event:
    e = agent_pb2.Event(seq=seq, session_id="s")
    if kind == "text_delta":
        e.text_delta.text = f"t{seq}"
    elif kind == "resync":
        e.resync.reason = agent_pb2.RESYNC_REASON_CURSOR_AHEAD
    elif kind == "session_closed":
        e.session_closed.reason = "bye"
    return e


def opened(latest: int) -> agent_pb2.Event:
    e = agent_pb2.Event(session_id="s")
    e.stream_opened.latest_seq = latest
    return e


def test_session_cursor() -> None:
    live = SessionCursor("s", None)
    live.on_opened(opened(5))
    assert live.cursor == 5  # a live follow resumes from the latest seq at open
    c = SessionCursor("s", 2)
    c.on_opened(opened(9))
    assert c.cursor == 2
    assert [c.accept(ev(3)), c.accept(ev(4))] == [ev(3), ev(4)]
    assert c.accept(ev(4)) is None and c.duplicates == 1  # a resend is dropped
    c.resynced(agent_pb2.Transcript(session_id="s", seq=2))  # a cursor ahead: the transcript is behind it
    assert c.cursor == 2 and c.transcript is not None and c.transcript.seq == 2
    assert c.accept(ev(3)) == ev(3) and c.cursor == 3  # the new stream goes on after the transcript
    assert c.accept(ev(0, "session_closed")) is not None and c.finished
    with pytest.raises(ProtocolError):
        SessionCursor("s", None).on_opened(ev(1))


def mux(kind: str, sid: str, seq: int, id_: str | None) -> MuxFrame:
    e = agent_pb2.Event(seq=seq, session_id=sid)
    e.status.busy = True
    return MuxFrame(kind, sid, e, id_)


def test_vector_cursor() -> None:
    v = VectorCursor.new(["a", "b"], "a:3,c:1")
    assert v.sessions == ["a", "b", "c"]
    opened_frame = MuxFrame("stream_opened", "", agent_pb2.StreamOpened(stream_id="st_1", cursor="a:3,b:7,c:1"), None)
    v.on_opened(opened_frame)
    # The server's vector only fills in what the client had no entry for.
    assert v.stream_id == "st_1" and v.cursor == "a:3,c:1,b:7"
    assert v.accept(mux("agent", "a", 4, "a:4,b:7,c:1")) is not None
    assert v.accept(mux("agent", "a", 4, "a:4,b:7,c:1")) is None and v.duplicates == 1
    # A server vector ahead of what was handed over does not skip anything.
    assert v.accept(mux("presentation", "b", 0, "a:9,b:9,c:9")) is not None
    assert v.accept(mux("agent", "a", 5, None)) is not None
    assert parse_vector(v.cursor) == {"a": 5, "b": 7, "c": 1}
    v.dropped("c")
    assert v.request() == (["a", "b"], "a:5,b:7")
    assert v.accept(mux("agent", "c", 2, None)) is None
    v.followed("d", 0)
    assert v.request() == (["a", "b", "d"], "a:5,b:7,d:0")
    # A resync sets that session's entry to the transcript's seq, lower or higher.
    v.resynced("a", agent_pb2.Transcript(session_id="a", seq=2))
    v.resynced("b", agent_pb2.Transcript(session_id="b", seq=12))
    assert v.request() == (["a", "b", "d"], "a:2,b:12,d:0")
    assert v.transcripts["a"].seq == 2


def test_backoff_is_bounded() -> None:
    b = Backoff(initial=0.1, maximum=1.0)
    assert b.delay(0) == 0
    for n in range(1, 30):
        assert 0 < b.delay(n) <= 1.0


def test_error_mapping() -> None:
    e = grpc_error(grpc.StatusCode.FAILED_PRECONDITION, "settled")
    assert (e.status, e.code, e.message, e.retryable) == (409, "conflict", "settled", False)
    assert grpc_error(grpc.StatusCode.UNAVAILABLE, "x").retryable
    assert grpc_error(grpc.StatusCode.CANCELLED, "x").status == 500
    r = rest_error(404, b'{"error":{"code":"not_found","message":"no session x"}}')
    assert (r.status, r.code, r.message) == (404, "not_found", "no session x")
    assert rest_error(502, b"<html>").code == ""
    # An answer the server sent names its status; a gRPC one its gRPC code.
    assert str(r) == "HTTP 404: not_found: no session x" and r.reached
    assert str(e) == "gRPC FAILED_PRECONDITION: settled"


def _listener(behaviour: str) -> tuple[int, Callable[[], None]]:
    """A TCP listener on 127.0.0.1 that accepts one connection and either
    closes it at once ("close") or holds it without answering ("silent")."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    done = threading.Event()

    def serve() -> None:
        try:
            conn, _ = srv.accept()
        except OSError:
            return
        with conn:
            if behaviour == "silent":
                conn.recv(65536)
                done.wait(10)

    t = threading.Thread(target=serve, daemon=True)
    t.start()

    def stop() -> None:
        done.set()
        srv.close()
        t.join(10)

    return srv.getsockname()[1], stop


@pytest.mark.parametrize(
    "behaviour, said",
    [
        ("close", "the connection to http://127.0.0.1:{port} broke: "),
        ("silent", "http://127.0.0.1:{port} sent nothing within the read timeout (GET /sessions)"),
    ],
)
def test_transport_failures_say_what_happened(behaviour: str, said: str) -> None:
    from vak_client import Client

    port, stop = _listener(behaviour)
    try:
        with Client(f"http://127.0.0.1:{port}", "t", unary="rest", timeout=0.5) as c:
            with pytest.raises(VakError) as err:
                c.list_sessions()
    finally:
        stop()
    text = str(err.value)
    assert text.startswith(said.format(port=port)) and text.endswith("(GET /sessions)"), text
    assert "HTTP" not in text and not err.value.reached
    assert (err.value.status, err.value.code, err.value.retryable) == (503, "unavailable", True)


def test_enums_travel_by_their_json_names() -> None:
    e = parse_json('{"seq": 3, "run_finished": {"outcome": "max_turns", "message": "m"}}', agent_pb2.Event())
    assert e.run_finished.outcome == agent_pb2.RUN_OUTCOME_MAX_TURNS
    assert json_name(e.run_finished, "outcome") == "max_turns"
    h = parse_json('{"auth": "remote", "storage": "jetstream", "sandbox": {"mode": "read-only"}}', agent_pb2.HostInfo())
    assert (h.auth, h.storage, h.sandbox.mode) == (
        agent_pb2.AUTH_MODE_REMOTE,
        agent_pb2.STORAGE_KIND_JETSTREAM,
        agent_pb2.SANDBOX_MODE_READ_ONLY,
    )
    side = parse_json('{"side": {"finished": {"outcome": "SIDE_OUTCOME_FAILED"}}}', agent_pb2.Event())
    assert side.side.finished.outcome == agent_pb2.SIDE_OUTCOME_FAILED
    p = parse_json('{"key_sources": ["env", "store"]}', agent_pb2.ProviderInfo())
    assert list(p.key_sources) == [agent_pb2.KEY_SOURCE_ENV, agent_pb2.KEY_SOURCE_STORE]
    d = parse_json('{"reason": ""}', agent_pb2.WorkspaceDiff())
    assert d.reason == agent_pb2.DIFF_REASON_UNSPECIFIED and json_name(d, "reason") == ""
    # Requests: a JSON name becomes its number for gRPC and stays as it is for REST.
    m = call_set_mode("accept-edits")
    assert (m.request.mode, m.body) == (agent_pb2.PERMISSION_MODE_ACCEPT_EDITS, {"mode": "accept-edits"})
    assert call_approve("s", "r", True, "", mode="default").request.mode == agent_pb2.PLAN_EXIT_MODE_DEFAULT
    with pytest.raises(VakError) as err:
        call_set_mode("yolo")
    assert (err.value.status, err.value.code) == (400, "invalid_argument")



def test_enums_in_map_values_travel_by_their_json_names() -> None:
    # McpConfig.servers is a map of messages: an enum inside its values too.
    raw = '{"servers": {"a": {"command": "x", "state": "ready", "timeout_ms": 5}, "b": {"state": "failed"}}}'
    c = parse_json(raw, agent_pb2.McpConfig())
    assert (c.servers["a"].state, c.servers["b"].state) == (agent_pb2.MCP_SERVER_STATE_READY, agent_pb2.MCP_SERVER_STATE_FAILED)
    assert json_name(c.servers["a"], "state") == "ready" and c.servers["a"].timeout_ms == 5
    # A server as GET answered it goes back with its enum by its JSON name (the
    # server's REST parser refuses the proto names); the same over gRPC.
    put = call_put_mcp_config({"a": c.servers["a"], "d": {"url": "http://h/mcp", "enabled": False, "state": "disabled"}})
    assert put.body == {
        "servers": {
            "a": {"command": "x", "state": "ready", "timeout_ms": "5"},
            "d": {"url": "http://h/mcp", "enabled": False, "state": "disabled"},
        }
    }
    assert put.request.servers["d"].state == agent_pb2.MCP_SERVER_STATE_DISABLED and put.request.servers["a"] == c.servers["a"]
    for bad, field in (({"comand": "x"}, "comand"), ({"state": "sleepy"}, "state"), ({"args": "x"}, "args")):
        with pytest.raises(VakError) as err:
            call_put_mcp_config({"s": bad})
        assert (err.value.status, err.value.code) == (400, "invalid_argument")
        assert err.value.message.startswith("servers.s: ") and field in err.value.message, err.value.message
