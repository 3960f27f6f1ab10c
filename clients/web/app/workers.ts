// The app's workers panel (docs/protocol.md section 33), beside the
// conversation of the open session: its children (the model's workers and
// best-of-N candidates) with their state, branch, diff stat and answer, Stop
// for a running one, Keep and Discard for a candidate, Open to read a child's
// own conversation; a form that starts a best-of-N; and the workspace's dev
// servers with Start and Stop and a live tail of one's log. Read when the
// panel opens, after each action, and when a worker, workbench,
// draft_discarded or launch_output event of the session arrives (app.ts).
import { Code, ConnectError } from "@connectrpc/connect";
import {
  enumJsonName,
  LaunchSourceSchema,
  WorkerKind,
  WorkerKindSchema,
  WorkerState,
  WorkerStateSchema,
  type AgentClient,
  type LaunchConfig,
  type Worker,
} from "../src/index.js";
import { button, h, reportError } from "./dom.js";

/** The most log lines the panel shows (the server's ring keeps more). */
const LOG_TAIL = 50;

export interface WorkersView {
  /** The session the lists belong to. */
  sessionId: string;
  /** undefined until the first ListWorkers answer. */
  workers: Worker[] | undefined;
  /** undefined until the first ListLaunch answer. */
  launch: LaunchConfig[] | undefined;
  /** The dev server whose log tail is shown ("" for none), and its lines. */
  logName: string;
  log: string[];
  /** Why the last action or read was refused (not a git repository, a merge conflict, a bad launch.toml). */
  error: string;
}

export function emptyWorkers(): WorkersView {
  return { sessionId: "", workers: undefined, launch: undefined, logName: "", log: [], error: "" };
}

export interface WorkersActions {
  client: AgentClient;
  /** Reads the lists again and re-renders. */
  refresh: () => Promise<void>;
  render: () => void;
  open: (sessionId: string) => void;
  close: () => void;
}

/** A refusal the panel explains itself; anything else goes to the page's errors. */
function refused(err: unknown): string | undefined {
  if (!(err instanceof ConnectError)) return undefined;
  const mine = [Code.InvalidArgument, Code.FailedPrecondition, Code.NotFound, Code.ResourceExhausted, Code.Unavailable];
  return mine.includes(err.code) ? err.rawMessage : undefined;
}

/** Reads the session's children, its dev servers and the shown log into `view`. */
export async function loadWorkers(view: WorkersView, client: AgentClient, sessionId: string): Promise<void> {
  if (view.sessionId !== sessionId) Object.assign(view, emptyWorkers(), { sessionId });
  if (!sessionId) return;
  const errors: string[] = [];
  const settle = async <T>(p: Promise<T>): Promise<T | undefined> => {
    try {
      return await p;
    } catch (err) {
      const why = refused(err);
      if (why === undefined) throw err;
      errors.push(why);
      return undefined;
    }
  };
  const [w, l] = await Promise.all([settle(client.listWorkers({ sessionId })), settle(client.listLaunch({ sessionId }))]);
  if (view.sessionId !== sessionId) return; // another session was opened meanwhile
  if (w) view.workers = w.workers;
  if (l) view.launch = l.configs;
  if (view.logName) {
    const logs = await settle(client.getLaunchLogs({ sessionId, name: view.logName, tail: LOG_TAIL }));
    if (logs) view.log = logs.lines.map((x) => x.text.replace(/\n$/, ""));
  }
  view.error = errors.join("\n");
}

export function workersPanel(view: WorkersView, a: WorkersActions): HTMLElement {
  return h(
    "aside",
    { class: "side side-workers", id: "side" },
    h(
      "div",
      { class: "side-head" },
      h("strong", {}, "Workers"),
      h("span", {}, button("Refresh", a.refresh, { class: "small", id: "refresh-workers" }), " ", button("Close", a.close, { class: "small", id: "close-workers" })),
    ),
    h("pre", { class: "errors", id: "workers-error" }, view.error),
    workerList(view, a),
    bestOfNForm(view, a),
    h("h3", {}, "Dev servers"),
    launchList(view, a),
    view.logName
      ? h("div", { class: "launch-log" }, h("div", { class: "hint" }, `${view.logName}: the last ${LOG_TAIL} lines`), h("pre", { class: "plain", id: "launch-log", "data-name": view.logName }, view.log.join("\n")))
      : null,
  );
}

/** Runs an action, then reads the lists again; a refusal is shown in the panel. */
function act(view: WorkersView, a: WorkersActions, p: () => Promise<unknown>): () => Promise<void> {
  return async () => {
    try {
      await p();
      view.error = "";
    } catch (err) {
      const why = refused(err);
      if (why === undefined) return reportError(err);
      view.error = why;
    }
    await a.refresh();
  };
}

/** "2 files +5 -1". */
function diffStat(w: Worker): string {
  const d = w.diffStat;
  if (!d) return "";
  return `${d.files} ${d.files === 1 ? "file" : "files"} +${d.insertions} -${d.deletions}`;
}

function workerList(view: WorkersView, a: WorkersActions): HTMLElement {
  if (!view.workers) return h("p", { class: "hint", id: "workers" }, "Loading…");
  const ws = view.workers;
  if (ws.length === 0) return h("p", { class: "hint", id: "workers", "data-count": "0" }, "No workers or candidates in this session.");
  const ul = h("ul", { class: "tasks workers", id: "workers", "data-count": String(ws.length) });
  for (const w of ws) ul.appendChild(workerRow(w, view, a));
  return ul;
}

function workerRow(w: Worker, view: WorkersView, a: WorkersActions): HTMLElement {
  const sid = view.sessionId;
  const state = enumJsonName(WorkerStateSchema, w.state);
  const kind = enumJsonName(WorkerKindSchema, w.kind) || "worker";
  const candidate = w.kind === WorkerKind.CANDIDATE;
  const running = w.state === WorkerState.RUNNING || w.state === WorkerState.IDLE;
  const stat = diffStat(w);
  return h(
    "li",
    { class: `task worker state-${state}`, "data-worker": w.id, "data-state": state, "data-kind": kind },
    h("div", { class: "task-head" }, h("strong", { class: "worker-id" }, w.id.slice(0, 12)), h("span", { class: "task-kind" }, kind), h("span", { class: "worker-state" }, state)),
    h("code", { class: "task-text", title: w.prompt }, w.prompt),
    h(
      "dl",
      { class: "task-facts" },
      w.branch ? h("dt", {}, "branch") : null,
      w.branch ? h("dd", { class: "worker-branch" }, w.branch) : null,
      stat ? h("dt", {}, "change") : null,
      stat ? h("dd", { class: "worker-diff" }, stat) : null,
      w.summary ? h("dt", {}, state === "failed" ? "why" : "answer") : null,
      w.summary ? h("dd", { class: "worker-summary" }, w.summary) : null,
    ),
    h(
      "div",
      { class: "actions" },
      button("Open", () => a.open(w.id), { class: "small worker-open" }),
      running && !candidate ? button("Stop", act(view, a, () => a.client.stopWorker({ sessionId: sid, childId: w.id })), { class: "small worker-stop" }) : null,
      candidate && w.state === WorkerState.FINISHED
        ? button("Keep", act(view, a, () => a.client.keepCandidate({ sessionId: sid, candidate: w.id })), { class: "small worker-keep" })
        : null,
      candidate ? button("Discard", act(view, a, () => a.client.discardCandidate({ sessionId: sid, candidate: w.id })), { class: "small danger worker-discard" }) : null,
    ),
  );
}

function bestOfNForm(view: WorkersView, a: WorkersActions): HTMLElement {
  const prompt = h("textarea", { id: "bestofn-prompt", placeholder: "a prompt to run several times, each on its own branch", "aria-label": "best-of-N prompt" });
  const n = h("input", { id: "bestofn-n", type: "number", min: "2", value: "2", "aria-label": "how many runs" });
  const form = h("form", { class: "task-form", id: "bestofn-form" }, prompt, n, h("button", { type: "submit", id: "bestofn-start" }, "Run best-of-N"));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const text = prompt.value;
    const count = Number.parseInt(n.value, 10) || 0;
    void act(view, a, async () => {
      await a.client.startBestOfN({ sessionId: view.sessionId, prompt: text, n: count });
      prompt.value = "";
    })();
  });
  return form;
}

function launchList(view: WorkersView, a: WorkersActions): HTMLElement {
  if (!view.launch) return h("p", { class: "hint", id: "launch" }, "Loading…");
  if (view.launch.length === 0) {
    return h("p", { class: "hint", id: "launch", "data-count": "0" }, "No dev servers: add .vak/launch.toml or dev/start/serve scripts to package.json.");
  }
  const ul = h("ul", { class: "tasks launch", id: "launch", "data-count": String(view.launch.length) });
  const sid = view.sessionId;
  for (const c of view.launch) {
    const showLog = async () => {
      view.logName = c.name;
      view.log = [];
      await a.refresh();
    };
    ul.appendChild(
      h(
        "li",
        { class: `task launch-config ${c.running ? "running" : "stopped"}`, "data-launch": c.name, "data-running": c.running ? "true" : "false" },
        h("div", { class: "task-head" }, h("strong", { class: "launch-name" }, c.name), h("span", { class: "task-kind" }, enumJsonName(LaunchSourceSchema, c.source)), h("span", { class: "launch-state" }, c.running ? `running, pid ${c.pid}` : c.exitCode !== undefined ? `exited ${c.exitCode}` : "stopped")),
        h("code", { class: "task-text", title: c.command }, c.command),
        h(
          "div",
          { class: "actions" },
          c.running
            ? button("Stop", act(view, a, () => a.client.stopLaunch({ sessionId: sid, name: c.name })), { class: "small launch-stop" })
            : button("Start", act(view, a, async () => {
                await a.client.startLaunch({ sessionId: sid, name: c.name });
                view.logName = c.name;
              }), { class: "small launch-start" }),
          button("Log", showLog, { class: "small launch-log-show" }),
        ),
      ),
    );
  }
  return ul;
}
