// The app's tasks panel (docs/protocol.md section 31): every task with its
// kind, its schedule or "on demand", its next fire and how its last fire went
// (ListTasks, read when the panel opens, after each action, and when a
// background result or a run's end may have changed it); a form that creates
// one (name, prompt or script, schedule, session); and per task enable or
// disable, run now and delete. What a task delivers shows in its session's
// conversation as a `background` item (app.ts).
import { Code, ConnectError } from "@connectrpc/connect";
import { enumJsonName, TaskOutcomeSchema, type AgentClient, type ListTasksResponse, type SessionSummary, type Task } from "../src/index.js";
import { button, h, reportError } from "./dom.js";

export interface TasksView {
  /** undefined until the first ListTasks answer. */
  list: ListTasksResponse | undefined;
  /** Why the last create was refused (the server's message names the field: "schedule: …"). */
  formError: string;
  /** The task whose Delete was pressed once (it asks again). */
  confirmDelete: string;
  /** The sessions a task can deliver to, and the one open now (the form's default). */
  sessions: SessionSummary[];
  /** The form's selects (a re-render rebuilds them; inputs keep their drafts by id). */
  kind: "script" | "prompt";
  session: string;
}

export interface TasksActions {
  client: AgentClient;
  /** Reads the list again and re-renders. */
  refresh: () => Promise<void>;
  render: () => void;
  open: (sessionId: string) => void;
  close: () => void;
}

export function tasksPanel(view: TasksView, a: TasksActions): HTMLElement {
  return h(
    "aside",
    { class: "side side-tasks", id: "side" },
    h(
      "div",
      { class: "side-head" },
      h("strong", {}, "Tasks"),
      h("span", {}, button("Refresh", a.refresh, { class: "small", id: "refresh-tasks" }), " ", button("Close", a.close, { class: "small", id: "close-tasks" })),
    ),
    view.list ? h("p", { class: "hint", id: "tasks-timezone" }, `Schedules are read in ${view.list.timezone || "the server's time zone"}.`) : null,
    createForm(view, a),
    taskList(view, a),
  );
}

function createForm(view: TasksView, a: TasksActions): HTMLElement {
  const name = h("input", { id: "task-name", placeholder: "name", "aria-label": "task name" });
  const kind = h(
    "select",
    { id: "task-kind", "aria-label": "prompt or script" },
    h("option", { value: "script", selected: view.kind === "script" }, "script"),
    h("option", { value: "prompt", selected: view.kind === "prompt" }, "prompt"),
  );
  kind.addEventListener("change", () => {
    view.kind = kind.value === "prompt" ? "prompt" : "script";
  });
  const text = h("textarea", { id: "task-text", placeholder: "a shell command (script) or a prompt for the model", "aria-label": "task text" });
  const schedule = h("input", { id: "task-schedule", placeholder: "cron: */15 * * * *  (empty: on demand)", "aria-label": "schedule" });
  const session = h("select", { id: "task-session", "aria-label": "session" }, h("option", { value: "" }, "a session of its own (script) / a new one per fire (prompt)"));
  for (const s of view.sessions) {
    session.appendChild(h("option", { value: s.sessionId, selected: s.sessionId === view.session }, s.title || `session ${s.sessionId.slice(0, 8)}`));
  }
  session.addEventListener("change", () => {
    view.session = session.value;
  });
  const form = h(
    "form",
    { class: "task-form", id: "task-form" },
    name,
    kind,
    text,
    schedule,
    session,
    h("button", { type: "submit", id: "task-create" }, "Create task"),
    h("pre", { class: "errors", id: "task-error" }, view.formError),
  );
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const body = (text as HTMLTextAreaElement).value;
    const isScript = kind.value === "script";
    const cron = (schedule as HTMLInputElement).value.trim();
    const sid = session.value;
    void a.client
      .createTask({
        name: (name as HTMLInputElement).value.trim(),
        prompt: isScript ? undefined : body,
        script: isScript ? body : undefined,
        schedule: cron || undefined,
        sessionId: sid || undefined,
      })
      .then(async () => {
        view.formError = "";
        form.reset();
        for (const id of ["task-name", "task-text", "task-schedule"]) {
          const el = document.getElementById(id) as HTMLInputElement | null;
          if (el) el.value = "";
        }
        await a.refresh();
      })
      .catch((err: unknown) => {
        // A refusal is the form's to show; anything else is the page's.
        if (err instanceof ConnectError && (err.code === Code.InvalidArgument || err.code === Code.ResourceExhausted)) {
          view.formError = err.rawMessage;
          a.render();
        } else reportError(err);
      });
  });
  return form;
}

function taskList(view: TasksView, a: TasksActions): HTMLElement {
  if (!view.list) return h("p", { class: "hint", id: "tasks" }, "Loading…");
  const tasks = view.list.tasks;
  if (tasks.length === 0) return h("p", { class: "hint", id: "tasks", "data-count": "0" }, "No tasks yet.");
  const ul = h("ul", { class: "tasks", id: "tasks", "data-count": String(tasks.length) });
  for (const t of tasks) ul.appendChild(taskRow(t, view, a));
  return ul;
}

/** "script_failed at 2026-12-04T09:30:00Z: exit code 3 …", or "never fired". */
function lastFire(t: Task): string {
  const f = t.lastFire;
  if (!f) return "never fired";
  const outcome = enumJsonName(TaskOutcomeSchema, f.outcome) || "unknown";
  return `${outcome} at ${f.at}${f.message ? `: ${f.message}` : ""}`;
}

function taskRow(t: Task, view: TasksView, a: TasksActions): HTMLElement {
  const kind = t.script !== undefined ? "script" : "prompt";
  const outcome = t.lastFire ? enumJsonName(TaskOutcomeSchema, t.lastFire.outcome) : "";
  const change = async (p: Promise<unknown>) => {
    await p;
    await a.refresh();
  };
  const session = t.sessionId
    ? button("Open session", () => a.open(t.sessionId ?? ""), { class: "small task-open" })
    : null;
  return h(
    "li",
    {
      class: `task ${t.enabled ? "enabled" : "disabled"} outcome-${outcome || "none"}`,
      "data-task": t.id,
      "data-enabled": t.enabled ? "true" : "false",
      "data-outcome": outcome,
    },
    h("div", { class: "task-head" }, h("strong", { class: "task-name" }, t.name), h("span", { class: "task-kind" }, kind), t.enabled ? null : h("span", { class: "task-off" }, "disabled")),
    h("code", { class: "task-text", title: t.script ?? t.prompt ?? "" }, t.script ?? t.prompt ?? ""),
    h(
      "dl",
      { class: "task-facts" },
      h("dt", {}, "schedule"),
      h("dd", { class: "task-schedule" }, t.schedule ?? "on demand"),
      h("dt", {}, "next fire"),
      h("dd", { class: "task-next" }, t.nextFire ?? "—"),
      h("dt", {}, "last fire"),
      h("dd", { class: "task-last" }, lastFire(t)),
    ),
    h(
      "div",
      { class: "actions" },
      button(t.enabled ? "Disable" : "Enable", () => change(a.client.updateTask({ taskId: t.id, enabled: !t.enabled })), { class: "small task-toggle" }),
      button("Run now", () => change(a.client.runTaskNow({ taskId: t.id })), { class: "small task-run" }),
      session,
      view.confirmDelete === t.id
        ? button("Really delete?", () => {
            view.confirmDelete = "";
            return change(a.client.deleteTask({ taskId: t.id }));
          }, { class: "small danger task-delete" })
        : button("Delete", () => {
            view.confirmDelete = t.id;
            a.render();
          }, { class: "small task-delete" }),
    ),
  );
}
