// The Connect protocol (issue 33) from real clients against a live `vak serve`:
// connect-es in Node (@connectrpc/connect-node, JSON and binary, HTTP/1.1 and
// h2c) runs a prompt and follows Subscribe to run_finished; a cancelled stream
// frees its stream permit (--max-streams-per-client 1); this package's own
// createAgentClient({protocol: "connect"}); and `buf curl` with its default
// protocol, with and without --http2-prior-knowledge. Run by `npm test`, after
// the build.
//
//   VAK_BIN  the vak binary (default: <repo>/target/debug/vak)
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { setTimeout as delay } from "node:timers/promises";
import { fileURLToPath } from "node:url";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { compressionBrotli, compressionGzip, createConnectTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { createConnectTransport as createWebConnectTransport } from "@connectrpc/connect-web";
import { AdmissionState, AgentService, bearer, createAgentClient, MessageRole, RunOutcome } from "../dist/index.js";
import { startVak } from "../harness/vak.mjs";

const web = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const repo = resolve(web, "..", "..");
const BUF = join(web, "node_modules", ".bin", "buf");
const PROMPT = "hello world";
const REPLY = "echo: hello world"; // the offline model: `echo: <line>`, one text_delta per word

let tmp, vak, token;
/** HTTP/2 session managers to close at the end (an open h2c session keeps the process alive). */
const managers = [];

before(async () => {
  tmp = mkdtempSync(join(tmpdir(), "vak-connect-"));
  mkdirSync(join(tmp, "workspace"));
  token = randomBytes(24).toString("hex");
  vak = await startVak(["--home", join(tmp, "home"), "--workspace", join(tmp, "workspace"), "--token", token]);
});

after(async () => {
  for (const m of managers) m.abort();
  await vak?.stop();
  if (tmp) rmSync(tmp, { recursive: true, force: true });
});

/**
 * An interceptor that records each call's request and response content types,
 * so a test can tell that the call really went over Connect in the format it asked for.
 */
function recorder(seen) {
  return (next) => async (req) => {
    const res = await next(req);
    seen.push({ method: req.method.name, request: req.header.get("content-type"), response: res.header.get("content-type") });
    return res;
  };
}

/** A connect-node client for AgentService. */
function nodeClient({ httpVersion, binary, baseUrl = vak.url, seen = [] }) {
  const opts = {
    baseUrl,
    httpVersion,
    useBinaryFormat: binary,
    interceptors: [bearer(token), recorder(seen)],
    defaultTimeoutMs: 30_000,
  };
  if (httpVersion === "2") {
    const manager = new Http2SessionManager(baseUrl);
    managers.push(manager);
    opts.sessionManager = manager;
  }
  return createClient(AgentService, createConnectTransport(opts));
}

/**
 * Creates a session, opens Subscribe (live), runs `prompt` once the stream is
 * open, and follows the events to run_finished. The text deltas and the outcome.
 */
async function followRun(client, prompt = PROMPT) {
  const { sessionId } = await client.createSession({});
  assert.ok(sessionId, "CreateSession answers a session id");
  const abort = new AbortController();
  const events = client.subscribe({ sessionId }, { signal: abort.signal })[Symbol.asyncIterator]();
  try {
    const first = await events.next();
    assert.equal(first.done, false, "Subscribe ended without a frame");
    assert.equal(first.value.kind.case, "streamOpened");
    assert.equal(first.value.kind.value.sessionId, sessionId);
    const admission = await client.run({ sessionId, prompt });
    assert.equal(admission.state, AdmissionState.STARTED);
    let text = "";
    const kinds = [];
    for (;;) {
      const { done, value } = await events.next();
      assert.equal(done, false, `Subscribe ended before run_finished (after ${kinds.join(", ")})`);
      assert.equal(value.sessionId, sessionId);
      kinds.push(value.kind.case);
      if (value.kind.case === "textDelta") text += value.kind.value.text;
      if (value.kind.case === "runFinished") {
        return { sessionId, text, outcome: value.kind.value.outcome, kinds, requestId: admission.requestId };
      }
    }
  } finally {
    abort.abort();
  }
}

/** The assistant's text in a session's transcript. */
async function assistantText(client, sessionId) {
  const transcript = await client.getTranscript({ sessionId });
  assert.equal(transcript.sessionId, sessionId);
  assert.ok(transcript.seq > 0n, "the transcript's seq (a uint64) is read");
  return transcript.messages
    .filter((m) => m.role === MessageRole.ASSISTANT)
    .map((m) => m.text)
    .join("");
}

for (const httpVersion of ["1.1", "2"]) {
  for (const binary of [true, false]) {
    const name = `${binary ? "binary" : "JSON"} over HTTP/${httpVersion}${httpVersion === "2" ? " (h2c)" : ""}`;
    test(`connect-node, ${name}: a prompt's Subscribe events to run_finished`, { timeout: 60_000 }, async () => {
      const seen = [];
      const client = nodeClient({ httpVersion, binary, seen });
      const run = await followRun(client);
      assert.equal(run.text, REPLY);
      assert.equal(run.outcome, RunOutcome.COMPLETED);
      assert.ok(run.kinds.includes("userMessage") && run.kinds.includes("textDelta"), run.kinds.join(", "));
      assert.equal(await assistantText(client, run.sessionId), REPLY);

      // Every call went over Connect in the format asked for.
      const unary = binary ? "application/proto" : "application/json";
      const stream = binary ? "application/connect+proto" : "application/connect+json";
      const byMethod = Object.fromEntries(seen.map((s) => [s.method, s]));
      for (const m of ["CreateSession", "Run", "GetTranscript"]) {
        assert.deepEqual(byMethod[m], { method: m, request: unary, response: unary }, m);
      }
      assert.deepEqual(byMethod.Subscribe, { method: "Subscribe", request: stream, response: stream });
    });
  }
}

test("connect-node: an unknown session is NotFound, a wrong token Unauthenticated", { timeout: 30_000 }, async () => {
  for (const binary of [true, false]) {
    const client = nodeClient({ httpVersion: "1.1", binary });
    await assert.rejects(client.getTranscript({ sessionId: "0".repeat(32) }), (e) => {
      assert.equal(ConnectError.from(e).code, Code.NotFound, String(e));
      return true;
    });
    const events = client.subscribe({ sessionId: "0".repeat(32) });
    await assert.rejects(events[Symbol.asyncIterator]().next(), (e) => {
      assert.equal(ConnectError.from(e).code, Code.NotFound, String(e));
      return true;
    });
    for (const httpVersion of ["1.1", "2"]) {
      // Over HTTP/1.1 on the pooled connection the good calls use: the refusal must not
      // cost the answer or the connection (the guard reads the body it refuses).
      const opts = { baseUrl: vak.url, httpVersion, useBinaryFormat: binary, interceptors: [bearer("x".repeat(48))] };
      if (httpVersion === "2") {
        opts.sessionManager = new Http2SessionManager(vak.url);
        managers.push(opts.sessionManager);
      }
      const stranger = createClient(AgentService, createConnectTransport(opts));
      for (let i = 0; i < 5; i++) {
        await assert.rejects(stranger.createSession({}), (e) => {
          assert.equal(ConnectError.from(e).code, Code.Unauthenticated, String(e));
          return true;
        });
        await assert.rejects(stranger.subscribe({ sessionId: "0".repeat(32) })[Symbol.asyncIterator]().next(), (e) => {
          assert.equal(ConnectError.from(e).code, Code.Unauthenticated, String(e));
          return true;
        });
        assert.ok(await client.listSessions({}));
      }
    }
  }
});

test("Connect GET for side-effect-free RPCs, and gzip-compressed requests", { timeout: 60_000 }, async () => {
  const client = nodeClient({ httpVersion: "1.1", binary: true });
  const run = await followRun(client);
  for (const binary of [true, false]) {
    // connect-web with useHttpGet: GetTranscript and ListSessions are NO_SIDE_EFFECTS, so GET
    // (?connect=v1&encoding=...&message=...), the rest POST.
    const requests = [];
    const viaGet = createClient(
      AgentService,
      createWebConnectTransport({
        baseUrl: vak.url,
        useBinaryFormat: binary,
        useHttpGet: true,
        interceptors: [bearer(token)],
        fetch: (input, init) => {
          requests.push(`${init?.method ?? "GET"} ${new URL(String(input)).pathname}`);
          return fetch(input, init);
        },
      }),
    );
    assert.equal(await assistantText(viaGet, run.sessionId), REPLY);
    const { sessions } = await viaGet.listSessions({});
    assert.ok(sessions.some((s) => s.sessionId === run.sessionId));
    await assert.rejects(viaGet.getTranscript({ sessionId: "0".repeat(32) }), (e) => {
      assert.equal(ConnectError.from(e).code, Code.NotFound, String(e));
      return true;
    });
    await viaGet.createSession({});
    assert.deepEqual(requests, [
      "GET /vak.v1.AgentService/GetTranscript",
      "GET /vak.v1.AgentService/ListSessions",
      "GET /vak.v1.AgentService/GetTranscript",
      "POST /vak.v1.AgentService/CreateSession",
    ]);

    // connect-node gzips every request body (compressMinBytes 0); a server that ignored
    // Content-Encoding would fail to read them.
    const gzipped = createClient(
      AgentService,
      createConnectTransport({
        baseUrl: vak.url,
        httpVersion: "1.1",
        useBinaryFormat: binary,
        interceptors: [bearer(token)],
        sendCompression: compressionGzip,
        compressMinBytes: 0,
        acceptCompression: [compressionGzip],
      }),
    );
    const followed = await followRun(gzipped, "hello gzip");
    assert.equal(followed.outcome, RunOutcome.COMPLETED);
    assert.equal(followed.text, "echo: hello gzip");
    assert.equal(await assistantText(gzipped, followed.sessionId), "echo: hello gzip");
  }
});

test("connect-node over HTTP/1.1: a call refused before its body is read leaves the connection usable", { timeout: 60_000 }, async () => {
  // connect-node writes a request's body after its headers, on a pooled keep-alive connection.
  // The server must read what it refuses (a Content-Encoding it does not speak, a wrong
  // Connect-Protocol-Version) before answering, or the answer or the next call on that
  // connection fails with EPIPE.
  const { sessionId } = await nodeClient({ httpVersion: "1.1", binary: true }).createSession({});
  const base = { baseUrl: vak.url, httpVersion: "1.1", useBinaryFormat: true, compressMinBytes: 0 };
  const good = createClient(AgentService, createConnectTransport({ ...base, interceptors: [bearer(token)] }));
  const brotli = createClient(
    AgentService,
    createConnectTransport({ ...base, sendCompression: compressionBrotli, interceptors: [bearer(token)] }),
  );
  const version2 = (next) => async (req) => {
    req.header.set("connect-protocol-version", "2");
    return next(req);
  };
  const future = createClient(AgentService, createConnectTransport({ ...base, interceptors: [bearer(token), version2] }));
  const refusals = [
    [() => brotli.getTranscript({ sessionId }), Code.Unimplemented],
    [() => brotli.subscribe({ sessionId })[Symbol.asyncIterator]().next(), Code.Unimplemented],
    [() => future.getTranscript({ sessionId }), Code.InvalidArgument],
  ];
  for (let i = 0; i < 10; i++) {
    for (const [call, code] of refusals) {
      await assert.rejects(call(), (e) => {
        assert.equal(ConnectError.from(e).code, code, String(e));
        return true;
      });
      assert.equal((await good.getTranscript({ sessionId })).sessionId, sessionId);
    }
  }

  // A streaming content type for a unary RPC: 415, naming the types the RPC takes.
  const resp = await fetch(`${vak.url}/vak.v1.AgentService/ListSessions`, {
    method: "POST",
    headers: { authorization: `Bearer ${token}`, "content-type": "application/connect+json" },
    body: "",
  });
  assert.equal(resp.status, 415);
  assert.equal(resp.headers.get("accept-post"), "application/json, application/proto");
});

/**
 * Opens Subscribe on `sessionId` and reads its first frame, then closes it.
 * Rejects with the stream's error (ResourceExhausted past the stream cap).
 */
async function firstFrame(client, sessionId) {
  const abort = new AbortController();
  try {
    const { done, value } = await client.subscribe({ sessionId }, { signal: abort.signal })[Symbol.asyncIterator]().next();
    assert.equal(done, false, "Subscribe ended without a frame");
    return value;
  } finally {
    abort.abort();
  }
}

for (const httpVersion of ["1.1", "2"]) {
  test(`connect-node over HTTP/${httpVersion}: a cancelled Subscribe frees its stream permit`, { timeout: 60_000 }, async () => {
    const dir = join(tmp, `capped-${httpVersion}`);
    mkdirSync(join(dir, "workspace"), { recursive: true });
    const capped = await startVak([
      "--home", join(dir, "home"),
      "--workspace", join(dir, "workspace"),
      "--token", token,
      "--max-streams-per-client", "1",
    ]);
    try {
      const client = nodeClient({ httpVersion, binary: true, baseUrl: capped.url });
      const { sessionId } = await client.createSession({});

      // The one permit: a live Subscribe, open (its stream_opened read).
      const abort = new AbortController();
      const held = client.subscribe({ sessionId }, { signal: abort.signal })[Symbol.asyncIterator]();
      const opened = await held.next();
      assert.equal(opened.value?.kind.case, "streamOpened");

      // A second stream from the same client is refused while it is open...
      await assert.rejects(firstFrame(client, sessionId), (e) => {
        assert.equal(ConnectError.from(e).code, Code.ResourceExhausted, String(e));
        return true;
      });
      // ...and unary calls are not streams: they still work.
      assert.equal((await client.getTranscript({ sessionId })).sessionId, sessionId);

      // Cancel the first stream: the server must let its permit go.
      abort.abort();
      await assert.rejects(held.next(), (e) => {
        assert.equal(ConnectError.from(e).code, Code.Canceled, String(e));
        return true;
      });
      const deadline = Date.now() + 15_000;
      let refusals = 0;
      for (;;) {
        try {
          const frame = await firstFrame(client, sessionId);
          assert.equal(frame.kind.case, "streamOpened");
          break;
        } catch (e) {
          if (ConnectError.from(e).code !== Code.ResourceExhausted || Date.now() > deadline) {
            throw new Error(`no new stream after the cancel (${refusals} refusals): ${e}`);
          }
          refusals += 1;
          await delay(20);
        }
      }
    } finally {
      await capped.stop();
    }
  });
}

for (const json of [false, true]) {
  test(`createAgentClient({protocol: "connect"${json ? ", json: true" : ""}}): unary calls and a server stream`, { timeout: 60_000 }, async () => {
    const types = [];
    const recordingFetch = (input, init) => {
      types.push(new Headers(init?.headers).get("content-type"));
      return fetch(input, init);
    };
    const client = createAgentClient({ baseUrl: vak.url + "/", token, protocol: "connect", json, timeoutMs: 30_000, fetch: recordingFetch });
    const run = await followRun(client);
    assert.equal(run.text, REPLY);
    assert.equal(run.outcome, RunOutcome.COMPLETED);
    assert.equal(await assistantText(client, run.sessionId), REPLY);
    const { sessions } = await client.listSessions({});
    assert.ok(sessions.some((s) => s.sessionId === run.sessionId), "ListSessions lists the session");
    await assert.rejects(client.getTranscript({ sessionId: "0".repeat(32) }), (e) => {
      assert.equal(ConnectError.from(e).code, Code.NotFound, String(e));
      return true;
    });

    // The calls were Connect (not gRPC-web), in the format asked for.
    const unary = json ? "application/json" : "application/proto";
    const stream = json ? "application/connect+json" : "application/connect+proto";
    assert.ok(types.length >= 6, types.join(", "));
    assert.deepEqual([...new Set(types)].sort(), [unary, stream].sort());

    // Without `protocol` the client stays gRPC-web (what /app uses); json needs Connect.
    const grpcWebTypes = [];
    const grpcWeb = createAgentClient({
      baseUrl: vak.url,
      token,
      fetch: (input, init) => {
        grpcWebTypes.push(new Headers(init?.headers).get("content-type"));
        return fetch(input, init);
      },
    });
    assert.equal((await grpcWeb.getTranscript({ sessionId: run.sessionId })).sessionId, run.sessionId);
    assert.deepEqual(grpcWebTypes, ["application/grpc-web+proto"]);
    assert.throws(() => createAgentClient({ baseUrl: vak.url, token, json: true }), /protocol: "connect"/);
    assert.throws(() => createAgentClient({ baseUrl: vak.url, token, protocol: "grpc" }), /unknown protocol/);
  });
}

/**
 * Runs `buf curl` with its default protocol (Connect); resolves to
 * { code, stdout, stderr } (code: the exit code, the gRPC code << 3 for an RPC error).
 */
function bufCurl(args, { ms = 60_000 } = {}) {
  return new Promise((resolveRun, reject) => {
    const child = spawn(BUF, ["curl", ...args], { stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.setEncoding("utf8").on("data", (d) => (stdout += d));
    child.stderr.setEncoding("utf8").on("data", (d) => (stderr += d));
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`buf curl timed out after ${ms} ms: ${args.join(" ")}\n${stdout}\n${stderr}`));
    }, ms);
    child.once("error", (e) => {
      clearTimeout(timer);
      reject(e);
    });
    child.once("exit", (code, signal) => {
      clearTimeout(timer);
      resolveRun({ code: code ?? signal, stdout, stderr });
    });
  });
}

/** The complete top-level JSON values in `text` (buf curl prints one per message). */
function jsonValues(text) {
  const out = [];
  let depth = 0;
  let start = -1;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (inString) {
      if (c === "\\") i++;
      else if (c === '"') inString = false;
    } else if (c === '"') {
      inString = true;
    } else if (c === "{" || c === "[") {
      if (depth++ === 0) start = i;
    } else if (c === "}" || c === "]") {
      if (--depth === 0) out.push(JSON.parse(text.slice(start, i + 1)));
    }
  }
  return out;
}

/** One unary buf curl call; its answer parsed, or an assertion error with buf's output. */
async function bufUnary(common, method, data) {
  const r = await bufCurl([...common, "-d", JSON.stringify(data), `${vak.url}/vak.v1.AgentService/${method}`]);
  assert.equal(r.code, 0, `buf curl ${method} (${common.join(" ")}) exited ${r.code}:\n${r.stdout}\n${r.stderr}`);
  return JSON.parse(r.stdout);
}

/**
 * Runs `buf curl ... Subscribe` on `sessionId` until its output shows
 * run_finished (then stops it), calling `whenOpen` once stream_opened is out.
 * Resolves to the events, once `whenOpen` has resolved too.
 */
function bufSubscribe(common, sessionId, whenOpen, { ms = 60_000 } = {}) {
  return new Promise((resolveEvents, reject) => {
    const url = `${vak.url}/vak.v1.AgentService/Subscribe`;
    const child = spawn(BUF, ["curl", ...common, "-d", JSON.stringify({ sessionId }), url], {
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    let opening; // whenOpen's promise, once stream_opened is out
    let settled = false;
    const finish = (err, events) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGTERM");
      if (err) reject(err);
      else resolveEvents(events);
    };
    const timer = setTimeout(
      () => finish(new Error(`buf curl Subscribe saw no run_finished within ${ms} ms:\n${stdout}\n${stderr}`)),
      ms,
    );
    child.stderr.setEncoding("utf8").on("data", (d) => (stderr += d));
    child.stdout.setEncoding("utf8").on("data", (d) => {
      stdout += d;
      const events = jsonValues(stdout);
      if (!opening && events.some((e) => e.streamOpened)) {
        opening = whenOpen();
        opening.catch((e) => finish(e));
      }
      // Done at run_finished, once whenOpen is done too (its `buf curl` may exit after the run ends).
      if (opening && events.some((e) => e.runFinished)) opening.then(() => finish(null, events), finish);
    });
    child.once("error", (e) => finish(e));
    child.once("exit", (code, signal) =>
      finish(new Error(`buf curl Subscribe exited (${code ?? signal}) before run_finished:\n${stdout}\n${stderr}`)),
    );
  });
}

for (const h2 of [false, true]) {
  // Reflection is a bidi stream, so it needs HTTP/2: over HTTP/1.1 the schema comes from proto/.
  const schema = h2 ? ["--reflect-header", "*"] : ["--schema", join(repo, "proto")];
  const how = h2 ? "--http2-prior-knowledge, schema by reflection" : "HTTP/1.1, --schema proto";
  test(`buf curl (default protocol, ${how}): unary calls and Subscribe to run_finished`, { timeout: 120_000 }, async () => {
    const common = [...(h2 ? ["--http2-prior-knowledge"] : []), ...schema, "-H", `Authorization: Bearer ${token}`];
    const { sessionId } = await bufUnary(common, "CreateSession", {});
    assert.ok(sessionId, "CreateSession answers a session id");

    let admission;
    const events = await bufSubscribe(common, sessionId, async () => {
      admission = await bufUnary(common, "Run", { sessionId, prompt: PROMPT });
    });
    assert.equal(admission?.state, "ADMISSION_STATE_STARTED");
    assert.equal(events[0].streamOpened?.sessionId, sessionId);
    const text = events
      .filter((e) => e.textDelta)
      .map((e) => e.textDelta.text)
      .join("");
    assert.equal(text, REPLY);
    const finished = events.find((e) => e.runFinished);
    assert.equal(finished.runFinished.outcome, "RUN_OUTCOME_COMPLETED");
    assert.equal(typeof finished.seq, "string", "64-bit seq is a JSON string");

    // A side-effect-free unary call reads the run back.
    const transcript = await bufUnary(common, "GetTranscript", { sessionId });
    const assistant = transcript.messages.filter((m) => m.role === "MESSAGE_ROLE_ASSISTANT").map((m) => m.text);
    assert.equal(assistant.join(""), REPLY);

    // An RPC error: buf curl exits with the code << 3 (NotFound = 5).
    const missing = await bufCurl([...common, "-d", JSON.stringify({ sessionId: "0".repeat(32) }), `${vak.url}/vak.v1.AgentService/GetTranscript`]);
    assert.equal(missing.code, Code.NotFound << 3, `${missing.stdout}\n${missing.stderr}`);
    assert.match(missing.stdout + missing.stderr, /not_found/);
  });
}
