"""Test support: a `vak serve` child process, a TCP proxy that can cut
connections, and deadlines for blocking iteration."""

from __future__ import annotations

import asyncio
import collections
import os
import queue
import re
import secrets
import signal
import socket
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Protocol, TypeVar

from vak_client import Client, Event

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent.parent

START_DEADLINE = 30.0
STOP_DEADLINE = 15.0
STEP = 30.0  # the deadline of one test step (a run, a wait)

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_LISTENING = re.compile(r"listening on (http://127\.0\.0\.1:(\d+))")

T = TypeVar("T")


def vak_binary() -> Path:
    return Path(os.environ.get("VAK_BIN") or REPO / "target" / "debug" / "vak")


class Server:
    """A `vak serve` child on 127.0.0.1:0 with its own home and workspace."""

    def __init__(self, root: Path, *extra: str, token: str | None = None) -> None:
        """`root` may hold the home of an earlier server (a restart)."""
        self.home = root / "home"
        self.workspace = root / "workspace"
        self.home.mkdir(parents=True, exist_ok=True)
        self.workspace.mkdir(parents=True, exist_ok=True)
        self.token = token or secrets.token_hex(16)
        self.argv = [
            str(vak_binary()), "serve",
            "--listen", "127.0.0.1:0",
            "--home", str(self.home),
            "--workspace", str(self.workspace),
            "--token", self.token,
            *extra,
        ]  # fmt: skip
        self.tail: collections.deque[str] = collections.deque(maxlen=80)
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "NO_COLOR": "1"},
            text=True,
            errors="replace",
        )
        for name, pipe in (("stdout", self.proc.stdout), ("stderr", self.proc.stderr)):
            assert pipe is not None
            threading.Thread(target=self._drain, args=(name, pipe), daemon=True).start()
        self.url = self._wait_listening()
        self.port = int(self.url.rsplit(":", 1)[1])

    def _drain(self, name: str, pipe: IO[str]) -> None:
        for line in pipe:
            line = _ANSI.sub("", line.rstrip("\n"))
            self.tail.append(f"[{name}] {line}")
            self._lines.put(line)
        self._lines.put(None)

    def _wait_listening(self) -> str:
        deadline = time.monotonic() + START_DEADLINE
        eofs = 0
        while eofs < 2:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                raise AssertionError(f"no 'listening on' line within {START_DEADLINE}s: {self.output()}")
            try:
                line = self._lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                eofs += 1
            elif m := _LISTENING.search(line):
                assert int(m.group(2)) != 0, line
                return m.group(1)
        rc = self.proc.wait(timeout=5)
        raise AssertionError(f"vak serve exited with {rc} before listening: {self.output()}")

    def output(self) -> str:
        return "\n".join(self.tail)

    def client(self, **kwargs: object) -> Client:
        return Client(self.url, self.token, **kwargs)  # type: ignore[arg-type]

    def terminate(self) -> int:
        """SIGTERM; the exit code (the test fails if it does not exit in time)."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=STOP_DEADLINE)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"vak serve still running {STOP_DEADLINE}s after SIGTERM: {self.output()}") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)


def serving(server: Server) -> Iterator[Server]:
    """Yields `server` to a fixture, then stops it with SIGTERM: the test fails unless it exits cleanly."""
    try:
        yield server
    finally:
        rc = server.terminate()
        assert rc == 0, f"vak serve exited with {rc} after SIGTERM:\n{server.output()}"


class Proxy:
    """A TCP proxy on 127.0.0.1:0 in front of `port`. `cut()` shuts down
    every connection it carries (both sides); `hold()` also makes it close
    new connections at once until `release()`. `requests[i]` holds the
    first bytes the client sent on connection i (an HTTP request head, for
    SSE)."""

    def __init__(self, port: int) -> None:
        self._target = ("127.0.0.1", port)  # see retarget()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._refusal = threading.Condition(self._lock)
        self._open: list[socket.socket] = []
        self._holding = False
        self._closed = False
        self.requests: list[bytes] = []
        self.refused = 0
        self.cuts = 0
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def accepted(self) -> int:
        with self._lock:
            return len(self.requests)

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if self._closed or self._holding:
                    self.refused += 1
                    self._refusal.notify_all()
                    downstream.close()
                    if self._closed:
                        return
                    continue
            with self._lock:
                target = self._target
            try:
                upstream = socket.create_connection(target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                downstream.close()
                continue
            with self._lock:
                index = len(self.requests)
                self.requests.append(b"")
                self._open += [downstream, upstream]
            pair = {"left": 2}
            threading.Thread(target=self._pipe, args=(downstream, upstream, index, pair), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, downstream, None, pair), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, index: int | None, pair: dict[str, int]) -> None:
        try:
            while data := src.recv(65536):
                if index is not None:
                    with self._lock:
                        if len(self.requests[index]) < 16384:
                            self.requests[index] += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            with self._lock:
                pair["left"] -= 1
                last = pair["left"] == 0
                if last:
                    for s in (src, dst):
                        if s in self._open:
                            self._open.remove(s)
            if last:
                src.close()
                dst.close()

    def retarget(self, port: int) -> None:
        """New connections go to `port` (a restarted server)."""
        with self._lock:
            self._target = ("127.0.0.1", port)

    def cut(self) -> None:
        with self._lock:
            socks = list(self._open)
            self.cuts += 1
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def hold(self) -> None:
        with self._lock:
            self._holding = True
        self.cut()

    def wait_refused(self, n: int, timeout: float = STEP) -> None:
        """Waits until `n` connections were refused in all."""
        with self._refusal:
            ok = self._refusal.wait_for(lambda: self.refused >= n, timeout)
        assert ok, f"only {self.refused} connections refused within {timeout}s"

    def release(self) -> None:
        with self._lock:
            self._holding = False

    def close(self) -> None:
        with self._lock:
            self._closed = True
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        self.cut()


class Closable(Protocol):
    def close(self) -> None: ...


@contextmanager
def deadline(seconds: float, *closables: Closable) -> Iterator[threading.Event]:
    """Closes `closables` (ending a blocked iteration) after `seconds`; the
    yielded event tells whether that happened."""
    fired = threading.Event()

    def fire() -> None:
        fired.set()
        for c in closables:
            c.close()

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    try:
        yield fired
    finally:
        timer.cancel()


def take_until(
    items: Iterator[T],
    stop: Callable[[T], bool],
    closable: Closable,
    *,
    timeout: float = STEP,
    on_item: Callable[[T], None] | None = None,
) -> list[T]:
    """Iterates until `stop(item)` (included); fails if the iteration ends
    first or `timeout` passes."""
    out: list[T] = []
    with deadline(timeout, closable) as fired:
        for item in items:
            out.append(item)
            if on_item is not None:
                on_item(item)
            if stop(item):
                return out
    state = {k: getattr(closable, k, None) for k in ("cursor", "stream_id", "reconnects", "connected")}
    assert not fired.is_set(), (
        f"timed out after {timeout}s; got {len(out)} items ({state}); first {out[:8]!r}; last {out[-1:]!r}"
    )
    raise AssertionError(f"the iteration ended after {len(out)} items, last {out[-1:]!r}")


def run_async(main: Callable[[], Coroutine[Any, Any, None]], timeout: float = 2 * STEP) -> None:
    """Runs `main` in a new event loop; fails if it takes over `timeout`."""

    async def bounded() -> None:
        async with asyncio.timeout(timeout):
            await main()

    asyncio.run(bounded())


async def take_until_async(
    items: AsyncIterator[T],
    stop: Callable[[T], bool],
    *,
    timeout: float = STEP,
    on_item: Callable[[T], None] | None = None,
) -> list[T]:
    """`take_until` for an async iterator."""
    out: list[T] = []
    try:
        async with asyncio.timeout(timeout):
            async for item in items:
                out.append(item)
                if on_item is not None:
                    on_item(item)
                if stop(item):
                    return out
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout}s; got {len(out)} items, last {out[-1:]!r}") from None
    raise AssertionError(f"the iteration ended after {len(out)} items, last {out[-1:]!r}")


def kind(ev: Event) -> str | None:
    k: str | None = ev.WhichOneof("kind")
    return k


def finished(ev: Event) -> bool:
    return kind(ev) == "run_finished"


def texts(events: list[Event]) -> str:
    return "".join(e.text_delta.text for e in events if kind(e) == "text_delta")


def burst_text(n: int) -> str:
    return "".join(f"t{i} " for i in range(n))


def session_events(events: list[Event]) -> list[Event]:
    return [e for e in events if e.seq > 0]


def assert_gap_free(events: list[Event], first: int | None = None) -> None:
    """Session events are strictly consecutive (no duplicate, no gap)."""
    seqs = [e.seq for e in session_events(events)]
    assert seqs, "no session events"
    start = seqs[0] if first is None else first
    assert seqs == list(range(start, start + len(seqs))), f"seqs not consecutive from {start}: {seqs}"


def wait_finished(client: Client, session_id: str, after: int = 0) -> list[Event]:
    """Every event of the session after `after` up to the next run_finished."""
    follower = client.follow(session_id, after=after)
    try:
        return take_until(follower, finished, follower)
    finally:
        follower.close()


def mcp_python() -> str:
    """A Python with the official MCP SDK (tests/mcp/server.py needs it): `make
    mcp` installs it into target/mcp-venv; VAK_MCP_PYTHON names it."""
    py = os.environ.get("VAK_MCP_PYTHON")
    assert py, (
        "VAK_MCP_PYTHON is not set: run `make mcp` (it installs the MCP SDK into target/mcp-venv), "
        "then VAK_MCP_PYTHON=$PWD/target/mcp-venv/bin/python (`make test-python` does both)"
    )
    return py


def mcp_stdio_server() -> dict[str, object]:
    """The definition of the repository's test MCP server over stdio (tools
    echo, add, fail, pid, wait, grow)."""
    return {"command": mcp_python(), "args": [str(REPO / "tests" / "mcp" / "server.py"), "stdio"]}
