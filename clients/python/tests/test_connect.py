"""The Connect protocol (connectrpc.com) on the server's one port, called by
the Connect project's own Python client: PyPI `connectrpc` with the stubs its
protoc plugin (`protoc-gen-connectrpc`, option `protobuf=google`) writes from
proto/ when the session starts, beside grpcio-tools' message modules, into a
temporary directory (nothing generated is committed).

Each test runs the generated async or sync client with the binary codec
(application/proto, application/connect+proto) and the JSON codec
(application/json, application/connect+json; strict: an unknown field fails
the decode), over HTTP/1.1 and over HTTP/2 with prior knowledge. Unary calls
go by POST with the client's default gzip request compression and without
it, and by GET for side-effect-free RPCs; Subscribe is followed to
run_finished; errors arrive as Connect errors (not_found, unauthenticated,
out_of_range with vak's error kind as a google.rpc.ErrorInfo detail) with the
HTTP status the Connect spec gives."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pyqwest
import pytest
from connectrpc.client import ResponseMetadata
from connectrpc.code import Code
from connectrpc.compat import google_protobuf_binary_codec, google_protobuf_json_codec
from connectrpc.compression.gzip import GzipCompression
from connectrpc.errors import ConnectError
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from helpers import (
    REPO,
    STEP,
    Proxy,
    Server,
    assert_gap_free,
    burst_text,
    finished,
    kind,
    run_async,
    take_until_async,
    texts,
)

PROMPT = "hello world\nbye"
REPLY = "echo: hello world\necho: bye"
TIMEOUT_MS = int(STEP * 1000)  # each call's deadline (the Connect-Timeout-Ms header)
MIB = 1 << 20
MAX_FILE_BYTES = 2 * MIB  # the files API's cap (crates/vak-core/src/host/files.rs)


@dataclass
class Stubs:
    pb: ModuleType  # vak.v1.agent_pb2
    connect: ModuleType  # vak.v1.agent_connect


@pytest.fixture(scope="session")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stubs]:
    """Generates vak/v1/{agent,http}_pb2.py (grpcio-tools) and agent_connect.py
    (protoc-gen-connectrpc) from proto/ and imports them as vak.v1.*."""
    out = tmp_path_factory.mktemp("connect-stubs")
    bindir = str(Path(sys.executable).parent)
    plugin = shutil.which("protoc-gen-connectrpc", path=bindir)
    assert plugin, f"protoc-gen-connectrpc is not in {bindir} (the test extra installs it)"
    protoc = subprocess.run(
        [
            sys.executable, "-m", "grpc_tools.protoc",
            f"-I{REPO / 'proto'}",
            f"--plugin=protoc-gen-connectrpc={plugin}",
            f"--python_out={out}",
            f"--connectrpc_out={out}",
            "--connectrpc_opt=protobuf=google",
            "vak/v1/agent.proto", "vak/v1/http.proto",
        ],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=STEP,
    )  # fmt: skip
    assert protoc.returncode == 0, f"protoc failed ({protoc.returncode}): {protoc.stderr}"
    assert (out / "vak" / "v1" / "agent_connect.py").is_file(), sorted(p.name for p in out.rglob("*"))
    sys.path.insert(0, str(out))
    try:
        yield Stubs(importlib.import_module("vak.v1.agent_pb2"), importlib.import_module("vak.v1.agent_connect"))
    finally:
        sys.path.remove(str(out))


@pytest.fixture(params=["proto", "json"])
def codec(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=["http1", "h2c"])
def http(request: pytest.FixtureRequest) -> str:
    """HTTP/1.1, or HTTP/2 with prior knowledge (cleartext, as gRPC uses)."""
    return str(request.param)


@dataclass
class Clients:
    """Makes the generated clients: the codec, the HTTP version, gzip."""

    stubs: Stubs
    url: str
    codec: str
    http: str

    def _options(self, gzip: bool) -> dict[str, Any]:
        return {
            "codec": google_protobuf_json_codec(ignore_unknown_fields=False)
            if self.codec == "json"
            else google_protobuf_binary_codec(),
            # The generated client's default is gzip; None sends bodies as they are.
            "send_compression": GzipCompression() if gzip else None,
            "timeout_ms": TIMEOUT_MS,
        }

    def _version(self) -> pyqwest.HTTPVersion:
        return pyqwest.HTTPVersion.HTTP2 if self.http == "h2c" else pyqwest.HTTPVersion.HTTP1

    @contextlib.asynccontextmanager
    async def async_client(self, *, gzip: bool = True) -> AsyncIterator[Any]:
        async with pyqwest.HTTPTransport(http_version=self._version()) as transport:
            client = self.stubs.connect.AgentServiceClient(
                self.url, http_client=pyqwest.Client(transport), **self._options(gzip)
            )
            async with client:
                yield client

    @contextlib.contextmanager
    def sync_client(self, *, gzip: bool = True) -> Iterator[Any]:
        with pyqwest.SyncHTTPTransport(http_version=self._version()) as transport:
            client = self.stubs.connect.AgentServiceClientSync(
                self.url, http_client=pyqwest.SyncClient(transport), **self._options(gzip)
            )
            with client:
                yield client


@pytest.fixture
def clients(server: Server, stubs: Stubs, codec: str, http: str) -> Clients:
    return Clients(stubs, server.url, codec, http)


def auth(server: Server, token: str | None = None) -> dict[str, str]:
    return {"authorization": f"Bearer {token or server.token}"}


def content_type(codec: str) -> str:
    return f"application/{codec}"


def test_connect_unary_async(server: Server, stubs: Stubs, clients: Clients, proxy: Proxy) -> None:
    """Through a TCP proxy that records what the client sent: HTTP/2 with prior
    knowledge (its preface) for h2c, HTTP/1.1 otherwise."""
    pb = stubs.pb
    clients = dataclasses.replace(clients, url=proxy.url)

    async def main() -> None:
        for gzip in (True, False):
            async with clients.async_client(gzip=gzip) as c:
                with ResponseMetadata() as meta:
                    created = await c.create_session(pb.CreateSessionRequest(), headers=auth(server))
                assert meta.http_status == 200
                assert meta.headers.get("content-type", "").startswith(content_type(clients.codec)), meta.headers
                sid = created.session_id
                assert len(sid) == 32, created
                assert Path(created.workspace).resolve() == server.workspace.resolve()

                # POST, then GET (GetTranscript and ListSessions are NO_SIDE_EFFECTS).
                for use_get in (False, True):
                    got = await c.get_transcript(
                        pb.GetTranscriptRequest(session_id=sid), headers=auth(server), use_get=use_get
                    )
                    assert got.session_id == sid and not got.messages and got.seq == 0, got
                    listed = await c.list_sessions(pb.ListSessionsRequest(), headers=auth(server), use_get=use_get)
                    assert sid in {s.session_id for s in listed.sessions}

                # A 1 MiB answer (the server gzips it: the client accepts gzip).
                name = f"connect-{secrets.token_hex(4)}.txt"
                (server.workspace / name).write_text("x" * MIB)
                read = await c.read_file(pb.ReadFileRequest(path=name), headers=auth(server), use_get=gzip)
                assert (read.path, read.content) == (name, "x" * MIB)

    run_async(main)
    first_lines = [r.split(b"\r\n", 1)[0] for r in proxy.requests]
    assert first_lines, "no connection"
    for line in first_lines:
        if clients.http == "h2c":
            assert line == b"PRI * HTTP/2.0", first_lines
        else:
            assert re.fullmatch(rb"(POST|GET) /vak\.v1\.AgentService/\S+ HTTP/1\.1", line), first_lines


def test_connect_unary_sync(server: Server, stubs: Stubs, clients: Clients) -> None:
    pb = stubs.pb
    for gzip in (True, False):
        with clients.sync_client(gzip=gzip) as c:
            with ResponseMetadata() as meta:
                created = c.create_session(pb.CreateSessionRequest(), headers=auth(server))
            assert meta.http_status == 200
            assert meta.headers.get("content-type", "").startswith(content_type(clients.codec)), meta.headers
            sid = created.session_id
            for use_get in (False, True):
                got = c.get_transcript(pb.GetTranscriptRequest(session_id=sid), headers=auth(server), use_get=use_get)
                assert got.session_id == sid and not got.messages, got


def test_connect_subscribe_async(server: Server, stubs: Stubs, clients: Clients) -> None:
    """Subscribe live, run a prompt over Connect, follow its text deltas to
    run_finished; then a 300-delta burst and four 1 MiB deltas on the same
    stream."""
    pb = stubs.pb

    async def main() -> None:
        async with clients.async_client() as c:
            sid = (await c.create_session(pb.CreateSessionRequest(), headers=auth(server))).session_id
            request = pb.SubscribeRequest(session_id=sid, after=0)
            events = c.subscribe(request, headers=auth(server), timeout_ms=2 * TIMEOUT_MS)
            async with contextlib.aclosing(events):  # type: ignore[type-var]
                opened = await anext(events)
                assert kind(opened) == "stream_opened" and opened.seq == 0, opened
                admission = await c.run(pb.RunRequest(session_id=sid, prompt=PROMPT), headers=auth(server))
                assert admission.state == pb.ADMISSION_STATE_STARTED, admission
                got = await take_until_async(events, finished)
                assert texts(got) == REPLY
                assert_gap_free(got, first=admission.after_seq + 1)
                assert got[-1].run_finished.outcome == pb.RUN_OUTCOME_COMPLETED, got[-1]

                await c.run(pb.RunRequest(session_id=sid, prompt="/burst 300"), headers=auth(server))
                more = await take_until_async(events, finished)
                assert texts(more) == burst_text(300)
                assert_gap_free(more, first=got[-1].seq + 1)

                # Deltas of 1 MiB each: envelopes far larger than one read.
                await c.run(pb.RunRequest(session_id=sid, prompt=f"/burst 4 {MIB}"), headers=auth(server))
                big = await take_until_async(events, finished)
                assert texts(big) == "".join(f"t{i}".ljust(MIB - 1, "_") + " " for i in range(4))
                assert_gap_free(big, first=more[-1].seq + 1)

    run_async(main)


def test_connect_subscribe_sync(server: Server, stubs: Stubs, clients: Clients) -> None:
    """A run already finished, then Subscribe from after=0: the replay ends at
    its run_finished."""
    pb = stubs.pb
    with clients.sync_client() as c:
        sid = c.create_session(pb.CreateSessionRequest(), headers=auth(server)).session_id
        admission = c.run(pb.RunRequest(session_id=sid, prompt=PROMPT, wait=True), headers=auth(server))
        assert admission.result.outcome == pb.RUN_OUTCOME_COMPLETED, admission
        events = c.subscribe(pb.SubscribeRequest(session_id=sid, after=0), headers=auth(server))
        with contextlib.closing(events):  # type: ignore[type-var]
            got = []
            for ev in events:  # the call's Connect-Timeout-Ms bounds it
                got.append(ev)
                if finished(ev):
                    break
        assert got and finished(got[-1]), got[-3:]
        assert kind(got[0]) == "stream_opened"
        assert texts(got) == REPLY
        assert_gap_free(got, first=1)


def error_info_class() -> Any:
    """google.rpc.ErrorInfo (reason, domain, metadata), the detail vak's error
    kind travels in, built in a pool of its own (the googleapis protos are
    not a dependency)."""
    file = descriptor_pb2.FileDescriptorProto(
        name="test_connect/error_info.proto", package="google.rpc", syntax="proto3"
    )
    info = file.message_type.add(name="ErrorInfo")
    entry = info.nested_type.add(name="MetadataEntry", options=descriptor_pb2.MessageOptions(map_entry=True))
    string, optional, repeated = (
        descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
        descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
        descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
    )
    for number, name in ((1, "key"), (2, "value")):
        entry.field.add(name=name, number=number, type=string, label=optional)
    info.field.add(name="reason", number=1, type=string, label=optional)
    info.field.add(name="domain", number=2, type=string, label=optional)
    info.field.add(
        name="metadata",
        number=3,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
        label=repeated,
        type_name=".google.rpc.ErrorInfo.MetadataEntry",
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("google.rpc.ErrorInfo"))


async def connect_error_async(call: Any) -> tuple[ConnectError, ResponseMetadata]:
    with ResponseMetadata() as meta:
        with pytest.raises(ConnectError) as err:
            await call
    return err.value, meta


def test_connect_errors_async(server: Server, stubs: Stubs, clients: Clients) -> None:
    """not_found (HTTP 404) for an unknown session, unauthenticated (HTTP 401)
    for a wrong or missing token, on unary calls and on Subscribe; the right
    token on the same client succeeds. Unary errors are JSON whatever the codec;
    an error with a kind carries it as gRPC does."""
    pb = stubs.pb

    async def main() -> None:
        async with clients.async_client() as c:
            sid = (await c.create_session(pb.CreateSessionRequest(), headers=auth(server))).session_id
            assert sid

            for use_get in (False, True):
                missing = pb.GetTranscriptRequest(session_id="nosuch")
                err, meta = await connect_error_async(c.get_transcript(missing, headers=auth(server), use_get=use_get))
                assert err.code == Code.NOT_FOUND, (err.code, err.message)
                assert meta.http_status == 404
                assert meta.headers.get("content-type", "").startswith("application/json"), meta.headers
            unknown_run = pb.RunRequest(session_id="nosuch", prompt="x")
            err, _ = await connect_error_async(c.run(unknown_run, headers=auth(server)))
            assert err.code == Code.NOT_FOUND, (err.code, err.message)
            err, _ = await connect_error_async(
                anext(c.subscribe(pb.SubscribeRequest(session_id="nosuch"), headers=auth(server)))
            )
            assert err.code == Code.NOT_FOUND, (err.code, err.message)

            # vak's error kind: the vak-error-kind header (as gRPC's metadata)
            # and a google.rpc.ErrorInfo detail.
            (server.workspace / "connect-huge.txt").write_bytes(b"a" * (MAX_FILE_BYTES + 1))
            for use_get in (False, True):
                huge = pb.ReadFileRequest(path="connect-huge.txt")
                err, meta = await connect_error_async(c.read_file(huge, headers=auth(server), use_get=use_get))
                assert err.code == Code.OUT_OF_RANGE, (err.code, err.message)
                assert meta.http_status == 400
                assert meta.headers.get("vak-error-kind") == "payload_too_large", meta.headers
                assert [d.type_name for d in err.details] == ["google.rpc.ErrorInfo"], err.details
                info = error_info_class().FromString(err.details[0].message_bytes)
                assert (info.reason, info.domain, dict(info.metadata)) == (
                    "payload_too_large",
                    "vak",
                    {"kind": "payload_too_large"},
                ), info

            for headers in (auth(server, "wrong-token"), {}):
                err, meta = await connect_error_async(c.create_session(pb.CreateSessionRequest(), headers=headers))
                assert err.code == Code.UNAUTHENTICATED, (err.code, err.message)
                assert meta.http_status == 401
                err, _ = await connect_error_async(
                    anext(c.subscribe(pb.SubscribeRequest(session_id=sid), headers=headers))
                )
                assert err.code == Code.UNAUTHENTICATED, (err.code, err.message)

    run_async(main)


def test_connect_errors_sync(server: Server, stubs: Stubs, clients: Clients) -> None:
    pb = stubs.pb
    with clients.sync_client() as c:
        sid = c.create_session(pb.CreateSessionRequest(), headers=auth(server)).session_id
        with pytest.raises(ConnectError) as err:
            c.get_transcript(pb.GetTranscriptRequest(session_id="nosuch"), headers=auth(server))
        assert err.value.code == Code.NOT_FOUND, (err.value.code, err.value.message)
        with pytest.raises(ConnectError) as err:
            next(iter(c.subscribe(pb.SubscribeRequest(session_id="nosuch"), headers=auth(server))))
        assert err.value.code == Code.NOT_FOUND, (err.value.code, err.value.message)
        with pytest.raises(ConnectError) as err:
            c.get_transcript(pb.GetTranscriptRequest(session_id=sid), headers=auth(server, "wrong-token"))
        assert err.value.code == Code.UNAUTHENTICATED, (err.value.code, err.value.message)
