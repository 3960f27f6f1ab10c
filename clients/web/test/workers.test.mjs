// Workers, best-of-N, dev servers and the PR view in the TypeScript client
// (docs/protocol.md section 33). Without a server: fromVakJson reads the
// REST/SSE JSON of the new events (worker, workbench, draft_discarded,
// launch_output) and answers (a worker list, launch configs, the PR view) with
// their enums by JSON name. From Node against a live `vak serve` whose
// workspace is not a git repository and has a .vak/launch.toml: a fresh
// session has no workers and another's child is NotFound; the PR view says
// not_a_git_repo; the launch config is listed, started, logged and stopped.
// Run by `npm test`, after the build.
//
//   VAK_BIN   the vak binary (default: <repo>/target/debug/vak)
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Code, ConnectError } from "@connectrpc/connect";
import {
  createAgentClient,
  DiscardReason,
  enumJsonName,
  EventSchema,
  fromVakJson,
  LaunchSource,
  ListLaunchResponseSchema,
  ListWorkersResponseSchema,
  MergeMethod,
  OutputStream,
  PrReason,
  PrReasonSchema,
  PrViewSchema,
  WorkerKind,
  WorkerPhase,
  WorkerState,
  WorkerStateSchema,
} from "../dist/index.js";
import { startVak } from "../harness/vak.mjs";

const fromVakJsonOf = (schema, obj) => fromVakJson(schema, JSON.stringify(obj));

describe("fromVakJson reads the JSON of workers, candidates, dev servers and the PR view", () => {
  test("the worker, workbench, draft_discarded and launch_output events", () => {
    const w = fromVakJsonOf(EventSchema, {
      seq: 9,
      session_id: "p",
      worker: { phase: "finished", worker: { id: "c1", parent_id: "p", kind: "worker", state: "finished", summary: "done", diff_stat: { files: 2, insertions: 5, deletions: 1 } } },
    });
    assert.equal(w.kind.case, "worker");
    const ev = w.kind.value;
    assert.equal(ev.phase, WorkerPhase.FINISHED);
    assert.deepEqual([ev.worker.kind, ev.worker.state, ev.worker.summary], [WorkerKind.WORKER, WorkerState.FINISHED, "done"]);
    assert.deepEqual([ev.worker.diffStat.files, ev.worker.diffStat.insertions, ev.worker.diffStat.deletions], [2, 5, 1]);
    assert.equal(enumJsonName(WorkerStateSchema, ev.worker.state), "finished");

    const wb = fromVakJsonOf(EventSchema, { workbench: { bestofn_id: "bon_0123456789ab", candidate: { id: "c2", kind: "candidate", state: "running" } } });
    assert.equal(wb.kind.case, "workbench");
    assert.deepEqual([wb.kind.value.bestofnId, wb.kind.value.candidate.kind, wb.kind.value.candidate.state], ["bon_0123456789ab", WorkerKind.CANDIDATE, WorkerState.RUNNING]);

    const gone = fromVakJsonOf(EventSchema, { draft_discarded: { candidate: "c3", branch: "vak/p/c3", why: "kept_other" } });
    assert.deepEqual([gone.kind.case, gone.kind.value.why], ["draftDiscarded", DiscardReason.KEPT_OTHER]);

    const out = fromVakJsonOf(EventSchema, { launch_output: { name: "web", stream: "stderr", text: "ready\n" } });
    assert.deepEqual([out.kind.case, out.kind.value.name, out.kind.value.stream, out.kind.value.text], ["launchOutput", "web", OutputStream.STDERR, "ready\n"]);
  });

  test("a worker list, launch configs and the PR view", () => {
    const l = fromVakJsonOf(ListWorkersResponseSchema, { workers: [{ id: "c1", state: "cancelled", kind: "candidate", a_newer_field: 1 }] });
    assert.deepEqual([l.workers[0].state, l.workers[0].kind], [WorkerState.CANCELLED, WorkerKind.CANDIDATE]);

    const c = fromVakJsonOf(ListLaunchResponseSchema, {
      configs: [
        { name: "web", command: "npm run dev", source: "npm", env: { PORT: "3000" }, running: true, pid: 42 },
        { name: "api", source: "launch_toml", exit_code: 1 },
      ],
    });
    const [web, api] = c.configs;
    assert.deepEqual([web.source, web.env, web.running, web.pid, web.exitCode], [LaunchSource.NPM, { PORT: "3000" }, true, 42, undefined]);
    assert.deepEqual([api.source, api.exitCode], [LaunchSource.LAUNCH_TOML, 1]);

    const none = fromVakJsonOf(PrViewSchema, { reason: "gh_unavailable", message: "gh: not found" });
    assert.equal(none.reason, PrReason.GH_UNAVAILABLE);
    assert.equal(enumJsonName(PrReasonSchema, none.reason), "gh_unavailable");
    const pr = fromVakJsonOf(PrViewSchema, { number: 7, state: "OPEN", checks: { passing: 3, failing: 0, pending: 1 } });
    assert.deepEqual([pr.reason, pr.number, pr.checks.passing, pr.checks.pending], [PrReason.UNSPECIFIED, 7, 3, 1]);
    assert.equal(MergeMethod.SQUASH, 1);
  });
});

describe("workers, dev servers and the PR view against a live vak serve", () => {
  let tmp, vak, client;

  before(async () => {
    tmp = mkdtempSync(join(tmpdir(), "vak-workers-"));
    const ws = join(tmp, "workspace");
    mkdirSync(join(ws, ".vak"), { recursive: true });
    writeFileSync(
      join(ws, ".vak", "launch.toml"),
      '[[launch]]\nname = "echoer"\ncommand = "echo hello from echoer; sleep 30"\nenv = { GREETING = "hi" }\n',
    );
    // A gh on the server's PATH (one that fails if run), so the PR view gets
    // past gh_unavailable to the workspace's own state, wherever it runs.
    const bin = join(tmp, "bin");
    mkdirSync(bin);
    writeFileSync(join(bin, "gh"), "#!/bin/sh\necho 'fake gh: not for this test' >&2\nexit 1\n", { mode: 0o755 });
    const token = randomBytes(24).toString("hex");
    vak = await startVak(["--home", join(tmp, "home"), "--workspace", ws, "--token", token], { env: { PATH: `${bin}:${process.env.PATH ?? ""}` } });
    client = createAgentClient({ baseUrl: vak.url, token, timeoutMs: 20_000 });
  });

  after(async () => {
    await vak?.stop();
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  });

  const notFound = (err) => err instanceof ConnectError && err.code === Code.NotFound;

  test("a fresh session has no workers; a child not its own is NotFound", async () => {
    const { sessionId } = await client.createSession({});
    assert.deepEqual((await client.listWorkers({ sessionId })).workers, []);
    await assert.rejects(client.steerWorker({ sessionId, childId: "no-such-child", text: "go on" }), notFound);
    await assert.rejects(client.stopWorker({ sessionId, childId: "no-such-child" }), notFound);
    await assert.rejects(client.listWorkers({ sessionId: "no-such-session" }), notFound);
  });

  test("outside git the PR view says not_a_git_repo and best-of-N is refused", async () => {
    const { sessionId } = await client.createSession({});
    const pr = await client.getPr({ sessionId });
    assert.equal(pr.reason, PrReason.NOT_A_GIT_REPO);
    assert.equal(pr.number, 0);
    await assert.rejects(
      client.startBestOfN({ sessionId, prompt: "write a README", n: 2 }),
      (err) => err instanceof ConnectError && err.code === Code.InvalidArgument,
    );
  });

  test("a launch config is listed, started, logged and stopped", { timeout: 60_000 }, async () => {
    const { sessionId } = await client.createSession({});
    const { configs } = await client.listLaunch({ sessionId });
    assert.deepEqual(configs.map((c) => [c.name, c.source, c.running]), [["echoer", LaunchSource.LAUNCH_TOML, false]]);
    assert.deepEqual(configs[0].env, { GREETING: "hi" });
    const started = await client.startLaunch({ sessionId, name: "echoer" });
    assert.equal(started.name, "echoer");
    assert.ok(started.pid > 0);
    try {
      await assert.rejects(client.startLaunch({ sessionId, name: "echoer" }), (err) => err instanceof ConnectError && err.code === Code.FailedPrecondition);
      const end = Date.now() + 20_000;
      for (;;) {
        const logs = await client.getLaunchLogs({ sessionId, name: "echoer", tail: 10 });
        if (logs.lines.some((l) => l.stream === OutputStream.STDOUT && l.text.includes("hello from echoer"))) {
          assert.equal(logs.running, true);
          break;
        }
        assert.ok(Date.now() < end, `the output never reached the logs: ${JSON.stringify(logs.lines)}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    } finally {
      const stopped = await client.stopLaunch({ sessionId, name: "echoer" });
      assert.equal(stopped.wasRunning, true);
    }
    await assert.rejects(client.startLaunch({ sessionId, name: "no-such-server" }), notFound);
  });
});
