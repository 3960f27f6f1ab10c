// The permission calls of the gRPC-web client, from Node against a live
// `vak serve`: setMode, approve with `always` (the stored rule and
// `persisted`), listRules, deleteRule (NotFound for an unknown id), and
// approve with `mode` on a plan. Run by `npm test`, after the build.
//
//   VAK_BIN  the vak binary (default: <repo>/target/debug/vak)
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Code, ConnectError } from "@connectrpc/connect";
import {
  ApprovalOutcome,
  createAgentClient,
  PermissionMode,
  PlanExitMode,
  RuleKind,
} from "../dist/index.js";
import { startVak } from "../harness/vak.mjs";

let tmp, vak, client;

before(async () => {
  tmp = mkdtempSync(join(tmpdir(), "vak-rules-"));
  mkdirSync(join(tmp, "workspace"));
  const token = randomBytes(24).toString("hex");
  vak = await startVak(["--home", join(tmp, "home"), "--workspace", join(tmp, "workspace"), "--token", token]);
  client = createAgentClient({ baseUrl: vak.url, token, timeoutMs: 20_000 });
});

after(async () => {
  await vak?.stop();
  if (tmp) rmSync(tmp, { recursive: true, force: true });
});

/**
 * Runs `prompt` in a new session to its run_finished, answering each
 * approval with `answer(approvalRequested)`; the events and the answers.
 */
async function runAnswering(prompt, answer) {
  const { sessionId } = await client.createSession({});
  const events = [];
  const answers = [];
  const stream = client.subscribe({ sessionId, after: 0n });
  await client.run({ sessionId, prompt });
  for await (const ev of stream) {
    events.push(ev);
    if (ev.kind.case === "approvalRequested") {
      const a = ev.kind.value;
      answers.push(await client.approve({ sessionId, requestId: a.requestId, ...answer(a) }));
    }
    if (ev.kind.case === "runFinished") break;
  }
  return { events, answers, asked: events.filter((e) => e.kind.case === "approvalRequested").length };
}

test("approve with always stores a rule that later calls use; listRules and deleteRule manage it", { timeout: 60_000 }, async () => {
  // A prefix rule covers the program with plain words after it (an option would make it exact).
  const first = await runAnswering("/bash ls", () => ({ approve: true, always: true }));
  assert.equal(first.answers.length, 1);
  const [answer] = first.answers;
  // gRPC-web carries the enums (their JSON names, "approved" and "prefix", are what REST shows).
  assert.equal(answer.outcome, ApprovalOutcome.APPROVED);
  assert.equal(answer.persisted, true);
  assert.equal(answer.rule?.tool, "bash");
  assert.equal(answer.rule?.kind, RuleKind.PREFIX);
  assert.equal(answer.rule?.pattern, "ls");

  const listed = await client.listRules({});
  assert.equal(listed.maxRules, 256);
  assert.deepEqual(
    listed.rules.map((r) => r.id),
    [answer.rule.id],
  );

  const covered = await runAnswering("/bash ls plain", () => ({ approve: false }));
  assert.equal(covered.asked, 0, "a covered call asks nobody");

  const gone = await client.deleteRule({ id: answer.rule.id });
  assert.equal(gone.rule?.id, answer.rule.id);
  await assert.rejects(
    client.deleteRule({ id: answer.rule.id }),
    (err) => err instanceof ConnectError && err.code === Code.NotFound,
  );
  assert.equal((await client.listRules({})).rules.length, 0);
  const asks = await runAnswering("/bash ls plain", () => ({ approve: false }));
  assert.equal(asks.asked, 1, "deleted: it asks again");
});

test("setMode switches the mode, and a plan's approval chooses the next one", { timeout: 60_000 }, async () => {
  const changed = await client.setMode({ mode: PermissionMode.PLAN });
  assert.equal(changed.changed, true);
  assert.equal(changed.config?.permissionMode, PermissionMode.PLAN);
  await assert.rejects(
    client.setMode({ mode: 99 }), // no mode has that number
    (err) => err instanceof ConnectError && err.code === Code.InvalidArgument,
  );
  const ran = await runAnswering("/plan 1. nothing", (a) => {
    assert.equal(a.tool, "exit_plan_mode");
    return { approve: true, mode: PlanExitMode.ACCEPT_EDITS };
  });
  assert.equal(ran.answers[0].outcome, ApprovalOutcome.APPROVED);
  assert.equal(ran.answers[0].persisted, false);
  assert.equal((await client.getConfig({})).permissionMode, PermissionMode.ACCEPT_EDITS);
  assert.equal((await client.setMode({ mode: PermissionMode.DEFAULT })).changed, true);
});
