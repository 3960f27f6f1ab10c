#!/usr/bin/env python3
"""Runs schemathesis against a live `vak serve` (make test-api).

Starts the server on 127.0.0.1:0 with a temporary home and workspace, reads
its URL from the `listening on` line, runs `st run` on its /openapi.json
with the server's token, and stops the server. Exit code: schemathesis's.

Checks: every default check of schemathesis except positive_data_acceptance
(ST202, "a schema-valid request was rejected"): the document gives each
field's type, not every value rule the service enforces (a provider name
must be one it knows, a path must be inside the workspace), so such a
request gets the documented 400 with a reason. Every response must match
the document: status, content type, headers and schema, SSE events
included; and no 5xx.
"""

import os
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VAK = Path(os.environ.get("VAK_BIN", ROOT / "target" / "debug" / "vak"))
ST = Path(os.environ.get("VAK_SCHEMATHESIS", ROOT / "target" / "schemathesis-venv" / "bin" / "st"))
SEED = os.environ.get("VAK_SCHEMATHESIS_SEED", "20261201")
EXAMPLES = os.environ.get("VAK_SCHEMATHESIS_EXAMPLES", "30")


def main() -> int:
    for tool, how in ((VAK, "cargo build"), (ST, "make schemathesis")):
        if not tool.exists():
            print(f"test-api: {tool} is missing; run {how}", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="vak-api-") as tmp:
        home, ws = Path(tmp) / "home", Path(tmp) / "ws"
        ws.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VAK_", "OPENAI_", "ANTHROPIC_"))}
        env["VAK_HOME"] = str(home)
        server = subprocess.Popen(
            [str(VAK), "serve", "--listen", "127.0.0.1:0", "--workspace", str(ws)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        log: list[str] = []
        url = None
        assert server.stdout is not None
        for line in server.stdout:
            log.append(line)
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                url = m.group(1)
                break
        if url is None:
            print("test-api: the server ended before listening:\n" + "".join(log), file=sys.stderr)
            return 2
        # Keep draining the server's log so it never blocks on a full pipe.
        threading.Thread(target=lambda: log.extend(server.stdout), daemon=True).start()
        token = (home / "token").read_text().strip()
        try:
            st = subprocess.run(
                [
                    str(ST),
                    "--config-file",
                    str(Path(__file__).with_name("schemathesis.toml")),
                    "run",
                    f"{url}/openapi.json",
                    "--header",
                    f"Authorization: Bearer {token}",
                    "--exclude-checks",
                    "positive_data_acceptance",
                    "--max-examples",
                    EXAMPLES,
                    "--seed",
                    SEED,
                    "--no-color",
                ],
                cwd=tmp,
                stdin=subprocess.DEVNULL,
            )
        finally:
            server.terminate()
            server.wait(timeout=30)
        if st.returncode != 0:
            tail = "".join(log[-40:])
            print(f"test-api: schemathesis failed; the server's last log lines:\n{tail}", file=sys.stderr)
        return st.returncode


if __name__ == "__main__":
    sys.exit(main())
