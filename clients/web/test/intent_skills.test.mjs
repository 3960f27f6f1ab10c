// Intent and learned skills in the TypeScript client (docs/protocol.md
// sections 39 and 41). Without a server: fromVakJson reads the REST JSON of
// an explanation and a proposal, with their enums by JSON name. From Node
// against a live `vak serve` in the bypass mode (so `/bash` and a script
// skill run without an approval), over gRPC-web: "delete the build folder"
// reads as a high-stakes change planned first, with approvals, and what the
// caller knows wins over the words; the policy is the defaults; a `/bash`
// sequence completed twice makes one proposal, which promoted is a skill
// listed by ListSkills that a run calls as `skill__<name>`; promoting it
// again is FailedPrecondition with the vak-error-reason `proposal_settled`;
// a proposal asked for from a range of a session's messages is rejected
// once. Run by `npm test`, after the build.
//
//   VAK_BIN   the vak binary (default: <repo>/target/debug/vak)
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { Code, ConnectError } from "@connectrpc/connect";
import {
  Act,
  createAgentClient,
  fromVakJson,
  Horizon,
  IntentExplanationSchema,
  IntentSurface,
  PermissionMode,
  PolicySource,
  ProposalState,
  RequirementKind,
  RunOutcome,
  SkillKind,
  SkillProposalSchema,
  SkillScope,
  Stakes,
} from "../dist/index.js";
import { runToEnd as runEvents, startTempVak } from "../harness/vak.mjs";

const fromVakJsonOf = (schema, obj) => fromVakJson(schema, JSON.stringify(obj));

describe("fromVakJson reads the JSON of intent and skills", () => {
  test("an explanation", () => {
    const ex = fromVakJsonOf(IntentExplanationSchema, {
      surface: "term",
      reading: {
        act: "change",
        horizon: "now",
        stakes: "high",
        evidence: ["file_changed", "approval"],
        signals: [{ field: "act", value: "change", because: 'word "delete"' }],
      },
      engagement: { mode: "plan", tools: ["bash"], approvals: ["bash"], route: "offline/offline", plan_first: true, read_only: false },
      baseline_diff: { mode: "plan", tools_withheld: [], approvals_added: ["bash"], plan_first: true },
    });
    assert.deepEqual([ex.surface, ex.reading?.act, ex.reading?.stakes], [IntentSurface.TERM, Act.CHANGE, Stakes.HIGH]);
    assert.deepEqual(ex.reading?.evidence, [RequirementKind.FILE_CHANGED, RequirementKind.APPROVAL]);
    assert.deepEqual([ex.engagement?.mode, ex.engagement?.planFirst, ex.baselineDiff?.mode], [PermissionMode.PLAN, true, PermissionMode.PLAN]);
    // Bypass: no mode in the diff.
    assert.equal(fromVakJsonOf(IntentExplanationSchema, { baseline_diff: { plan_first: false } }).baselineDiff?.mode, undefined);
  });

  test("a proposal", () => {
    const p = fromVakJsonOf(SkillProposalSchema, {
      id: "sp_80fbd9658b7f",
      name: "echo-one",
      body: "echo one\necho two",
      kind: "script",
      source: { session: "s1", seqs: [2, 4, 7] },
      duplicate_of: "echo",
      tags: ["duplicate-of:echo"],
      state: "pending",
    });
    assert.deepEqual([p.kind, p.state, p.duplicateOf, p.source?.seqs], [SkillKind.SCRIPT, ProposalState.PENDING, "echo", [2n, 4n, 7n]]);
  });
});

describe("intent and skills against a live vak serve", () => {
  let served, client;

  before(async () => {
    served = await startTempVak("vak-intent-skills-", ["--allow-bypass", "--permission-mode", "bypass"]);
    client = createAgentClient({ baseUrl: served.vak.url, token: served.token, timeoutMs: 20_000 });
  });

  after(async () => {
    await served?.stop();
  });

  /** Runs `prompt` in a new session; the session's events on its gRPC-web stream up to the run's end (it must complete). */
  async function runToEnd(prompt) {
    const { sessionId } = await client.createSession({});
    const events = await runEvents(client, sessionId, prompt);
    const end = events.at(-1).kind.value;
    assert.equal(end.outcome, RunOutcome.COMPLETED, `the run of ${JSON.stringify(prompt)} did not complete`);
    return { sessionId, events };
  }

  /** The proposal of `body`, made on a thread of the server's own shortly after a run finishes: polled for at most 20 s. */
  async function proposalOf(body) {
    const deadline = Date.now() + 20_000;
    for (;;) {
      const found = (await client.listSkillProposals({})).proposals.filter((p) => p.body === body);
      if (found.length) {
        assert.equal(found.length, 1, `one proposal of ${JSON.stringify(body)}`);
        return found[0];
      }
      if (Date.now() > deadline) throw new Error(`no proposal with body ${JSON.stringify(body)} within 20 s`);
      await sleep(50);
    }
  }

  const settled = (err) => err instanceof ConnectError && err.code === Code.FailedPrecondition && err.metadata.get("vak-error-reason") === "proposal_settled";

  test("ExplainIntent reads a prompt without running it", async () => {
    const sessions = (await client.listSessions({})).sessions.length;
    const ex = await client.explainIntent({ prompt: "delete the build folder" });
    const { reading, engagement, baselineDiff } = ex;
    assert.deepEqual([ex.surface, reading?.act, reading?.horizon, reading?.stakes], [IntentSurface.API, Act.CHANGE, Horizon.NOW, Stakes.HIGH]);
    assert.deepEqual(reading?.evidence, [RequirementKind.FILE_CHANGED, RequirementKind.APPROVAL]);
    assert.ok(reading?.signals.some((s) => s.field === "act" && s.value === "change" && s.because === 'word "delete"'));
    // A high-stakes change is planned first: the plan and every tool that changes something ask a person.
    assert.deepEqual([engagement?.mode, engagement?.planFirst, engagement?.readOnly], [PermissionMode.PLAN, true, false]);
    for (const tool of ["exit_plan_mode", "write_file", "edit_file", "bash"]) assert.ok(engagement?.approvals.includes(tool), tool);
    assert.deepEqual([baselineDiff?.mode, baselineDiff?.approvalsAdded, baselineDiff?.planFirst], [PermissionMode.PLAN, engagement?.approvals, true]);

    // What the caller knows wins over the words: asked as a question, with no evidence (present and empty), it only reads.
    const asked = await client.explainIntent({ prompt: "delete the build folder", act: Act.ASK, evidence: { kinds: [] } });
    assert.deepEqual([asked.reading?.act, asked.reading?.evidence, asked.engagement?.readOnly, asked.engagement?.approvals], [Act.ASK, [], true, []]);
    assert.ok(asked.baselineDiff?.toolsWithheld.includes("bash"));
    const task = await client.explainIntent({ prompt: "run the tests", surface: IntentSurface.TASK });
    assert.deepEqual([task.reading?.act, task.reading?.horizon], [Act.RUN, Horizon.SCHEDULED]);
    // Nothing was run or written.
    assert.equal((await client.listSessions({})).sessions.length, sessions);
  });

  test("GetIntentPolicy is the defaults", async () => {
    const p = await client.getIntentPolicy({});
    assert.deepEqual([p.intent?.highStakesMode, p.intent?.readOnlyActs, p.intent?.planFirstAt], [PermissionMode.DEFAULT, [Act.ASK, Act.REVIEW, Act.PLAN], Stakes.HIGH]);
    assert.equal(p.commitment?.requireEvidence, true);
    assert.deepEqual(
      p.sources.map((s) => [s.key, s.source]),
      ["intent.high_stakes_mode", "intent.read_only_acts", "intent.plan_first_at", "commitment.require_evidence"].map((k) => [k, PolicySource.DEFAULT]),
    );
  });

  test("a repeated tool sequence becomes a skill a run can call", { timeout: 60_000 }, async () => {
    const body = "echo web-one\necho web-two";
    const prompt = "/bash echo web-one\n/bash echo web-two";
    await runToEnd(prompt);
    const { sessionId: second } = await runToEnd(prompt);

    const p = await proposalOf(body);
    assert.deepEqual([p.kind, p.state, p.source?.session, p.duplicateOf, p.tags], [SkillKind.SCRIPT, ProposalState.PENDING, second, undefined, []]);
    const skill = await client.promoteSkillProposal({ id: p.id });
    assert.deepEqual([skill.name, skill.kind, skill.scope, skill.body], [p.name, SkillKind.SCRIPT, SkillScope.WORKSPACE, body]);
    assert.match(readFileSync(skill.path, "utf8"), new RegExp(`^---\\nname: ${p.name}\\n[^]*echo web-two`));
    assert.ok((await client.listSkills({})).skills.some((s) => s.name === p.name && s.body === body));

    // A run calls it as a tool: its body runs as one bash call.
    const { events } = await runToEnd(`/call skill__${p.name} {}`);
    const results = events.filter((e) => e.kind.case === "toolResult").map((e) => [e.kind.value.ok, e.kind.value.output]);
    assert.deepEqual(results, [[true, "web-one\nweb-two\n"]]);

    await assert.rejects(client.promoteSkillProposal({ id: p.id }), settled);
    assert.deepEqual((await client.listSkillProposals({})).proposals.filter((q) => q.id === p.id).map((q) => q.state), [ProposalState.PROMOTED]);
  });

  test("a proposal asked for from a range is rejected once", { timeout: 60_000 }, async () => {
    const { sessionId, events } = await runToEnd("/bash echo web-first\n/bash echo web-second");
    const firstCall = events.find((e) => e.kind.case === "toolCall").seq;
    const p = await client.createSkillProposal({ fromSession: sessionId, seqRange: { from: 1n, to: firstCall }, name: "web-first" });
    assert.deepEqual([p.name, p.body, p.kind, p.state, p.source?.session], ["web-first", "echo web-first", SkillKind.SCRIPT, ProposalState.PENDING, sessionId]);

    assert.equal((await client.rejectSkillProposal({ id: p.id })).state, ProposalState.REJECTED);
    await assert.rejects(client.rejectSkillProposal({ id: p.id }), settled);
    await assert.rejects(client.promoteSkillProposal({ id: p.id }), settled);
    assert.ok(!(await client.listSkills({})).skills.some((s) => s.name === "web-first"));
    await assert.rejects(client.createSkillProposal({ fromSession: "0".repeat(32) }), (err) => err instanceof ConnectError && err.code === Code.NotFound);
  });
});
