#!/usr/bin/env python3
"""Smoke test: one `vak serve` process is shared by gRPC and REST.

Starts the server (binary from $VAK_BIN, default <repo>/target/debug/vak) on
127.0.0.1:0 with a fresh home, workspace and random token, then:

  * GET /health answers without a token; gRPC (unary and Subscribe) and REST
    refuse a missing or wrong token (UNAUTHENTICATED / 401);
  * CreateSession over gRPC; Subscribe over gRPC, waiting for stream_opened;
  * POST /sessions/{id}/run over REST with the prompt "hello world";
  * the Subscribe stream delivers text deltas that concatenate to exactly
    "echo: hello world" and a run_finished with outcome "completed"; every
    event carries the session id, cursor frames have strictly increasing
    non-zero seqs, stream-level frames have seq 0;
  * SIGTERM (with the Subscribe stream still open) makes it exit 0.

Prints one PASS line and exits 0, or prints FAIL with the reason, the events
seen and the server's last output, and exits 1. Every wait has a deadline.
With -v, also prints the events and the server's output after a PASS.
"""

from __future__ import annotations

import collections
import os
import queue
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import IO, Any

import grpc

from vak_client import Client, Event, Subscription, VakError, json_name

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

START_DEADLINE = 30.0  # until the "listening on" line
OPEN_DEADLINE = 10.0  # until stream_opened
RUN_DEADLINE = 30.0  # from POST /run until run_finished
STOP_DEADLINE = 10.0  # from SIGTERM until exit
RPC_TIMEOUT = 10.0  # any unary RPC or REST call
OVERALL_DEADLINE = 150  # backstop for the whole script, seconds

PROMPT = "hello world"
EXPECTED_TEXT = "echo: hello world"
STREAM_LEVEL = {"stream_opened", "resync", "session_closed"}

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_LISTENING = re.compile(r"listening on (http://127\.0\.0\.1:(\d+))")


class SmokeFailure(Exception):
    pass


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise SmokeFailure(msg)


class Server:
    """A `vak serve` child whose stdout and stderr are drained by threads."""

    def __init__(self, binary: Path, home: Path, workspace: Path, token: str) -> None:
        self.argv = [
            str(binary), "serve",
            "--listen", "127.0.0.1:0",
            "--home", str(home),
            "--workspace", str(workspace),
            # One argument: a token_urlsafe token may begin with "-", which as
            # a separate argument would read as a flag (CI of 80c71ae).
            f"--token={token}",
        ]  # fmt: skip
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.tail: collections.deque[str] = collections.deque(maxlen=60)
        env = {**os.environ, "NO_COLOR": "1"}
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
            errors="replace",
        )
        for name, pipe in (("stdout", self.proc.stdout), ("stderr", self.proc.stderr)):
            assert pipe is not None
            threading.Thread(target=self._drain, args=(name, pipe), daemon=True).start()

    def _drain(self, name: str, pipe: IO[str]) -> None:
        for line in pipe:
            line = _ANSI.sub("", line.rstrip("\n"))
            self.tail.append(f"[{name}] {line}")
            self.lines.put(line)
        self.lines.put(None)

    def wait_listening(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        eofs = 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SmokeFailure(f"no 'listening on http://127.0.0.1:PORT' line within {timeout:.0f}s")
            try:
                line = self.lines.get(timeout=min(remaining, 0.25))
            except queue.Empty:
                line = ""
            if line is None:
                eofs += 1
            elif m := _LISTENING.search(line):
                check(int(m.group(2)) != 0, f"server announced port 0: {line!r}")
                return m.group(1)
            if eofs == 2 or (line == "" and self.proc.poll() is not None):
                rc = self.proc.wait(timeout=5)
                raise SmokeFailure(f"server exited with code {rc} before printing its listening line")

    def terminate(self, timeout: float) -> tuple[int | None, float]:
        """SIGTERM; returns (exit code or None if still running, seconds waited)."""
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc: int | None = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        return rc, time.monotonic() - t0

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


def pump(sub: Subscription, out: queue.Queue[tuple[str, Any]]) -> None:
    """Forward a Subscribe stream into a queue: ("event", Event), then
    ("end", None) or ("error", exception)."""
    try:
        for event in sub:
            out.put(("event", event))
        out.put(("end", None))
    except BaseException as exc:  # noqa: BLE001 - reported by the main thread
        out.put(("error", exc))


def next_item(q: queue.Queue[tuple[str, Any]], deadline: float, waiting_for: str) -> tuple[str, Any]:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise SmokeFailure(f"timed out waiting for {waiting_for}")
    try:
        return q.get(timeout=remaining)
    except queue.Empty:
        raise SmokeFailure(f"timed out waiting for {waiting_for}") from None


def describe(event: Event) -> str:
    kind = event.WhichOneof("kind")
    detail = ""
    if kind in ("text_delta", "thinking_delta"):
        detail = repr(getattr(event, kind).text)
    elif kind == "run_finished":
        detail = f"outcome={json_name(event.run_finished, 'outcome')!r} message={event.run_finished.message!r}"
    elif kind in ("resync", "session_closed"):
        detail = f"reason={getattr(event, kind).reason!r}"
    return f"seq={event.seq} {kind} {detail}".rstrip()


def expect_unauthenticated_rpc(client: Client, session_id: str, label: str) -> None:
    try:
        client.create_session()
    except VakError as err:
        check(
            err.grpc_code == grpc.StatusCode.UNAUTHENTICATED and err.status == 401,
            f"CreateSession with {label}: expected UNAUTHENTICATED, got {err.grpc_code} ({err.message})",
        )
    else:
        raise SmokeFailure(f"CreateSession with {label} succeeded; expected UNAUTHENTICATED")

    sub = client.subscribe(session_id, timeout=RPC_TIMEOUT)
    try:
        first = next(sub)
    except grpc.RpcError as err:
        code = err.code()
        check(
            code == grpc.StatusCode.UNAUTHENTICATED,
            f"Subscribe with {label}: expected UNAUTHENTICATED, got {code} ({err.details()})",
        )
    except StopIteration:
        raise SmokeFailure(f"Subscribe with {label} ended with OK status; expected UNAUTHENTICATED") from None
    else:
        raise SmokeFailure(f"Subscribe with {label} delivered {describe(first)}; expected UNAUTHENTICATED")
    finally:
        sub.cancel()


def expect_401(client: Client, session_id: str, label: str) -> None:
    try:
        resp = client.request("POST", f"/sessions/{session_id}/run", {"prompt": "must not run"})
    except VakError as err:
        check(err.status == 401, f"POST /run with {label}: expected 401, got {err}")
        if not err.code:
            print(f"note: 401 body is not the error envelope: {err.body[:200]!r}", file=sys.stderr)
    else:
        raise SmokeFailure(f"POST /run with {label} answered {resp.status} {resp.body}; expected 401")


def smoke(binary: Path, workdir: Path, report: dict[str, Any]) -> str:
    home, workspace = workdir / "home", workdir / "workspace"
    home.mkdir()
    workspace.mkdir()
    token = secrets.token_urlsafe(24)

    server = Server(binary, home, workspace, token)
    report["server"] = server
    url = server.wait_listening(START_DEADLINE)

    client = Client(url, token, timeout=RPC_TIMEOUT)  # unary calls over gRPC
    rest = Client(url, token, timeout=RPC_TIMEOUT, unary="rest")  # ... and over REST
    anon = Client(url, None, timeout=RPC_TIMEOUT)
    wrong = Client(url, "not-" + token, timeout=RPC_TIMEOUT)
    try:
        # REST: /health is open.
        try:
            health = anon.request("GET", "/health")
        except VakError as err:
            raise SmokeFailure(f"GET /health without a token: {err}") from None
        check(health.status == 200, f"GET /health answered {health.status}, expected 200")

        # gRPC: create the session.
        session_id = client.create_session()
        check(bool(session_id), "CreateSession returned an empty session_id")

        # Auth is enforced on both surfaces.
        expect_unauthenticated_rpc(anon, session_id, "no token")
        expect_unauthenticated_rpc(wrong, session_id, "a wrong token")
        expect_401(anon, session_id, "no token")
        expect_401(wrong, session_id, "a wrong token")

        # gRPC: subscribe and wait for stream_opened before starting the run.
        events: list[Event] = []
        report["events"] = events
        items: queue.Queue[tuple[str, Any]] = queue.Queue()
        sub = client.subscribe(session_id)
        report["subscription"] = sub
        threading.Thread(target=pump, args=(sub, items), daemon=True).start()

        tag, item = next_item(items, time.monotonic() + OPEN_DEADLINE, "stream_opened")
        check(tag == "event", f"Subscribe ended before stream_opened: {tag} {item!r}")
        first: Event = item
        events.append(first)
        check(first.WhichOneof("kind") == "stream_opened", f"first frame is not stream_opened: {describe(first)}")
        check(first.seq == 0, f"stream_opened has seq {first.seq}, expected 0")
        check(first.session_id == session_id, f"stream_opened.session_id is {first.session_id!r}")
        check(
            first.stream_opened.session_id == session_id,
            f"stream_opened.stream_opened.session_id is {first.stream_opened.session_id!r}",
        )

        # REST: start the run on the same server.
        request_id = f"smoke-{secrets.token_hex(6)}"
        try:
            admission = rest.run(session_id, PROMPT, request_id=request_id)
        except VakError as err:
            raise SmokeFailure(f"POST /sessions/{{id}}/run: {err}") from None
        check(
            json_name(admission, "state") == "started",
            f"admission state is {json_name(admission, 'state')!r}, expected 'started'",
        )
        check(
            admission.request_id == request_id,
            f"admission request_id is {admission.request_id!r}, expected {request_id!r}",
        )

        # gRPC: the run's events, until run_finished.
        deadline = time.monotonic() + RUN_DEADLINE
        last_seq = 0
        text: list[str] = []
        finished: Event | None = None
        while finished is None:
            tag, item = next_item(items, deadline, f"run_finished (within {RUN_DEADLINE:.0f}s)")
            if tag == "end":
                raise SmokeFailure("Subscribe stream ended before run_finished")
            if tag == "error":
                detail = f"{item.code()} {item.details()}" if isinstance(item, grpc.RpcError) else repr(item)
                raise SmokeFailure(f"Subscribe stream failed before run_finished: {detail}")
            event: Event = item
            events.append(event)
            kind = event.WhichOneof("kind")
            check(kind is not None, f"event without a kind: seq={event.seq}")
            check(
                event.session_id == session_id,
                f"event {describe(event)} has session_id {event.session_id!r}, expected {session_id!r}",
            )
            if kind in STREAM_LEVEL:
                check(event.seq == 0, f"stream-level frame with non-zero seq: {describe(event)}")
                check(kind != "session_closed", f"stream closed before run_finished: {describe(event)}")
                continue
            check(event.seq > 0, f"cursor frame with seq 0: {describe(event)}")
            check(event.seq > last_seq, f"seq not strictly increasing: {event.seq} after {last_seq}")
            last_seq = event.seq
            if kind == "text_delta":
                text.append(event.text_delta.text)
            elif kind == "user_message":
                check(event.user_message.text == PROMPT, f"user_message text is {event.user_message.text!r}")
            elif kind == "run_finished":
                finished = event

        joined = "".join(text)
        check(joined == EXPECTED_TEXT, f"text deltas concatenate to {joined!r}, expected {EXPECTED_TEXT!r}")
        outcome = json_name(finished.run_finished, "outcome")
        check(
            outcome == "completed",
            f"run_finished outcome is {outcome!r} (message {finished.run_finished.message!r}), expected 'completed'",
        )

        # Shutdown with the Subscribe stream still open.
        rc, waited = server.terminate(STOP_DEADLINE)
        check(rc is not None, f"server still running {STOP_DEADLINE:.0f}s after SIGTERM (a Subscribe stream was open)")
        check(rc == 0, f"server exited with code {rc} after SIGTERM, expected 0")

        closed = ""
        try:
            while True:
                tag, item = items.get(timeout=2.0)
                if tag != "event":
                    break
                events.append(item)
                if item.WhichOneof("kind") == "session_closed":
                    closed = f", stream got session_closed({item.session_closed.reason!r})"
        except queue.Empty:
            pass

        kinds = collections.Counter(e.WhichOneof("kind") for e in events)
        return (
            f"PASS vak smoke: {url} session {session_id}: gRPC CreateSession+Subscribe, REST run "
            f"-> {len(events)} events ({kinds['text_delta']} text_delta = {joined!r}), run_finished completed, "
            f"last seq {last_seq}; auth refused (gRPC UNAUTHENTICATED, REST 401); "
            f"SIGTERM -> exit 0 in {waited:.2f}s{closed}"
        )
    finally:
        for c in (client, rest, anon, wrong):
            c.close()


def _overall_timeout(signum: int, frame: FrameType | None) -> None:
    raise SmokeFailure(f"overall deadline of {OVERALL_DEADLINE}s exceeded")


def dump(report: dict[str, Any]) -> None:
    events: list[Event] = report.get("events", [])
    if events:
        print("events received:", file=sys.stderr)
        for event in events:
            print(f"  {describe(event)}", file=sys.stderr)
    server: Server | None = report.get("server")
    if server is not None:
        print(f"server: {' '.join(server.argv[:-1])} --token=<token>", file=sys.stderr)
        print("server output (last lines):", file=sys.stderr)
        for line in server.tail:
            print(f"  {line}", file=sys.stderr)


def main() -> int:
    verbose = sys.argv[1:] in (["-v"], ["--verbose"])
    if sys.argv[1:] and not verbose:
        print("usage: smoke.py [-v|--verbose]", file=sys.stderr)
        return 2
    binary = Path(os.environ.get("VAK_BIN") or REPO / "target" / "debug" / "vak")
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        print(f"FAIL vak smoke: no executable vak binary at {binary} (build it, or set VAK_BIN)", file=sys.stderr)
        return 1

    signal.signal(signal.SIGALRM, _overall_timeout)
    signal.alarm(OVERALL_DEADLINE)
    report: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="vak-smoke-") as tmp:
            try:
                summary = smoke(binary, Path(tmp), report)
            finally:
                sub: Subscription | None = report.get("subscription")
                if sub is not None:
                    sub.cancel()
                server: Server | None = report.get("server")
                if server is not None:
                    server.kill()
    except Exception as failure:  # noqa: BLE001 - every failure is reported the same way
        signal.alarm(0)
        if isinstance(failure, SmokeFailure):
            reason = str(failure)
        elif isinstance(failure, grpc.RpcError):
            reason = f"unexpected gRPC error {failure.code()}: {failure.details()}"
        else:
            reason = f"unexpected {type(failure).__name__}: {failure}"
        print(f"FAIL vak smoke: {reason}", file=sys.stderr)
        dump(report)
        return 1
    signal.alarm(0)
    if verbose:
        dump(report)
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
