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
// `already_closed`. In /app (Debian's chromium, headless, via playwright-core),
// the goal of a turn chain (section 40) above the plan in the Plan panel: a
// prompt sets the objective, steering while it runs adds to it and corrects
// the last addition (struck through as superseded), the control badge reads
// `running`, then `done` once the chain ended, also after a reload. Run by
// `npm test`, after the build (`make app` then `cargo build`: the app is
// embedded in the binary).
//
//   VAK_BIN      the vak binary (default: <repo>/target/debug/vak)
//   CHROMIUM_BIN the browser (default: /usr/bin/chromium)
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
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
import { axeProblems, launchChromium, screenshot, stepper, within } from "../harness/steps.mjs";
import { runToEnd as runEvents, startTempVak } from "../harness/vak.mjs";

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

  const runToEnd = (sessionId, prompt) => runEvents(client, sessionId, prompt);

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

describe("the goal in /app's Plan panel", () => {
  const CHROMIUM = process.env.CHROMIUM_BIN || "/usr/bin/chromium";
  // Screenshots, and the page state of a failed step (browser.test.mjs empties artifacts/ when it runs).
  const artifacts = join(dirname(fileURLToPath(import.meta.url)), "..", "artifacts", "goal");
  // The first leg waits for the approval of its bash call (the default mode asks), so the
  // steering below lands while the chain is live however slow the machine is (an input while
  // the session is idle would start a new chain with a new goal); the test approves it later.
  const OBJECTIVE = "/bash echo held\nmain task";
  // Read by section 40's rules: `add` (starts with "also"), `add`, then `correct` (starts with
  // "no"), which supersedes the latest revision: the last addition. Each keeps its text as sent.
  const README = "also add a README";
  const TESTS_TOO = "also write tests";
  const CORRECTION = "no, write docs instead";
  let served, ctx, page;
  const problems = [];
  const step = stepper({
    dir: artifacts,
    prefix: "goal-",
    context: () => ctx,
    state: (p) => p.evaluate(() => JSON.stringify(window.vakApp?.state ?? null, (_, v) => (typeof v === "bigint" ? String(v) : v instanceof Map ? Object.fromEntries(v) : v instanceof Set ? [...v] : v), 1)),
  });

  before(
    async () => {
      if (!existsSync(CHROMIUM)) throw new Error(`no browser at ${CHROMIUM}: apt-get install -y chromium`);
      mkdirSync(artifacts, { recursive: true });
      served = await startTempVak("vak-goal-");
      ctx = await launchChromium(CHROMIUM, join(served.tmp, "profile"), { viewport: { width: 1280, height: 900 } });
      page = await within(10_000, ctx.newPage(), "a new tab");
      page.setDefaultTimeout(15_000);
      page.on("console", (m) => m.type() === "error" && problems.push(`console error: ${m.text()}`));
      page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
    },
    { timeout: 90_000 },
  );

  after(async () => {
    await within(15_000, ctx?.close() ?? Promise.resolve(), "closing chromium").catch(() => {});
    await served?.stop();
  });

  /** Types `text` into the composer and sends it with Enter (while the run is live, Enter steers). */
  async function send(text) {
    await page.fill("#prompt", text);
    await page.press("#prompt", "Enter");
  }

  /** The goal section as the page shows it (textContent, so the objective's newline is kept). */
  const shown = () =>
    page.evaluate(() => {
      const texts = (sel) => [...document.querySelectorAll(sel)].map((li) => li.textContent);
      return {
        objective: document.querySelector("#goal-objective")?.textContent,
        additions: texts("#goal-additions li"),
        superseded: texts("#goal-superseded li s"),
        control: document.querySelector("#goal-control")?.textContent,
      };
    });

  /** Waits (at most `ms`) until the goal's control badge reads `control` with the revisions section 40 gives. */
  async function goalShows(control, ms) {
    await page
      .waitForFunction(
        ([control, objective, additions, superseded]) => {
          const texts = (sel) => JSON.stringify([...document.querySelectorAll(sel)].map((li) => li.textContent));
          return (
            document.querySelector("#goal-control")?.textContent === control &&
            document.querySelector("#goal-objective")?.textContent === objective &&
            texts("#goal-additions li") === JSON.stringify(additions) &&
            texts("#goal-superseded li s") === JSON.stringify(superseded)
          );
        },
        [control, OBJECTIVE, [README, CORRECTION], [TESTS_TOO]],
        { timeout: ms },
      )
      .catch(async (err) => {
        throw new Error(`the goal did not show as ${control} within ${ms} ms; the page shows ${JSON.stringify(await shown())}: ${err.message}`);
      });
  }

  step("steering while a prompt runs shows in the goal above the plan: running, then done", async () => {
    await page.goto(`${served.vak.url}/app`);
    await page.fill("#token", served.token);
    await page.click("#login button[type=submit]");
    await page.click("#new-session");
    await page.waitForFunction(() => location.pathname.startsWith("/app/s/"), null, { timeout: 10_000 });
    // A session without a prompt has no goal.
    await page.click("#show-plan");
    await page.waitForFunction(() => document.querySelector("#plan")?.textContent?.startsWith("No plan in this session yet"), null, { timeout: 5_000 });
    assert.equal(await page.locator("#goal").count(), 0);

    await send(OBJECTIVE);
    // The run waits for its approval: from then on the composer steers.
    const approve = page.locator("#timeline .item.approval[data-status=pending] button.approve");
    await approve.waitFor();
    for (const text of [README, TESTS_TOO, CORRECTION]) await send(text);
    await goalShows("running", 15_000);
    assert.equal(await page.locator("#goal-heading").innerText(), "Goal");
    assert.equal(await page.locator("#goal-additions").getAttribute("aria-label"), "additions");
    // A goal but no commitments: the panel still shows, and says what is missing.
    assert.equal(await page.locator("#plan").innerText(), "No commitments yet: the model makes them with its update_plan tool.");
    await screenshot(page, artifacts, "goal-running");
    assert.deepEqual(await axeProblems(page, "the plan panel with a goal"), []);

    // Approved, the chain ends after its queued legs (each steering message, echoed): done.
    await approve.click();
    await goalShows("done", 30_000);
    assert.equal(await page.locator("#goal").getAttribute("data-control"), "done");
    await screenshot(page, artifacts, "goal-done");
    assert.match(await page.locator("#timeline").innerText(), /echo: also add a README[\s\S]*echo: no, write docs instead/);

    // A reload reads the goal from the opening snapshot.
    await page.reload();
    await page.click("#show-plan");
    await goalShows("done", 10_000);
    assert.deepEqual(problems, []);
  });
});
