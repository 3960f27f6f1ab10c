// Starts `vak serve` on a free loopback port for a test and stops it again.
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const repo = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");

/** VAK_BIN, else $CARGO_TARGET_DIR/debug/vak, else <repo>/target/debug/vak (build it with `cargo build`). */
export function vakBin() {
  const bin = process.env.VAK_BIN || join(process.env.CARGO_TARGET_DIR || join(repo, "target"), "debug", "vak");
  if (!existsSync(bin)) {
    throw new Error(`no vak binary at ${bin}: run \`cargo build\` in ${repo} or set VAK_BIN`);
  }
  return bin;
}

/**
 * `startVak` with a fresh home and workspace in a temporary folder named
 * from `prefix` and a random token. Resolves to { vak, token, tmp, stop() };
 * `stop` stops the server and removes the folder.
 */
export async function startTempVak(prefix, args = []) {
  const tmp = mkdtempSync(join(tmpdir(), prefix));
  mkdirSync(join(tmp, "workspace"));
  const token = randomBytes(24).toString("hex");
  try {
    const vak = await startVak(["--home", join(tmp, "home"), "--workspace", join(tmp, "workspace"), "--token", token, ...args]);
    return {
      vak,
      token,
      tmp,
      async stop() {
        await vak.stop();
        rmSync(tmp, { recursive: true, force: true });
      },
    };
  } catch (e) {
    rmSync(tmp, { recursive: true, force: true });
    throw e;
  }
}

/**
 * Runs `vak serve --listen 127.0.0.1:0 ...args` and waits (at most
 * `timeoutMs`) for its "vak: listening on URL" line.
 * Resolves to { url, port, output(), stop() }.
 */
export function startVak(args, { timeoutMs = 20_000, env = {} } = {}) {
  const bin = vakBin();
  const child = spawn(bin, ["serve", "--listen", "127.0.0.1:0", ...args], {
    stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, RUST_LOG: process.env.RUST_LOG ?? "warn", ...env },
  });
  let out = "";
  child.stdout.setEncoding("utf8").on("data", (d) => (out += d));
  child.stderr.setEncoding("utf8").on("data", (d) => (out += d));
  const exited = new Promise((r) => child.once("exit", (code, signal) => r({ code, signal })));

  const stop = async () => {
    if (child.exitCode !== null || child.signalCode !== null) return exited;
    child.kill("SIGTERM");
    const t = setTimeout(() => child.kill("SIGKILL"), 10_000);
    const r = await exited;
    clearTimeout(t);
    return r;
  };

  return new Promise((resolveStart, reject) => {
    const timer = setTimeout(() => {
      void stop();
      reject(new Error(`vak did not print its URL within ${timeoutMs} ms; output:\n${out}`));
    }, timeoutMs);
    const onData = () => {
      const m = /vak: listening on (http:\/\/\S+)/.exec(out);
      if (!m) return;
      clearTimeout(timer);
      child.stdout.off("data", onData);
      const url = m[1];
      resolveStart({ url, port: Number(new URL(url).port), output: () => out, stop });
    };
    child.stdout.on("data", onData);
    void exited.then(({ code, signal }) => {
      clearTimeout(timer);
      reject(new Error(`vak exited (${code ?? signal}) before listening; output:\n${out}`));
    });
  });
}

/**
 * The repository's MCP test server over stdio (tests/mcp/server.py: tools echo,
 * add, fail, pid, wait, grow) as a `McpServer` definition. It needs a Python
 * with the official MCP SDK: VAK_MCP_PYTHON (`make mcp` installs one into
 * target/mcp-venv; `make test-web` sets it).
 */
export function mcpStdioServer() {
  const python = process.env.VAK_MCP_PYTHON;
  if (!python) {
    throw new Error(
      "VAK_MCP_PYTHON is not set: run `make mcp` at the repository root (it installs the MCP SDK into " +
        "target/mcp-venv), then VAK_MCP_PYTHON=$PWD/target/mcp-venv/bin/python (`make test-web` does both)",
    );
  }
  return { command: python, args: [join(repo, "tests", "mcp", "server.py"), "stdio"] };
}

/**
 * Runs `prompt` in session `sessionId` through `client` (the @vak/client
 * AgentClient) and answers the session's events on its gRPC-web stream up to
 * the run's `runFinished`, within `timeoutMs`. The run is sent once the
 * stream is live (its first frame, stream_opened), so nothing is missed.
 */
export async function runToEnd(client, sessionId, prompt, { timeoutMs = 20_000 } = {}) {
  const ac = new AbortController();
  const timer = setTimeout(() => ac.abort(), timeoutMs);
  const events = [];
  try {
    let admitted = false;
    for await (const ev of client.subscribe({ sessionId }, { signal: ac.signal })) {
      if (!admitted) {
        admitted = true;
        await client.run({ sessionId, prompt });
      }
      events.push(ev);
      if (ev.kind.case === "runFinished") return events;
    }
  } finally {
    clearTimeout(timer);
    ac.abort();
  }
  throw new Error(`the stream ended before the run did: ${events.map((e) => e.kind.case).join(", ")}`);
}
