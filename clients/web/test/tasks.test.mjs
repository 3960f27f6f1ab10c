// Scheduled tasks and the digest in the TypeScript client. Without a server:
// fromVakJson reads the REST/SSE JSON of the new messages (a background_result
// event's enums, a transcript's background message, a task list's last-fire
// outcomes, the digest's maps of DigestUsage, the console's scheduler). From
// Node against a live `vak serve`: a script task created, fired with
// runTaskNow and its result seen on the session's gRPC-web stream and its SSE
// stream, a failing script's alert, a bad cron refused with InvalidArgument
// naming `schedule`, and the digest's window. Run by `npm test`, after the build.
//
//   VAK_BIN   the vak binary (default: <repo>/target/debug/vak)
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Code, ConnectError } from "@connectrpc/connect";
import {
  AdminStatusSchema,
  BackgroundReason,
  BackgroundReasonSchema,
  BackgroundSource,
  BackgroundSourceSchema,
  createAgentClient,
  DigestSchema,
  enumJsonName,
  EventSchema,
  fromVakJson,
  ItemKind,
  ItemStatus,
  ListTasksResponseSchema,
  MessageRole,
  OutputTimelineSchema,
  TaskOutcome,
  TaskOutcomeSchema,
  TranscriptSchema,
} from "../dist/index.js";
import { startVak } from "../harness/vak.mjs";

/** `obj` as the server would send it (JSON text), read back with fromVakJson. */
const fromVakJsonOf = (schema, obj) => fromVakJson(schema, JSON.stringify(obj));

describe("fromVakJson reads the JSON of tasks, background results and the digest", () => {
  test("a background_result event, its transcript message and its timeline item", () => {
    const ev = fromVakJsonOf(EventSchema, {
      seq: 7,
      session_id: "s",
      background_result: {
        source: "script",
        id: "task_0123456789ab",
        text: "exit code 3",
        alert: true,
        reason: "script_failed",
        result_id: "bg_0c1d2e3f4a5b",
        arrived_at: "2026-12-04T09:45:00Z",
        summarised: 2,
      },
    });
    assert.equal(ev.kind.case, "backgroundResult");
    const r = ev.kind.value;
    assert.equal(r.source, BackgroundSource.SCRIPT);
    assert.equal(r.reason, BackgroundReason.SCRIPT_FAILED);
    assert.equal(enumJsonName(BackgroundReasonSchema, r.reason), "script_failed");
    assert.deepEqual([r.id, r.alert, r.resultId, r.arrivedAt, r.summarised], ["task_0123456789ab", true, "bg_0c1d2e3f4a5b", "2026-12-04T09:45:00Z", 2]);
    const quiet = fromVakJsonOf(EventSchema, { background_result: { source: "budget", reason: "", text: "t" } }).kind.value;
    assert.equal(enumJsonName(BackgroundSourceSchema, quiet.source), "budget");
    assert.equal(quiet.reason, BackgroundReason.UNSPECIFIED);

    const t = fromVakJsonOf(TranscriptSchema, {
      messages: [{ role: "background", text: "hi", seq: 4, background: { source: "task", id: "task_a", reason: "budget_100", alert: true } }],
    });
    assert.equal(t.messages[0].role, MessageRole.BACKGROUND);
    assert.equal(t.messages[0].background?.reason, BackgroundReason.BUDGET_100);
    assert.equal(t.messages[0].background?.source, BackgroundSource.TASK);

    const tl = fromVakJsonOf(OutputTimelineSchema, { seq: 4, items: [{ id: "background-4", kind: "background", status: "failed", text: "x", seq: 4 }] });
    assert.deepEqual([tl.items[0].kind, tl.items[0].status], [ItemKind.BACKGROUND, ItemStatus.FAILED]);
  });

  test("a task list's last-fire outcomes, inside a repeated message", () => {
    const r = fromVakJsonOf(ListTasksResponseSchema, {
      timezone: "Europe/Berlin",
      tasks: [
        { id: "task_a", name: "a", script: "true", enabled: true, next_fire: "2026-12-04T10:45:00+01:00", last_fire: { at: "2026-12-04T09:30:00Z", outcome: "script_timeout", slot: "1764837000" } },
        { id: "task_b", name: "b", prompt: "hi", enabled: false, last_fire: { outcome: "budget_exceeded", message: "past the budget" } },
      ],
    });
    assert.equal(r.timezone, "Europe/Berlin");
    const [a, b] = r.tasks;
    assert.equal(a.lastFire?.outcome, TaskOutcome.SCRIPT_TIMEOUT);
    assert.deepEqual([a.script, a.prompt, a.nextFire], ["true", undefined, "2026-12-04T10:45:00+01:00"]);
    assert.equal(enumJsonName(TaskOutcomeSchema, b.lastFire?.outcome ?? 0), "budget_exceeded");
    assert.equal(b.nextFire, undefined);
  });

  test("the digest's maps of DigestUsage by model and by session", () => {
    const usage = { usd: 0.25, input_tokens: "1000", output_tokens: 200, calls: 3 };
    const d = fromVakJsonOf(DigestSchema, {
      days: [{ date: "2026-12-03" }, { date: "2026-12-04", usd: 0.25, input_tokens: 1000, output_tokens: 200, runs: 2, by_model: { "fake/m": usage }, by_session: { s1: usage, s2: {} } }],
      total: usage,
      memory_notes_added: 1,
      tasks_fired: 4,
      unpriced: ["other/x"],
      max_day_usd: 2,
      today_usd: 0.25,
      timezone: "UTC",
      a_newer_field: 1,
    });
    assert.deepEqual(d.days.map((x) => x.date), ["2026-12-03", "2026-12-04"]);
    const today = d.days[1];
    assert.deepEqual([today.usd, today.inputTokens, today.outputTokens, today.runs], [0.25, 1000n, 200n, 2]);
    assert.deepEqual(Object.keys(today.byModel), ["fake/m"]);
    assert.deepEqual(Object.keys(today.bySession).sort(), ["s1", "s2"]);
    const m = today.byModel["fake/m"];
    assert.deepEqual([m.usd, m.inputTokens, m.outputTokens, m.calls], [0.25, 1000n, 200n, 3]);
    assert.equal(today.bySession.s2.calls, 0);
    assert.deepEqual([d.total?.calls, d.tasksFired, d.memoryNotesAdded, d.unpriced, d.maxDayUsd, d.todayUsd], [3, 4, 1, ["other/x"], 2, 0.25]);
    assert.equal(fromVakJsonOf(DigestSchema, { today_usd: 0 }).maxDayUsd, undefined);
  });

  test("the console's scheduler and spend", () => {
    const st = fromVakJsonOf(AdminStatusSchema, {
      scheduler: [{ task_id: "task_a", name: "a", next_fire: "2026-12-04T10:45:00+01:00" }],
      timezone: "Europe/Berlin",
      today_usd: 1.5,
    });
    assert.deepEqual(st.scheduler.map((f) => [f.taskId, f.name, f.nextFire]), [["task_a", "a", "2026-12-04T10:45:00+01:00"]]);
    assert.deepEqual([st.timezone, st.todayUsd, st.maxDayUsd], ["Europe/Berlin", 1.5, undefined]);
  });
});

describe("tasks against a live vak serve", () => {
  let tmp, vak, client, token;
  const auth = () => ({ authorization: `Bearer ${token}` });

  before(async () => {
    tmp = mkdtempSync(join(tmpdir(), "vak-tasks-"));
    mkdirSync(join(tmp, "workspace"));
    token = randomBytes(24).toString("hex");
    vak = await startVak(["--home", join(tmp, "home"), "--workspace", join(tmp, "workspace"), "--token", token]);
    client = createAgentClient({ baseUrl: vak.url, token, timeoutMs: 20_000 });
  });

  after(async () => {
    await vak?.stop();
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  });

  /** The next background result on the session's gRPC-web stream, after seq `after`. */
  async function nextBackground(sessionId, after) {
    const ac = new AbortController();
    const timer = setTimeout(() => ac.abort(), 20_000);
    try {
      for await (const ev of client.subscribe({ sessionId, after }, { signal: ac.signal })) {
        if (ev.kind.case === "backgroundResult") return ev;
      }
    } finally {
      clearTimeout(timer);
      ac.abort();
    }
    throw new Error("the stream ended without a background_result");
  }

  test("a script task's output and its failure arrive as background results", { timeout: 60_000 }, async () => {
    const { task } = await client.createTask({ name: "watchdog", script: "echo '  all quiet  '" });
    assert.match(task?.id ?? "", /^task_[0-9a-f]{12}$/);
    assert.equal(task.enabled, true);
    assert.equal(task.nextFire, undefined, "no schedule, no next fire");
    const sessionId = task.sessionId;
    assert.ok(sessionId, "a script task got a session of its own");

    const fired = nextBackground(sessionId, 0n);
    assert.equal((await client.runTaskNow({ taskId: task.id })).task?.id, task.id);
    const ev = await fired;
    const r = ev.kind.value;
    assert.deepEqual([r.source, r.id, r.text, r.alert, r.reason], [BackgroundSource.SCRIPT, task.id, "all quiet", false, BackgroundReason.UNSPECIFIED]);
    // The same result over REST: the transcript's last message, read with fromVakJson.
    const tr = await fetch(`${vak.url}/sessions/${sessionId}/transcript`, { headers: auth() });
    const transcript = fromVakJson(TranscriptSchema, await tr.text());
    const last = transcript.messages.at(-1);
    assert.deepEqual([last.role, last.text, last.background?.resultId], [MessageRole.BACKGROUND, "all quiet", r.resultId]);
    // And on the SSE stream, replayed from the start: the frame's JSON has its enums by name.
    const sse = await sseFrame(`${vak.url}/sessions/${sessionId}/events?after=0`, "background_result");
    assert.match(sse, /"source":"script"/);
    assert.equal(fromVakJson(EventSchema, sse).kind.value.resultId, r.resultId);

    // A failing script: an alert with its reason.
    await client.updateTask({ taskId: task.id, script: "echo oops >&2; exit 3" });
    const failed = nextBackground(sessionId, ev.seq);
    await client.runTaskNow({ taskId: task.id });
    const alert = (await failed).kind.value;
    assert.deepEqual([alert.alert, alert.reason], [true, BackgroundReason.SCRIPT_FAILED]);
    assert.match(alert.text, /3[\s\S]*oops|oops[\s\S]*3/);

    const list = await client.listTasks({});
    assert.ok(list.timezone);
    assert.deepEqual(list.tasks.map((t) => t.id), [task.id]);
    const off = await client.updateTask({ taskId: task.id, enabled: false });
    assert.equal(off.task?.enabled, false);
    assert.equal((await client.deleteTask({ taskId: task.id })).deleted, true);
    await assert.rejects(client.getTask({ taskId: task.id }), (err) => err instanceof ConnectError && err.code === Code.NotFound);
  });

  test("a bad cron is InvalidArgument naming schedule", async () => {
    await assert.rejects(
      client.createTask({ name: "bad", script: "true", schedule: "61 * * * *" }),
      (err) => err instanceof ConnectError && err.code === Code.InvalidArgument && err.rawMessage.startsWith("schedule:"),
    );
    assert.deepEqual((await client.listTasks({})).tasks, []);
  });

  test("the digest covers the days asked for", async () => {
    const d = await client.getDigest({ days: 3 });
    assert.equal(d.days.length, 3);
    assert.ok(d.days[0].date < d.days[2].date);
    await assert.rejects(client.getDigest({ days: 91 }), (err) => err instanceof ConnectError && err.code === Code.InvalidArgument);
    const r = await fetch(`${vak.url}/digest?days=2`, { headers: auth() });
    assert.equal(r.status, 200);
    assert.equal(fromVakJson(DigestSchema, await r.text()).days.length, 2);
  });

  /** The data of the first SSE frame of `event` at `url` (read until it comes, 20 s at most). */
  async function sseFrame(url, event) {
    const ac = new AbortController();
    const timer = setTimeout(() => ac.abort(), 20_000);
    try {
      const resp = await fetch(url, { headers: { ...auth(), accept: "text/event-stream" }, signal: ac.signal });
      assert.equal(resp.status, 200);
      const decoder = new TextDecoder();
      let buf = "";
      for await (const chunk of resp.body) {
        buf += decoder.decode(chunk, { stream: true });
        let end;
        while ((end = buf.indexOf("\n\n")) >= 0) {
          const frame = buf.slice(0, end);
          buf = buf.slice(end + 2);
          const lines = frame.split("\n");
          if (lines.includes(`event: ${event}`)) {
            return lines.filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
          }
        }
      }
    } finally {
      clearTimeout(timer);
      ac.abort();
    }
    throw new Error(`no ${event} frame at ${url}`);
  }
});
