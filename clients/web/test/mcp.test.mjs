// The MCP calls of the gRPC-web client, from Node against a live `vak serve`:
// putMcpConfig with the repository's MCP test server (tests/mcp/server.py,
// the official Python SDK, through VAK_MCP_PYTHON), getMcpConfig with its
// state and tools, what getMcpConfig answered put back as it is (the server
// keeps its process), a disabled and a failing server, InvalidArgument naming
// the field, and an MCP tool's approval with `always` storing a `tool` rule;
// fromVakJson reads the REST answer (enums inside a map's values) the same.
// Run by `npm test`, after the build.
//
//   VAK_BIN         the vak binary (default: <repo>/target/debug/vak)
//   VAK_MCP_PYTHON  a Python with the MCP SDK (`make mcp`)
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Code, ConnectError } from "@connectrpc/connect";
import {
  createAgentClient,
  enumJsonName,
  fromVakJson,
  McpConfigSchema,
  McpServerState,
  McpServerStateSchema,
  RuleKind,
} from "../dist/index.js";
import { mcpStdioServer, startVak } from "../harness/vak.mjs";

const TOOLS = ["mcp__demo__add", "mcp__demo__echo", "mcp__demo__fail", "mcp__demo__grow", "mcp__demo__pid", "mcp__demo__wait"];
let tmp, vak, client, token;

before(async () => {
  mcpStdioServer(); // fails at once, saying how, without the MCP SDK
  tmp = mkdtempSync(join(tmpdir(), "vak-mcp-"));
  mkdirSync(join(tmp, "workspace"));
  token = randomBytes(24).toString("hex");
  vak = await startVak(["--home", join(tmp, "home"), "--workspace", join(tmp, "workspace"), "--token", token]);
  // PutMcpConfig answers once the servers it started are ready or failed (at most 30 s).
  client = createAgentClient({ baseUrl: vak.url, token, timeoutMs: 40_000 });
});

after(async () => {
  await vak?.stop();
  if (tmp) rmSync(tmp, { recursive: true, force: true });
});

test("putMcpConfig starts a server, getMcpConfig lists it, and what it answered goes back as it is", { timeout: 90_000 }, async () => {
  assert.deepEqual((await client.getMcpConfig({})).servers, {});
  const put = await client.putMcpConfig({ servers: { demo: { ...mcpStdioServer(), timeoutMs: 30_000n } } });
  const demo = put.servers.demo;
  assert.equal(demo.state, McpServerState.READY, demo.lastError);
  assert.equal(enumJsonName(McpServerStateSchema, demo.state), "ready");
  assert.deepEqual([...demo.tools].sort(), TOOLS);
  assert.equal(demo.toolCount, TOOLS.length);
  assert.ok(demo.pid > 0 && demo.restarts === 0 && demo.lastError === undefined);
  assert.equal(demo.timeoutMs, 30_000n);
  const got = await client.getMcpConfig({});
  assert.deepEqual(got.servers, put.servers);
  // The REST answer, read with fromVakJson (its states are JSON names inside a map's values), is the same.
  const r = await fetch(`${vak.url}/config/mcp`, { headers: { authorization: `Bearer ${token}` } });
  const rest = await r.text();
  assert.match(rest, /"state":"ready"/);
  assert.deepEqual(fromVakJson(McpConfigSchema, rest).servers, got.servers);

  // Put back as got (output-only fields included), with a disabled and a failing server.
  const again = await client.putMcpConfig({
    servers: {
      ...got.servers,
      off: { url: "http://127.0.0.1:9/mcp", enabled: false },
      broken: { command: join(tmp, "no-such-program") },
    },
  });
  assert.deepEqual(Object.keys(again.servers).sort(), ["broken", "demo", "off"]);
  assert.equal(again.servers.demo.pid, demo.pid, "an unchanged server keeps its process");
  assert.equal(again.servers.off.state, McpServerState.DISABLED);
  assert.equal(again.servers.broken.state, McpServerState.FAILED);
  assert.match(again.servers.broken.lastError ?? "", /no-such-program/);

  await assert.rejects(
    client.putMcpConfig({ servers: { both: { command: "x", url: "http://127.0.0.1:9/mcp" } } }),
    (err) => err instanceof ConnectError && err.code === Code.InvalidArgument && err.rawMessage.startsWith("servers.both"),
  );
  assert.deepEqual(Object.keys((await client.putMcpConfig({ servers: { demo: got.servers.demo } })).servers), ["demo"]);
});

test("approving an MCP tool call with always stores a tool rule that covers its next calls", { timeout: 90_000 }, async () => {
  await client.putMcpConfig({ servers: { demo: mcpStdioServer() } });
  const { sessionId } = await client.createSession({});
  const run = async (text) => {
    const { latestSeq } = (await client.attachSession({ sessionId })).session;
    const stream = client.subscribe({ sessionId, after: latestSeq });
    await client.run({ sessionId, prompt: `/call mcp__demo__echo ${JSON.stringify({ text })}` });
    const seen = { asked: 0, answers: [], output: undefined };
    for await (const ev of stream) {
      if (ev.kind.case === "approvalRequested") {
        seen.asked++;
        assert.equal(ev.kind.value.tool, "mcp__demo__echo");
        assert.equal(ev.kind.value.reason, "run mcp__demo__echo");
        seen.answers.push(await client.approve({ sessionId, requestId: ev.kind.value.requestId, approve: true, always: true }));
      }
      if (ev.kind.case === "toolResult") seen.output = ev.kind.value.output;
      if (ev.kind.case === "runFinished") break;
    }
    return seen;
  };
  const first = await run("hi");
  assert.equal(first.asked, 1);
  assert.equal(first.output, "echo: hi");
  const { rule } = first.answers[0];
  assert.equal(first.answers[0].persisted, true);
  assert.deepEqual([rule?.tool, rule?.kind, rule?.pattern], ["mcp__demo__echo", RuleKind.TOOL, "mcp__demo__echo"]);
  const second = await run("again");
  assert.equal(second.asked, 0, "the tool rule covers it");
  assert.equal(second.output, "echo: again");
  await client.putMcpConfig({ servers: {} });
});
