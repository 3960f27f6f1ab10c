"""The MCP calls, over gRPC and over REST (the `unary` fixture), against a
server of their own running the repository's MCP test server
(tests/mcp/server.py, on the official Python SDK: VAK_MCP_PYTHON)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from helpers import Server, finished, kind, mcp_stdio_server, take_until

from vak_client import AsyncClient, Client, VakError, agent_pb2, json_name

TOOLS = ["mcp__demo__add", "mcp__demo__echo", "mcp__demo__fail", "mcp__demo__grow", "mcp__demo__pid", "mcp__demo__wait"]


@pytest.fixture(scope="module")
def mcp_vak(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server of its own: these tests change its MCP table."""
    server = Server(tmp_path_factory.mktemp("vak-mcp"))
    try:
        yield server
    finally:
        rc = server.terminate()
        assert rc == 0, f"vak serve exited with {rc} after SIGTERM:\n{server.output()}"


@pytest.fixture
def mcp_client(mcp_vak: Server, unary: str) -> Iterator[Client]:
    with mcp_vak.client(unary=unary) as c:
        try:
            yield c
        finally:
            c.put_mcp_config({})


def test_put_get_and_put_back(mcp_vak: Server, mcp_client: Client) -> None:
    c = mcp_client
    assert dict(c.get_mcp_config().servers) == {}

    put = c.put_mcp_config({"demo": {**mcp_stdio_server(), "timeout_ms": 30000}})
    assert isinstance(put, agent_pb2.McpConfig) and list(put.servers) == ["demo"]
    demo = put.servers["demo"]
    assert json_name(demo, "state") == "ready", demo.last_error
    assert demo.state == agent_pb2.MCP_SERVER_STATE_READY
    assert sorted(demo.tools) == TOOLS and demo.tool_count == len(TOOLS)
    assert demo.pid > 0 and demo.restarts == 0 and not demo.HasField("last_error")
    assert (demo.command, list(demo.args), demo.timeout_ms) == (
        mcp_stdio_server()["command"],
        mcp_stdio_server()["args"],
        30000,
    )
    got = c.get_mcp_config()
    assert got == put

    # What GET answered goes back as it is (its output-only fields ignored):
    # the unchanged server keeps its process; a disabled one and one that
    # cannot start are listed with their states.
    table: dict[str, agent_pb2.McpServer | dict[str, object]] = dict(got.servers)
    table["off"] = {"url": "http://127.0.0.1:9/mcp", "enabled": False}
    table["broken"] = {"command": str(mcp_vak.workspace / "no-such-program")}
    again = c.put_mcp_config(table)
    assert sorted(again.servers) == ["broken", "demo", "off"]
    assert again.servers["demo"].pid == demo.pid and json_name(again.servers["demo"], "state") == "ready"
    off = again.servers["off"]
    assert (json_name(off, "state"), off.url, off.enabled, list(off.tools)) == ("disabled", "http://127.0.0.1:9/mcp", False, [])
    broken = again.servers["broken"]
    assert json_name(broken, "state") == "failed"
    assert "no-such-program" in broken.last_error and broken.tool_count == 0

    # A server left out is removed.
    assert sorted(c.put_mcp_config({"demo": got.servers["demo"]}).servers) == ["demo"]
    assert dict(c.put_mcp_config({}).servers) == {}


def test_invalid_tables_are_refused(mcp_client: Client) -> None:
    with pytest.raises(VakError) as err:
        mcp_client.put_mcp_config({"both": {"command": "x", "url": "http://127.0.0.1:9/mcp"}})
    assert (err.value.status, err.value.code) == (400, "invalid_argument")
    assert err.value.message.startswith("servers.both"), err.value.message
    # A misspelt field is refused before any call, as the server's REST parser refuses it.
    with pytest.raises(VakError) as err:
        mcp_client.put_mcp_config({"typo": {"comand": "x"}})
    assert (err.value.status, err.value.code) == (400, "invalid_argument")
    assert err.value.message.startswith("servers.typo: ") and "comand" in err.value.message
    assert dict(mcp_client.get_mcp_config().servers) == {}


def test_an_mcp_tool_call_asks_and_always_stores_a_tool_rule(mcp_client: Client) -> None:
    c = mcp_client
    assert json_name(c.put_mcp_config({"demo": mcp_stdio_server()}).servers["demo"], "state") == "ready"
    sid = c.create_session()
    answers: list[agent_pb2.ApproveResponse] = []

    def answer(ev: agent_pb2.Event) -> None:
        if kind(ev) == "approval_requested":
            req = ev.approval_requested
            assert (req.tool, req.reason) == ("mcp__demo__echo", "run mcp__demo__echo")
            answers.append(c.approve(sid, req.request_id, True, always=True))

    with c.follow(sid, after=0) as events:
        c.run(sid, '/call mcp__demo__echo {"text": "hi"}')
        got = take_until(events, finished, events, on_item=answer)
    assert len(answers) == 1 and answers[0].persisted
    rule = answers[0].rule
    assert (rule.tool, json_name(rule, "kind"), rule.pattern) == ("mcp__demo__echo", "tool", "mcp__demo__echo")
    assert rule.kind == agent_pb2.RULE_KIND_TOOL
    result = next(e.tool_result for e in got if kind(e) == "tool_result")
    assert (result.ok, result.output) == (True, "echo: hi")

    # The rule covers every call of that tool, and of no other.
    with c.follow(sid, after=c.attach(sid).latest_seq) as events:
        c.run(sid, '/call mcp__demo__echo {"text": "again"}')
        got = take_until(events, finished, events)
    assert not any(kind(e) == "approval_requested" for e in got)
    assert next(e.tool_result for e in got if kind(e) == "tool_result").output == "echo: again"
    assert rule in list(c.list_rules().rules)
    c.delete_rule(rule.id)


def test_async_client(mcp_vak: Server, unary: str) -> None:
    async def main() -> None:
        async with AsyncClient(mcp_vak.url, mcp_vak.token, unary=unary) as c:  # type: ignore[arg-type]
            try:
                put = await c.put_mcp_config({"demo": mcp_stdio_server()})
                assert json_name(put.servers["demo"], "state") == "ready"
                assert await c.get_mcp_config() == put
            finally:
                assert dict((await c.put_mcp_config({})).servers) == {}

    asyncio.run(main())
