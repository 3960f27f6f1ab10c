"""A real MCP server for vak's tests (tests/it/mcp.rs), on the official Python SDK.

Usage: server.py stdio            serve over stdio
       server.py http             serve streamable HTTP on 127.0.0.1 (a free port),
                                  printing "listening <url>" once it accepts
With MCP_TEST_TOKEN set, HTTP requests need "Authorization: Bearer <token>" (401 otherwise).
With MCP_TEST_DIR set, a cancelled `wait` call leaves the file <dir>/cancelled.
With MCP_TEST_NOISE_KIB=N, a stdio server first writes a line that is not UTF-8, then N KiB
of lines, to stderr.
"""

import os
import socket
import sys

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("vak-test-server")


@server.tool()
def echo(text: str) -> str:
    """Answers the text back."""
    return f"echo: {text}"


@server.tool()
def add(a: int, b: int) -> str:
    """Adds two whole numbers."""
    return str(a + b)


@server.tool()
def fail(why: str) -> str:
    """Always fails with the reason given."""
    raise ToolError(why)


@server.tool()
def pid() -> str:
    """The server process's id."""
    return str(os.getpid())


@server.tool()
async def wait(seconds: float) -> str:
    """Waits, then answers; records a cancellation."""
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        folder = os.environ.get("MCP_TEST_DIR")
        if folder:
            with open(os.path.join(folder, "cancelled"), "w") as f:
                f.write("cancelled\n")
        raise
    return "waited"


def late(word: str) -> str:
    """A tool that exists only after grow."""
    return f"late: {word}"


@server.tool()
async def grow(ctx: Context) -> str:
    """Adds the tool `late` and says the tool list changed."""
    server.add_tool(late)
    await ctx.session.send_tool_list_changed()
    return "grown"


def require_token(app, token):
    """An ASGI wrapper refusing requests without the bearer token."""

    async def guarded(scope, receive, send):
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            if headers.get(b"authorization", b"").decode() != f"Bearer {token}":
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"text/plain"),
                                        (b"www-authenticate", b"Bearer")]})
                await send({"type": "http.response.body", "body": b"unauthorized"})
                return
        await app(scope, receive, send)

    return guarded


async def serve_http():
    import uvicorn

    app = server.streamable_http_app(host="127.0.0.1")
    token = os.environ.get("MCP_TEST_TOKEN")
    if token:
        app_to_run = require_token(app, token)
    else:
        app_to_run = app
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    config = uvicorn.Config(app_to_run, log_level="warning", lifespan="on")
    userver = uvicorn.Server(config)
    # The lifespan of the starlette app (the session manager) runs with it.
    print(f"listening http://127.0.0.1:{port}/mcp", flush=True)
    await userver.serve(sockets=[sock])


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "stdio"
    if mode == "stdio":
        noise = int(os.environ.get("MCP_TEST_NOISE_KIB", "0"))
        if noise:
            # More than a pipe holds: whoever started this must read its stderr all along.
            sys.stderr.buffer.write(b"\xff\xfe not utf-8\n")
            for _ in range(noise):
                sys.stderr.buffer.write(b"x" * 1023 + b"\n")
            sys.stderr.buffer.write(b"noise done\n")
            sys.stderr.buffer.flush()
        server.run("stdio")
    elif mode == "http":
        anyio.run(serve_http)
    else:
        sys.exit(f"unknown mode {mode}: expected stdio or http")
