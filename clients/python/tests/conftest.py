"""Fixtures: live `vak serve` processes (started once per test session and
stopped with SIGTERM, which must exit 0), clients, and TCP proxies."""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator

import pytest
from helpers import Proxy, Server, vak_binary

from vak_client import Client


_SERVERS: list[Server] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test's report ends with the last lines of every live server."""
    report = yield
    if report.failed:
        for server in _SERVERS:
            if server.proc.poll() is None:
                report.sections.append((f"vak serve {server.url} (last lines)", server.output()))
    return report


def _start(tmp_path_factory: pytest.TempPathFactory, name: str, *extra: str) -> Iterator[Server]:
    binary = vak_binary()
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        pytest.fail(f"no executable vak binary at {binary} (run `cargo build`, or set VAK_BIN)")
    server = Server(tmp_path_factory.mktemp(name), *extra)
    _SERVERS.append(server)
    try:
        yield server
    finally:
        _SERVERS.remove(server)
        if server.proc.poll() is None:
            rc = server.terminate()
            assert rc == 0, f"vak serve exited with {rc} after SIGTERM:\n{server.output()}"


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The shared server (default ring, permission mode default)."""
    yield from _start(tmp_path_factory, "vak")


@pytest.fixture(scope="session")
def ring_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server that keeps only 8 frames per session for replay."""
    yield from _start(tmp_path_factory, "vak-ring8", "--ring", "8")


@pytest.fixture(params=["grpc", "rest"])
def unary(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=["sse", "grpc"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def client(server: Server, unary: str) -> Iterator[Client]:
    """A client of the shared server, once per unary transport."""
    with server.client(unary=unary) as c:
        yield c


@pytest.fixture
def direct(server: Server) -> Iterator[Client]:
    """A gRPC client of the shared server (for control calls)."""
    with server.client() as c:
        yield c


@pytest.fixture
def proxy(server: Server) -> Iterator[Proxy]:
    p = Proxy(server.port)
    yield p
    p.close()


@pytest.fixture
def ring_proxy(ring_server: Server) -> Iterator[Proxy]:
    p = Proxy(ring_server.port)
    yield p
    p.close()
