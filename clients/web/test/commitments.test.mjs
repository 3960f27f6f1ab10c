// Commitments, the plan the model keeps, in the TypeScript client
// (docs/protocol.md section 38). Without a server: fromVakJson reads the
// REST/SSE JSON of a `commitment` event, a listing with its priorities and a
// plan_item presentation item, with their enums by JSON name. From Node
// against a live `vak serve` in the bypass mode (so `/bash` runs without an
// approval), over gRPC-web: the offline model's `/plan-items` streams
// `commitment` events and the plan is listed with its priorities; a fulfilled
// close without evidence is FailedPrecondition with the vak-error-reason
// `evidence_missing` and a message naming what is missing; with a successful
// `/bash` cited it closes; `abandoned` always closes, and a second close is
// `already_closed`. Run by `npm test`, after the build.
//
//   VAK_BIN   the vak binary (default: <repo>/target/debug/vak)
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { Code, ConnectError } from "@connectrpc/connect";
import {
  CommitmentChange,
  CommitmentListSchema,
  createAgentClient,
  enumJsonName,
  EventSchema,
  ItemKind,
  ItemStatus,
  OutputTimelineSchema,
  PlanStatus,
  PlanStatusSchema,
  RequirementKind,
  Stakes,
  Verdict,
  fromVakJson,
} from "../dist/index.js";
import { startTempVak } from "../harness/vak.mjs";

const fromVakJsonOf = (schema, obj) => fromVakJson(schema, JSON.stringify(obj));

const TESTS = { id: "tests", text: "run the tests", status: "pending", requires: [{ kind: "tool_ok", tool: "bash" }] };
const WIPE = { id: "wipe", text: "delete the build folder", status: "in_progress" };
const MISSING_BASH = "tool_ok: a cited `bash` call that ended successfully";

describe("fromVakJson reads the JSON of commitments", () => {
  const commitment = {
    id: "s1.tests",
    item: "tests",
    session_id: "s1",
    text: "run the tests",
    status: "in_progress",
    evidence: ["call_1"],
    requires: [{ kind: "tool_ok", tool: "bash", pattern: "^cargo test" }, { kind: "file_changed", path: "a/b.rs" }],
    stakes: "high",
    blocked_by: ["build"],
    created_at: "2026-12-05T09:58:29Z",
    updated_at: "2026-12-05T09:58:30Z",
    created_seq: 5,
    closed: { verdict: "abandoned", note: "kept the build", at: "2026-12-05T09:58:32Z" },
  };

  test("a commitment event", () => {
    const ev = fromVakJsonOf(EventSchema, { seq: 9, session_id: "s1", commitment: { change: "closed", commitment } });
    assert.equal(ev.kind.case, "commitment");
    const { change, commitment: c } = ev.kind.value;
    assert.equal(change, CommitmentChange.CLOSED);
    assert.deepEqual([c.id, c.status, c.stakes, c.evidence, c.blockedBy, c.createdSeq], ["s1.tests", PlanStatus.IN_PROGRESS, Stakes.HIGH, ["call_1"], ["build"], 5n]);
    assert.deepEqual(c.requires.map((r) => [r.kind, r.tool, r.pattern, r.path]), [
      [RequirementKind.TOOL_OK, "bash", "^cargo test", undefined],
      [RequirementKind.FILE_CHANGED, undefined, undefined, "a/b.rs"],
    ]);
    assert.deepEqual([c.closed?.verdict, c.closed?.note], [Verdict.ABANDONED, "kept the build"]);
    assert.equal(enumJsonName(PlanStatusSchema, c.status), "in_progress");
    // Open: no closed, no due.
    const open = fromVakJsonOf(EventSchema, { commitment: { change: "created", commitment: { ...commitment, closed: undefined } } });
    assert.deepEqual([open.kind.value.change, open.kind.value.commitment.closed, open.kind.value.commitment.due], [CommitmentChange.CREATED, undefined, undefined]);
  });

  test("a listing with its priorities, and a plan_item", () => {
    const list = fromVakJsonOf(CommitmentListSchema, {
      commitments: [commitment],
      priorities: [{ id: "s1.tests", score: 75, reasons: ["stakes: high (+30)", "due: overdue (+40)", "in progress (+5)"] }],
      workspace: "/w",
      a_newer_field: 1,
    });
    assert.deepEqual([list.commitments[0].stakes, list.priorities[0].score, list.priorities[0].reasons.length, list.workspace], [Stakes.HIGH, 75n, 3, "/w"]);
    const tl = fromVakJsonOf(OutputTimelineSchema, {
      seq: 9,
      items: [{ id: "plan-tests", kind: "plan_item", status: "cancelled", text: "run the tests", seq: 9, commitment }],
    });
    const [item] = tl.items;
    assert.deepEqual([item.kind, item.status, item.commitment?.id], [ItemKind.PLAN_ITEM, ItemStatus.CANCELLED, "s1.tests"]);
  });
});

describe("commitments against a live vak serve", () => {
  let served, client;

  before(async () => {
    served = await startTempVak("vak-commitments-", ["--allow-bypass", "--permission-mode", "bypass"]);
    client = createAgentClient({ baseUrl: served.vak.url, token: served.token, timeoutMs: 20_000 });
  });

  after(async () => {
    await served?.stop();
  });

  /** Runs `prompt` in a session; the session's events on its gRPC-web stream up to the run's end. */
  async function runToEnd(sessionId, prompt) {
    const ac = new AbortController();
    const timer = setTimeout(() => ac.abort(), 20_000);
    const events = [];
    try {
      const stream = client.subscribe({ sessionId }, { signal: ac.signal });
      let admitted = false;
      for await (const ev of stream) {
        // stream_opened first: the run is admitted once the stream is live, so nothing is missed.
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

  const refusedWith = (reason, words) => (err) =>
    err instanceof ConnectError && err.code === Code.FailedPrecondition && err.metadata.get("vak-error-reason") === reason && words.test(err.rawMessage);

  test("plan items are commitments: streamed, listed with their priorities, closed only with evidence", { timeout: 60_000 }, async () => {
    const { sessionId } = await client.createSession({});
    const got = await runToEnd(sessionId, `/plan-items ${JSON.stringify([TESTS, WIPE])}`);
    const changes = got.filter((e) => e.kind.case === "commitment").map((e) => [e.kind.value.change, e.kind.value.commitment.item]);
    assert.deepEqual(changes, [[CommitmentChange.CREATED, "tests"], [CommitmentChange.CREATED, "wipe"]]);

    const list = await client.listCommitments({});
    assert.deepEqual(list.commitments.map((c) => [c.id, c.status, c.stakes]), [
      [`${sessionId}.tests`, PlanStatus.PENDING, Stakes.MEDIUM],
      [`${sessionId}.wipe`, PlanStatus.IN_PROGRESS, Stakes.HIGH],
    ]);
    assert.deepEqual(list.priorities.map((p) => [p.id, p.score, p.reasons]), [
      [`${sessionId}.wipe`, 35n, ["stakes: high (+30)", "in progress (+5)"]],
      [`${sessionId}.tests`, 20n, ["stakes: medium (+20)"]],
    ]);
    assert.deepEqual((await client.getCommitment({ id: `${sessionId}.tests` })).missing, [MISSING_BASH]);

    // Nothing cited: refused, with the reason and the missing piece.
    await assert.rejects(
      client.closeCommitment({ id: `${sessionId}.tests`, verdict: Verdict.FULFILLED }),
      refusedWith("evidence_missing", /Missing: tool_ok: a cited `bash` call that ended successfully; it cites no tool call/),
    );
    // abandoned always closes; the first close stands.
    const wipe = await client.closeCommitment({ id: `${sessionId}.wipe`, verdict: Verdict.ABANDONED, note: "kept the build" });
    assert.deepEqual([wipe.closed?.verdict, wipe.closed?.note], [Verdict.ABANDONED, "kept the build"]);
    await assert.rejects(client.closeCommitment({ id: `${sessionId}.wipe`, verdict: Verdict.SUPERSEDED }), refusedWith("already_closed", /./));

    // A successful bash run cited: it closes.
    await runToEnd(sessionId, `/bash echo ok\n/plan-items ${JSON.stringify([{ id: "tests", status: "done", evidence: ["$last"] }])}`);
    const detail = await client.getCommitment({ id: `${sessionId}.tests` });
    assert.deepEqual([detail.missing, detail.commitment?.evidence.length], [[], 1]);
    const tests = await client.closeCommitment({ id: `${sessionId}.tests`, verdict: Verdict.FULFILLED });
    assert.deepEqual([tests.status, tests.closed?.verdict], [PlanStatus.DONE, Verdict.FULFILLED]);
    assert.deepEqual((await client.listCommitments({})).priorities, []);

    // The presentation shows each as a plan_item carrying the commitment: fulfilled completed, abandoned cancelled.
    const plan = (await client.getPresentation({ sessionId })).items.filter((i) => i.kind === ItemKind.PLAN_ITEM);
    assert.deepEqual(plan.map((i) => [i.id, i.status, i.commitment?.closed?.verdict]), [
      ["plan-tests", ItemStatus.COMPLETED, Verdict.FULFILLED],
      ["plan-wipe", ItemStatus.CANCELLED, Verdict.ABANDONED],
    ]);
  });

  test("bad ids are InvalidArgument, unknown ones NotFound", async () => {
    const { sessionId } = await client.createSession({});
    await assert.rejects(client.getCommitment({ id: "no-dot" }), (err) => err instanceof ConnectError && err.code === Code.InvalidArgument);
    await assert.rejects(client.getCommitment({ id: `${sessionId}.nosuch` }), (err) => err instanceof ConnectError && err.code === Code.NotFound);
    await assert.rejects(
      client.closeCommitment({ id: `${sessionId}.nosuch`, verdict: Verdict.UNSPECIFIED }),
      (err) => err instanceof ConnectError && [Code.InvalidArgument, Code.NotFound].includes(err.code),
    );
  });
});
