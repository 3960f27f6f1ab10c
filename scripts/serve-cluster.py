#!/usr/bin/env python3
"""make serve-cluster: three nats-server nodes (one JetStream cluster) and three
`vak serve --bus` replicas on this machine, for a person to try scale-out
(docs/scale-out.md).

Everything lives in a temporary directory and stops on Ctrl-C (or SIGTERM).
Each replica prints where it listens; all share one token (VAK_TOKEN, or a
random one printed here), so a client or a load balancer may use any of them,
and one cluster secret (--bus-secret-file), so a key stored on one is used by all.

Environment: VAK_BIN (default target/release/vak), VAK_NATS_SERVER (default
target/nats-venv/bin/nats-server), VAK_CLUSTER_PORT (the first replica's port,
default 8911; the others follow), NATS_PORT (the first node's client port,
default 4222). With --check (every port then a free one), it runs a session across the replicas (a run
admitted on the first, its transcript read from the second and third) and
exits 0 when all three agree.
"""

import json
import os
import socket
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VAK = Path(os.environ.get("VAK_BIN", ROOT / "target" / "release" / "vak"))
NATS = Path(os.environ.get("VAK_NATS_SERVER", ROOT / "target" / "nats-venv" / "bin" / "nats-server"))
VAK_PORT = int(os.environ.get("VAK_CLUSTER_PORT", "8911"))
NATS_PORT = int(os.environ.get("NATS_PORT", "4222"))
DEADLINE = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fail(msg: str) -> None:
    print(f"serve-cluster: {msg}", file=sys.stderr)
    sys.exit(1)


def wait_healthy(monitor_port: int, deadline: float) -> None:
    """Until the node answers /healthz with JetStream ready (a meta leader)."""
    url = f"http://127.0.0.1:{monitor_port}/healthz"
    last = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except Exception as e:  # not up yet
            last = str(e)
        time.sleep(0.2)
    fail(f"nats node on monitor port {monitor_port} not healthy: {last}")


def listening_url(proc: subprocess.Popen, log: list, deadline: float) -> str:
    """Reads the replica's output until its `listening on` line."""
    assert proc.stdout is not None
    for line in proc.stdout:
        log.append(line)
        m = re.search(r"listening on (https?://\S+)", line)
        if m:
            threading.Thread(target=lambda: log.extend(proc.stdout), daemon=True).start()
            return m.group(1)
        if time.monotonic() > deadline:
            break
    fail("a replica ended before listening:\n" + "".join(log[-30:]))
    return ""


def stop_all(procs: list) -> None:
    """Terminates every process, the replicas before the nats nodes, and reaps them."""
    for p in reversed(procs):
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()


def call(url: str, token: str, method: str, path: str, body=None):
    """One request; a 503 (a replica still joining the JetStream cluster on a
    loaded machine) is retried as its Retry-After says, for up to 60 s."""
    deadline = time.monotonic() + 60
    while True:
        req = urllib.request.Request(
            url + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            if e.code != 503 or time.monotonic() > deadline:
                raise
            detail = e.read().decode(errors="replace")
            wait = float(e.headers.get("Retry-After") or 1)
            print(f"serve-cluster: {method} {path} on {url}: 503 {detail}; again in {wait:g} s", flush=True)
            time.sleep(min(wait, 5))


def check(urls: list, token: str) -> None:
    """A run admitted on replica 1 and waited for; its transcript read on all three."""
    sid = call(urls[0], token, "POST", "/sessions", {})["session_id"]
    result = call(urls[0], token, "POST", f"/sessions/{sid}/run", {"prompt": "hello cluster", "wait": True})
    print(f"serve-cluster: run on {urls[0]}: {json.dumps(result)}")
    texts = []
    for u in urls:
        t = call(u, token, "GET", f"/sessions/{sid}/transcript")
        texts.append(json.dumps(t.get("messages"), sort_keys=True))
        print(f"serve-cluster: transcript on {u}: seq {t.get('seq')}, {len(t.get('messages', []))} messages")
    if len(set(texts)) != 1 or "hello cluster" not in texts[0]:
        fail("the replicas disagree on the transcript")
    print("serve-cluster: check passed: every replica serves the same session")


def main() -> None:
    check_mode = "--check" in sys.argv[1:]
    for tool, how in ((VAK, "make release"), (NATS, "make nats")):
        if not tool.exists():
            fail(f"{tool} is missing: run {how}")
    token = os.environ.get("VAK_TOKEN") or secrets.token_hex(16)
    procs: list = []
    # SIGTERM ends like Ctrl-C: through the `finally` below, which stops everything.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with tempfile.TemporaryDirectory(prefix="vak-cluster-") as tmp:
        tmp = Path(tmp)
        deadline = time.monotonic() + DEADLINE
        try:
            # The client ports a person may want to know (NATS_PORT and the next
            # two); with --check every port is a free one, so a test never collides.
            client = [free_port() if check_mode else NATS_PORT + i for i in range(3)]
            cluster = [free_port() for _ in range(3)]
            monitor = [free_port() for _ in range(3)]
            routes = ",".join(f"nats-route://127.0.0.1:{c}" for c in cluster)
            for i in range(3):
                name = f"n{i}"
                log = open(tmp / f"{name}.log", "w")
                procs.append(
                    subprocess.Popen(
                        [str(NATS), "-a", "127.0.0.1", "-p", str(client[i]), "-m", str(monitor[i]),
                         "-n", name, "-js", "-sd", str(tmp / name), "--cluster_name", "vak-local",
                         "--cluster", f"nats://127.0.0.1:{cluster[i]}", "--routes", routes],
                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                    )
                )
            for i in range(3):
                wait_healthy(monitor[i], deadline)
                print(f"serve-cluster: nats node n{i} on nats://127.0.0.1:{client[i]} (log {tmp}/n{i}.log)")
            bus = ",".join(f"nats://127.0.0.1:{c}" for c in client)
            env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_"))}
            env["VAK_TOKEN"] = token
            # One cluster secret for every replica, so a key stored on one is
            # every replica's (sealed in VAK_CONFIG; docs/scale-out.md).
            secret = tmp / "bus-secret"
            secret.write_text(secrets.token_hex(32))
            secret.chmod(0o600)
            urls = []
            for i in range(3):
                home, ws = tmp / f"home{i + 1}", tmp / "workspace"
                ws.mkdir(exist_ok=True)
                p = subprocess.Popen(
                    [str(VAK), "serve", "--listen", f"127.0.0.1:{0 if check_mode else VAK_PORT + i}", "--workspace", str(ws),
                     "--bus", bus, "--bus-replicas", "3", "--bus-replica", f"r{i + 1}",
                     "--bus-secret-file", str(secret)],
                    env={**env, "VAK_HOME": str(home)},
                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                )
                procs.append(p)
                url = listening_url(p, [], deadline)
                urls.append(url)
                print(f"serve-cluster: vak replica r{i + 1} listening on {url} (home {home})")
            print(f"serve-cluster: token {token} (every replica); Ctrl-C stops everything")
            if check_mode:
                check(urls, token)
                return
            while all(p.poll() is None for p in procs):
                time.sleep(1)
            fail("a process ended: " + ", ".join(str(p.args[0]) for p in procs if p.poll() is not None))
        except KeyboardInterrupt:
            pass
        finally:
            stop_all(procs)


if __name__ == "__main__":
    main()
