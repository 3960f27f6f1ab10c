// The browser app served at /app: login, the session sidebar with live busy
// state, the conversation rendered from each session's presentation timeline
// (followed for every listed session on one GET /stream, resumed with its
// cursor vector), approvals, steering, cancel, the file tree and the diff,
// a terminal (xterm.js onto GET /pty) when GET /host says it is on, the
// settings (the model route, the mode, the MCP servers and their state), and
// the scheduled tasks (tasks.ts), whose background results show in the
// conversation, and the open session's workers, best-of-N candidates and dev
// servers (workers.ts).
// Calls go through the package's gRPC-web client with the login cookie and
// its session key; nothing the server or the model sends is parsed as HTML.
import "./app.css";
import { Code, ConnectError } from "@connectrpc/connect";
import {
  createAgentClient,
  DiffReasonSchema,
  enumJsonName,
  ItemKindSchema,
  ItemStatusSchema,
  PermissionModeSchema,
  PlanExitMode,
  SurfaceSchema,
  ThemeSchema,
  login,
  logout,
  storedKey,
  StreamFollower,
  type AgentClient,
  type Client,
  type ConfigInfo,
  type FollowerState,
  type HostInfo,
  type McpConfig,
  type SearchHit,
  type SessionSummary,
  type TimelineItem,
} from "../src/index.js";
import { button, h, onError } from "./dom.js";
import { currentKey, forgetKey, shareKey } from "./login.js";
import { renderMarkdown } from "./markdown.js";
import { settingsPanel } from "./settings.js";
import { tasksPanel, type TasksView } from "./tasks.js";
import { emptyWorkers, loadWorkers, workersPanel } from "./workers.js";
import { TerminalPanel } from "./terminal.js";
import { apply, empty, fromSnapshot, type Timeline } from "./timeline.js";

const base = location.origin;
/** At most this many sessions are followed live on the one stream (the server's cap is 64). */
const FOLLOW_CAP = 64;

interface SessionView {
  summary: SessionSummary;
  busy: boolean;
  timeline: Timeline;
  /** Who is attached (coworking presence), this tab's own stream included. */
  clients: Client[];
}

/** What the page knows; window.vakApp exposes it to the browser test. */
const state = {
  authenticated: false,
  sessions: new Map<string, SessionView>(),
  order: [] as string[],
  current: "",
  config: undefined as ConfigInfo | undefined,
  /** GET /host: the version, the workspaces and whether the terminal is on. */
  host: undefined as HostInfo | undefined,
  conn: "idle" as FollowerState,
  /** Every state the stream went through (the reconnect indicator's history). */
  connHistory: [] as FollowerState[],
  errors: [] as string[],
  /** Thinking and tool items the user opened, by item id (kept across re-renders). */
  open: new Set<string>(),
  side: "" as "" | "files" | "diff" | "terminal" | "settings" | "tasks" | "workers",
  sideText: "",
  renaming: "",
  confirmDelete: "",
  /** The sidebar's last search: its words and hits (GET /search over every transcript). */
  search: { q: "", hits: [] as SearchHit[], done: false },
  /** The workspace a new session is created in ("" = the server's own). */
  newWorkspace: "",
  /** GET /config/mcp, read when the settings open (undefined until then). */
  mcp: undefined as McpConfig | undefined,
  /** The settings' tool lists the user opened or closed, by server name. */
  mcpToolsOpen: new Map<string, boolean>(),
  /** The tasks panel: GET /tasks (read when it opens), its form and confirmations. */
  tasks: { list: undefined, formError: "", confirmDelete: "", sessions: [], kind: "script", session: "" } as TasksView,
  /** The workers panel: the open session's children and dev servers (read when it opens). */
  workers: emptyWorkers(),
};

let client: AgentClient;
let follower: StreamFollower | undefined;
const root = document.getElementById("root") as HTMLElement;
const terminal = new TerminalPanel(base, () => currentKey(base) ?? "");

declare global {
  interface Window {
    vakApp: unknown;
  }
}
window.vakApp = { state, terminal, get follower() { return follower; } };

function message(err: unknown): string {
  return err instanceof ConnectError ? `${err.code}: ${err.rawMessage}` : err instanceof Error ? err.message : String(err);
}
onError((err) => {
  if (err instanceof ConnectError && err.code === Code.Unauthenticated) return loggedOut();
  state.errors.push(message(err));
  if (state.errors.length > 20) state.errors.shift();
  schedule();
});

/** The login ended (expired, logged out elsewhere, another token): back to the form. */
function loggedOut(): void {
  clearInterval(listTimer);
  follower?.close();
  follower = undefined;
  forgetKey();
  state.authenticated = false;
  state.errors = ["Your login ended (it expired, the server's token changed, or it was logged out): log in again."];
  render();
}

// ---- rendering, batched to one pass per frame ----

let pending = false;
function schedule(): void {
  if (pending) return;
  pending = true;
  requestAnimationFrame(() => {
    pending = false;
    render();
  });
}

/** The server's theme (`light`, `dark`, `system`) on the root element, which app.css reads. */
function applyTheme(): void {
  const theme = state.config ? enumJsonName(ThemeSchema, state.config.theme) : "";
  if (theme) document.documentElement.dataset.theme = theme;
  else delete document.documentElement.dataset.theme;
}

function render(): void {
  applyTheme();
  const scroller = root.querySelector(".conversation");
  const atBottom = !scroller || scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 40;
  const focused = document.activeElement;
  const keep = focused instanceof HTMLTextAreaElement || focused instanceof HTMLInputElement ? focused.id : "";
  const drafts = new Map<string, string>();
  for (const el of root.querySelectorAll<HTMLInputElement | HTMLTextAreaElement>("input[id], textarea[id]")) {
    drafts.set(el.id, el.value);
  }
  root.replaceChildren(state.authenticated ? workspace() : loginForm());
  for (const [id, v] of drafts) {
    const el = document.getElementById(id) as HTMLInputElement | null;
    if (el && el.type !== "password") el.value = v;
  }
  if (keep) (document.getElementById(keep) as HTMLElement | null)?.focus();
  const conv = root.querySelector(".conversation");
  if (conv && atBottom) conv.scrollTop = conv.scrollHeight;
}

function loginForm(): HTMLElement {
  const input = h("input", { id: "token", type: "password", autocomplete: "current-password", placeholder: "token", "aria-label": "token" });
  const form = h(
    "form",
    { class: "login", id: "login" },
    h("h1", {}, "vak"),
    h("p", {}, "Paste the token `vak serve` printed (also in server.json in its home)."),
    input,
    h("button", { type: "submit" }, "Log in"),
    errors(),
  );
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    void login(base, input.value)
      .then((key) => {
        shareKey(key);
        return start();
      })
      .catch((err) => {
        state.errors = [message(err)];
        render();
      });
  });
  return form;
}

function errors(): HTMLElement {
  return h("pre", { class: "errors", id: "errors" }, state.errors.join("\n"));
}

function workspace(): HTMLElement {
  return h(
    "div",
    { class: "layout" },
    header(),
    sidebar(),
    conversationPane(),
    sidePane(),
  );
}

function header(): HTMLElement {
  const r = state.config?.route;
  const reconnecting = state.conn === "reconnecting" || state.conn === "connecting";
  return h(
    "header",
    { class: "top" },
    h("strong", {}, "vak"),
    h("span", { class: "route", id: "route" }, r ? `${r.label || r.provider} · ${r.model}` : ""),
    h("span", { class: "mode", id: "mode" }, state.config ? `mode: ${enumJsonName(PermissionModeSchema, state.config.permissionMode)}` : ""),
    h("span", { class: `conn conn-${state.conn}`, id: "conn", "data-state": state.conn }, reconnecting ? "reconnecting…" : state.conn),
    button("Settings", () => showSettings(), { class: "small", id: "show-settings" }),
    h("a", { href: `/admin?key=${encodeURIComponent(storedKey(base) ?? "")}`, id: "admin-link" }, "admin"),
    button("Log out", async () => {
      follower?.close();
      forgetKey();
      await logout(base);
      state.authenticated = false;
      render();
    }),
  );
}

function sidebar(): HTMLElement {
  const list = h("ul", { class: "sessions", id: "sessions" });
  for (const id of state.order) {
    const s = state.sessions.get(id);
    if (!s) continue;
    const title = s.summary.title || `session ${id.slice(0, 8)}`;
    const li = h("li", { class: id === state.current ? "current" : "", "data-session": id, "data-busy": s.busy ? "true" : "false" });
    if (state.renaming === id) {
      const input = h("input", { id: `rename-${id}`, value: s.summary.title, "aria-label": "new title" });
      const form = h("form", { class: "rename" }, input, h("button", { type: "submit" }, "Save"));
      form.addEventListener("submit", (e) => {
        e.preventDefault();
        void client
          .renameSession({ sessionId: id, title: input.value })
          .then((summary) => {
            s.summary = summary;
            state.renaming = "";
            schedule();
          })
          .catch((err) => onErrorNow(err));
      });
      li.appendChild(form);
    } else {
      const open = h("a", { href: `/app/s/${id}`, class: "open" }, h("span", { class: "busy" }, s.busy ? "●" : "○"), " ", title);
      // A session in a workspace other than the server's says which (its folder's name; the path on hover).
      const ws = s.summary.workspace;
      if (ws && ws !== state.host?.workspace) {
        open.append(" ", h("span", { class: "ws", title: ws }, folderName(ws)));
      }
      open.addEventListener("click", (e) => {
        e.preventDefault();
        select(id);
      });
      li.append(
        open,
        button("Rename", () => {
          state.renaming = id;
          render();
        }, { class: "small" }),
        state.confirmDelete === id
          ? button("Really delete?", () => remove(id), { class: "small danger" })
          : button("Delete", () => {
              state.confirmDelete = id;
              render();
            }, { class: "small" }),
      );
    }
    list.appendChild(li);
  }
  return h(
    "nav",
    { class: "sidebar" },
    button("New session", () => create(), { id: "new-session" }),
    workspacePicker(),
    list,
    searchBox(),
    h(
      "div",
      { class: "tools" },
      button("Files", () => showFiles(), { id: "show-files" }),
      button("Diff", () => showDiff(), { id: "show-diff" }),
      button("Tasks", () => showTasks(), { id: "show-tasks" }),
      button("Workers", () => showWorkers(), { id: "show-workers" }),
      state.host?.features?.terminal ? button("Terminal", () => showTerminal(), { id: "show-terminal" }) : null,
    ),
  );
}

/** Where "New session" creates one: a trusted open workspace, and a form
 * that opens (and trusts) a folder under the server's workspace roots. */
function workspacePicker(): HTMLElement {
  const trusted = (state.host?.workspaces ?? []).filter((w) => w.trusted);
  const select = h("select", { id: "new-workspace", "aria-label": "workspace of a new session" });
  for (const w of trusted) {
    const value = w.primary ? "" : w.path;
    const name = folderName(w.path);
    const option = h("option", { value, title: w.path }, w.primary ? `${name} (the server's)` : name);
    if (value === state.newWorkspace) option.setAttribute("selected", "");
    select.appendChild(option);
  }
  select.addEventListener("change", () => {
    state.newWorkspace = (select as HTMLSelectElement).value;
  });
  const input = h("input", { id: "open-workspace", placeholder: "/absolute/folder", "aria-label": "folder to open" });
  const form = h("form", { class: "open-workspace" }, input, h("button", { type: "submit" }, "Open"));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const path = (input as HTMLInputElement).value.trim();
    if (!path) return;
    void openWorkspace(path).catch((err) => onErrorNow(err));
  });
  return h("div", { class: "workspace-picker" }, trusted.length > 1 ? select : null, form);
}

/** The last component of an absolute folder path. */
function folderName(path: string): string {
  return path.split("/").filter(Boolean).pop() ?? path;
}

async function openWorkspace(path: string): Promise<void> {
  const { workspace } = await client.openWorkspace({ path, trust: true });
  state.host = await client.getHost({});
  state.newWorkspace = workspace?.primary ? "" : workspace?.path ?? "";
  const input = document.getElementById("open-workspace") as HTMLInputElement | null;
  if (input) input.value = "";
  render();
}

/** Finds old conversations: each hit names its session and opens it. */
function searchBox(): HTMLElement {
  const input = h("input", { id: "search", type: "search", value: state.search.q, placeholder: "Search conversations", "aria-label": "search" });
  const form = h("form", { class: "search" }, input);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const q = input.value.trim();
    if (!q) return;
    void client
      .search({ q, limit: 20 })
      .then((r) => {
        state.search = { q, hits: r.hits, done: true };
        render();
      })
      .catch((err) => onErrorNow(err));
  });
  const hits = h("ul", { class: "hits", id: "search-hits" });
  for (const hit of state.search.hits) {
    const s = state.sessions.get(hit.sessionId);
    const title = s?.summary.title || `session ${hit.sessionId.slice(0, 8)}`;
    // The snippet marks matches with ** (Markdown bold): shown as text, without them.
    const a = h("a", { href: `/app/s/${hit.sessionId}`, "data-session": hit.sessionId }, h("strong", {}, title), " ", hit.snippet.replaceAll("**", ""));
    a.addEventListener("click", (e) => {
      e.preventDefault();
      if (state.sessions.has(hit.sessionId)) select(hit.sessionId);
    });
    hits.appendChild(h("li", {}, a));
  }
  const none = state.search.done && state.search.hits.length === 0 ? h("p", { class: "hint" }, `Nothing found for ${state.search.q}.`) : null;
  return h("div", { class: "search-box" }, form, hits, none);
}

function conversationPane(): HTMLElement {
  const s = state.sessions.get(state.current);
  if (!s) return h("main", { class: "conversation empty" }, h("p", {}, "Create or pick a session."), errors());
  const items = h("div", { class: "timeline", id: "timeline" });
  for (const item of s.timeline.items) items.appendChild(renderItem(item));
  const prompt = h("textarea", { id: "prompt", placeholder: s.busy ? "Steer the run in flight…" : "Ask vak…", "aria-label": "prompt" });
  const send = async () => {
    const text = prompt.value;
    if (!text.trim()) return;
    if (s.busy) await client.steer({ sessionId: s.summary.sessionId, text });
    else await client.run({ sessionId: s.summary.sessionId, prompt: text });
    prompt.value = "";
    const el = document.getElementById("prompt") as HTMLTextAreaElement | null;
    if (el) el.value = "";
  };
  prompt.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
      e.preventDefault();
      void send().catch(onErrorNow);
    }
  });
  const own = follower?.streamId ?? "";
  const others = s.clients.filter((c) => c.clientId !== own);
  return h(
    "main",
    { class: "conversation", "data-session": s.summary.sessionId },
    h(
      "div",
      { class: "presence", id: "presence", "data-others": String(others.length) },
      others.length
        ? `also here: ${others.map((c) => `${enumJsonName(SurfaceSchema, c.surface)} ${c.clientId.slice(0, 11)}`).join(", ")}`
        : "only you",
    ),
    items,
    h(
      "div",
      { class: "composer" },
      prompt,
      button(s.busy ? "Steer" : "Send", send, { id: "send" }),
      s.busy && button("Cancel", () => client.cancel({ sessionId: s.summary.sessionId }), { id: "cancel", class: "danger" }),
    ),
    errors(),
  );
}

function onErrorNow(err: unknown): void {
  state.errors.push(message(err));
  schedule();
}

function details(item: TimelineItem, summary: string, ...body: (Node | string)[]): HTMLElement {
  const d = h("details", { open: state.open.has(item.id) }, h("summary", {}, summary), ...body);
  d.addEventListener("toggle", () => {
    if (d.open) state.open.add(item.id);
    else state.open.delete(item.id);
  });
  return d;
}

function renderItem(item: TimelineItem): HTMLElement {
  // The page shows (and its CSS and tests read) the JSON names: "tool_call", "completed".
  const kind = enumJsonName(ItemKindSchema, item.kind);
  const status = enumJsonName(ItemStatusSchema, item.status);
  const attrs = { class: `item ${kind} status-${status}`, "data-item": item.id, "data-kind": kind, "data-status": status };
  switch (kind) {
    case "user_input":
      return h("div", attrs, h("div", { class: "who" }, "you"), h("div", { class: "text plain" }, item.text));
    case "assistant_text": {
      const body = h("div", { class: "text md" });
      body.appendChild(renderMarkdown(item.text));
      return h("div", attrs, h("div", { class: "who" }, "vak"), body);
    }
    case "thinking":
      return h("div", attrs, details(item, status === "streaming" ? "Thinking…" : "Thought", h("pre", { class: "plain" }, item.text)));
    case "tool_call":
      return h(
        "div",
        attrs,
        details(
          item,
          `${item.tool} · ${status}`,
          h("pre", { class: "input" }, JSON.stringify(item.input ?? {}, null, 2)),
          h("pre", { class: "output" }, item.text),
        ),
      );
    case "approval":
      return approval(item, status, attrs);
    case "final_result":
      return h("div", attrs, `Run ${status}${item.text && item.text !== status ? `: ${item.text}` : ""}`);
    case "background":
      // Delivered between runs: a script's output, or (status failed) an alert.
      return h(
        "div",
        attrs,
        h("div", { class: "who" }, status === "failed" ? "⚠ background alert" : "⟲ background"),
        h("pre", { class: "text plain" }, item.text),
      );
    default:
      return h("div", attrs, item.text);
  }
}

function approval(item: TimelineItem, status: string, attrs: Record<string, string>): HTMLElement {
  const sid = state.current;
  const el = h(
    "div",
    attrs,
    h("div", { class: "who" }, `approval · ${item.tool} · ${status}`),
    h("div", { class: "text plain" }, item.text),
    h("pre", { class: "input" }, JSON.stringify(item.input ?? {}, null, 2)),
  );
  if (status === "pending" && item.tool === "exit_plan_mode") {
    // A plan: approving it leaves plan mode for the mode chosen here (docs/protocol.md section 13).
    const reason = h("input", { id: `deny-reason-${item.id}`, placeholder: "reason (for deny)", "aria-label": "deny reason" });
    el.append(
      h(
        "div",
        { class: "actions" },
        button("Approve, then accept edits", () => client.approve({ sessionId: sid, requestId: item.requestId, approve: true, mode: PlanExitMode.ACCEPT_EDITS }), { class: "approve-accept-edits" }),
        button("Approve, then ask (default)", () => client.approve({ sessionId: sid, requestId: item.requestId, approve: true, mode: PlanExitMode.DEFAULT }), { class: "approve" }),
        reason,
        button("Deny", () => client.approve({ sessionId: sid, requestId: item.requestId, approve: false, reason: reason.value }), { class: "deny danger" }),
      ),
    );
    return el;
  }
  if (status === "pending") {
    const reason = h("input", { id: `deny-reason-${item.id}`, placeholder: "reason (for deny)", "aria-label": "deny reason" });
    el.append(
      h(
        "div",
        { class: "actions" },
        button("Approve", () => client.approve({ sessionId: sid, requestId: item.requestId, approve: true }), { class: "approve" }),
        button("Always", () => client.approve({ sessionId: sid, requestId: item.requestId, approve: true, always: true }), { class: "always" }),
        reason,
        button("Deny", () => client.approve({ sessionId: sid, requestId: item.requestId, approve: false, reason: reason.value }), { class: "deny danger" }),
      ),
    );
  }
  return el;
}

function sidePane(): HTMLElement {
  if (!state.side) return h("aside", { class: "side hidden" });
  if (state.side === "settings") {
    const close = () => {
      state.side = "";
      render();
    };
    return settingsPanel({ config: state.config, mcp: state.mcp, toolsOpen: state.mcpToolsOpen }, refreshMcp, close);
  }
  if (state.side === "tasks") {
    state.tasks.sessions = state.order.flatMap((id) => state.sessions.get(id)?.summary ?? []);
    return tasksPanel(state.tasks, {
      client,
      refresh: refreshTasks,
      render,
      open: (id) => {
        if (state.sessions.has(id)) select(id);
        else void refreshList().then(() => select(id), onErrorNow);
      },
      close: () => {
        state.side = "";
        render();
      },
    });
  }
  if (state.side === "workers") {
    return workersPanel(state.workers, {
      client,
      refresh: refreshWorkers,
      render,
      open: (id) => {
        if (state.sessions.has(id)) select(id);
        else void refreshList().then(() => select(id), onErrorNow);
      },
      close: () => {
        state.side = "";
        render();
      },
    });
  }
  if (state.side === "terminal") {
    return h(
      "aside",
      { class: "side side-terminal", id: "side" },
      h("div", { class: "side-head" }, h("strong", {}, "Terminal"), button("Close", () => {
        terminal.close();
        state.side = "";
        render();
      }, { class: "small", id: "close-terminal" })),
      terminal.el,
    );
  }
  return h(
    "aside",
    { class: "side", id: "side" },
    h("div", { class: "side-head" }, h("strong", {}, state.side === "files" ? "Files" : "Diff"), button("Close", () => {
      state.side = "";
      render();
    }, { class: "small" })),
    h("pre", { class: "plain", id: "side-text" }, state.sideText),
  );
}

// ---- actions ----

async function showFiles(): Promise<void> {
  // The current session's workspace (it may not be the server's own).
  const t = await client.listTree({ limit: 2000, sessionId: state.current || undefined });
  state.side = "files";
  state.sideText = t.files.join("\n") + (t.truncated ? "\n… (more files)" : "") || "(no files)";
  render();
}

/** Opens the settings and reads the MCP servers afresh (their state changes on its own). */
async function showSettings(): Promise<void> {
  state.side = "settings";
  render();
  await refreshMcp();
}

async function refreshMcp(): Promise<void> {
  state.mcp = await client.getMcpConfig({});
  render();
}

/** Opens the tasks panel and reads the list afresh. */
async function showTasks(): Promise<void> {
  state.side = "tasks";
  render();
  await refreshTasks();
}

/** Reads the tasks again; a script task's own new session is listed (and followed) too. */
async function refreshTasks(): Promise<void> {
  state.tasks.list = await client.listTasks({});
  const unlisted = state.tasks.list.tasks.some((t) => t.sessionId && !state.sessions.has(t.sessionId));
  if (unlisted) await refreshList();
  render();
}

let tasksTimer: ReturnType<typeof setTimeout> | undefined;
/** A fire's outcome lands soon after its result or its run's end: the open panel reads the list again, once per burst. */
function tasksChanged(): void {
  if (state.side !== "tasks" || tasksTimer) return;
  tasksTimer = setTimeout(() => {
    tasksTimer = undefined;
    void refreshTasks().catch(onErrorNow);
  }, 200);
}

/** Opens the workers panel for the open session and reads its lists afresh. */
async function showWorkers(): Promise<void> {
  state.side = "workers";
  render();
  await refreshWorkers();
}

async function refreshWorkers(): Promise<void> {
  await loadWorkers(state.workers, client, state.current);
  render();
}

let workersTimer: ReturnType<typeof setTimeout> | undefined;
/** A child or a dev server of the open session changed: the open panel reads again, once per burst. */
function workersChanged(sessionId: string): void {
  if (state.side !== "workers" || sessionId !== state.current || workersTimer) return;
  workersTimer = setTimeout(() => {
    workersTimer = undefined;
    void refreshWorkers().catch(onErrorNow);
  }, 200);
}

function showTerminal(): void {
  state.side = "terminal";
  render();
  terminal.open();
}

async function showDiff(): Promise<void> {
  if (!state.current) throw new Error("pick a session first");
  const d = await client.getDiff({ sessionId: state.current });
  state.side = "diff";
  state.sideText = d.reason ? `${enumJsonName(DiffReasonSchema, d.reason)}: ${d.message}` : d.diff || "(no changes)";
  render();
}

async function create(): Promise<void> {
  const { sessionId } = await client.createSession({ workspace: state.newWorkspace });
  const [summary] = (await client.listSessions({})).sessions.filter((s) => s.sessionId === sessionId);
  addSession(summary ?? ({ sessionId, title: "", busy: false } as SessionSummary));
  await follower?.follow(sessionId);
  select(sessionId);
}

async function remove(id: string): Promise<void> {
  // Unfollowed first: once deleted, the stream no longer knows the session (404).
  await follower?.unfollow(id).catch(() => undefined);
  try {
    await client.deleteSession({ sessionId: id });
  } catch (err) {
    await follower?.follow(id).catch(() => undefined);
    throw err;
  }
  state.sessions.delete(id);
  state.order = state.order.filter((x) => x !== id);
  state.confirmDelete = "";
  if (state.current === id) select(state.order[0] ?? "");
  render();
}

function addSession(summary: SessionSummary): void {
  if (state.sessions.has(summary.sessionId)) return;
  state.sessions.set(summary.sessionId, { summary, busy: summary.busy, timeline: empty(), clients: [] });
  state.order.unshift(summary.sessionId);
}

function select(id: string): void {
  state.current = id;
  state.side = state.side === "diff" ? "" : state.side;
  const path = id ? `/app/s/${id}` : "/app/";
  if (location.pathname !== path) history.pushState(null, "", path);
  const s = state.sessions.get(id);
  // A session beyond the followed ones: its timeline by GET, not live.
  if (s && !follower?.sessions.includes(id)) {
    void client.getPresentation({ sessionId: id }).then((t) => {
      s.timeline = fromSnapshot(t);
      schedule();
    }, onErrorNow);
  }
  render();
  // The panel shows the open session's children.
  if (state.side === "workers") void refreshWorkers().catch(onErrorNow);
}

window.addEventListener("popstate", () => {
  const m = /^\/app\/s\/([\w-]+)/.exec(location.pathname);
  state.current = m?.[1] ?? "";
  render();
});

// ---- start ----

async function authenticated(): Promise<boolean> {
  const key = currentKey(base);
  if (!key) return false;
  const r = await fetch(`${base}/auth/session`, { headers: { "x-vak-key": key }, credentials: "same-origin" });
  if (!r.ok) return false;
  return ((await r.json()) as { authenticated?: boolean }).authenticated === true;
}

async function start(): Promise<void> {
  state.errors = [];
  if (!(await authenticated())) {
    state.authenticated = false;
    render();
    return;
  }
  state.authenticated = true;
  client = createAgentClient({ baseUrl: base });
  const [list, config, host] = await Promise.all([client.listSessions({}), client.getConfig({}), client.getHost({})]);
  state.config = config;
  state.host = host;
  state.sessions.clear();
  // Newest first.
  const sorted = [...list.sessions].sort((a, b) => (a.createdAt < b.createdAt ? 1 : a.createdAt > b.createdAt ? -1 : 0));
  state.order = [];
  for (const s of sorted.reverse()) addSession(s);
  const m = /^\/app\/s\/([\w-]+)/.exec(location.pathname);
  state.current = m?.[1] && state.sessions.has(m[1]) ? m[1] : state.order[0] ?? "";

  follower?.close();
  follower = new StreamFollower({ baseUrl: base, sessions: state.order.slice(0, FOLLOW_CAP), config: true });
  follower.on("presentation", (ev) => {
    const s = state.sessions.get(ev.sessionId);
    if (s && apply(s.timeline, ev)) schedule();
  });
  follower.on("agent", (ev) => {
    const s = state.sessions.get(ev.sessionId);
    if (!s) return;
    if (ev.kind.case === "status") {
      s.busy = ev.kind.value.busy;
      schedule();
    } else if (ev.kind.case === "userMessage" && !s.summary.title) {
      s.summary.title = ev.kind.value.text.split("\n")[0]?.slice(0, 80) ?? "";
      schedule();
    } else if (ev.kind.case === "backgroundResult" || ev.kind.case === "runFinished") {
      tasksChanged();
    } else if (["worker", "workbench", "draftDiscarded", "launchOutput"].includes(ev.kind.case ?? "")) {
      workersChanged(ev.sessionId);
    }
  });
  follower.on("resync", (ev) => {
    // The transcript replaces the events; the timeline comes again by GET.
    void client.getPresentation({ sessionId: ev.sessionId }).then((t) => {
      const s = state.sessions.get(ev.sessionId);
      if (s) s.timeline = fromSnapshot(t);
      schedule();
    }, onErrorNow);
  });
  follower.on("coworking", (c) => {
    const s = state.sessions.get(c.sessionId);
    if (!s) return;
    s.clients = c.clients;
    schedule();
  });
  follower.on("config", (c) => {
    state.config = c;
    schedule();
  });
  follower.on("error", () => {
    // A stream refused (401) looks like any drop to EventSource: ask whether the login holds.
    void authenticated().then((yes) => {
      if (!yes && state.authenticated) loggedOut();
    }, () => undefined);
  });
  follower.on("state", (st) => {
    state.conn = st;
    state.connHistory.push(st);
    if (state.connHistory.length > 100) state.connHistory.shift();
    schedule();
  });
  follower.start();
  select(state.current);
  clearInterval(listTimer);
  listTimer = setInterval(() => {
    void refreshList().catch(() => undefined);
    // Scheduled fires move next_fire and last_fire with no event of their own here.
    if (state.side === "tasks") void refreshTasks().catch(() => undefined);
    // A child's state between its events (a crashed dev server has none).
    if (state.side === "workers") void refreshWorkers().catch(() => undefined);
  }, LIST_EVERY_MS);
}

/** Sessions another client created or deleted show up within this long (no event says so). */
const LIST_EVERY_MS = 5000;
let listTimer: ReturnType<typeof setInterval> | undefined;

async function refreshList(): Promise<void> {
  if (!state.authenticated || !follower) return;
  const list = await client.listSessions({});
  const ids = new Set(list.sessions.map((s) => s.sessionId));
  let changed = false;
  for (const s of [...list.sessions].reverse()) {
    if (state.sessions.has(s.sessionId)) continue;
    addSession(s);
    changed = true;
    if (follower.sessions.length < FOLLOW_CAP) await follower.follow(s.sessionId);
  }
  for (const id of [...state.order]) {
    if (ids.has(id)) continue;
    state.sessions.delete(id);
    state.order = state.order.filter((x) => x !== id);
    await follower.unfollow(id).catch(() => undefined);
    changed = true;
  }
  if (changed) schedule();
}

void start().catch((err) => {
  state.errors.push(message(err));
  render();
});
