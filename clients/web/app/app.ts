// The browser app served at /app: login, then the session list (sidebar.ts),
// the open conversation (conversation.ts, toolcard.ts), the header with the
// model, mode, connection and viewers (status.ts), and a right-hand panel
// whose tabs are the workspace's files, its diff (diff.ts), the scheduled
// tasks (tasks.ts), the session's workers (workers.ts), the session's goal and plan
// (plan.ts), a terminal (terminal.ts) and the settings (settings.ts). Every
// listed session is followed live on one GET /stream (resumed with its
// cursor vector).
// This file holds the start, the stream's handlers and the actions; state.ts
// what the page knows. Calls go through the package's gRPC-web client with
// the login cookie and its session key; nothing the server or the model
// sends is parsed as HTML.
import "./app.css";
import { Code, ConnectError } from "@connectrpc/connect";
import {
  createAgentClient,
  enumJsonName,
  logout,
  StopReasonSchema,
  StreamFollower,
  type Commitment,
  type SessionSummary,
  type Verdict,
} from "../src/index.js";
import { button, h, onError } from "./dom.js";
import { conversationPane } from "./conversation.js";
import { diffPanel, diffView } from "./diff.js";
import { appLogin, currentKey, forgetKey, shareKey, ticketLogin } from "./login.js";
import { settingsPanel } from "./settings.js";
import { sidebar } from "./sidebar.js";
import { ctx, describe, newSessionView, onErrorNow, state, titleOf, type Side } from "./state.js";
import { header } from "./status.js";
import { tasksPanel } from "./tasks.js";
import { applyTheme } from "./theme.js";
import { loadWorkers, workersPanel } from "./workers.js";
import { isPlanItem, planPanel } from "./plan.js";
import { TerminalPanel } from "./terminal.js";
import { apply, fromSnapshot } from "./timeline.js";

const base = location.origin;
/** At most this many sessions are followed live on the one stream (the server's cap is 64). */
const FOLLOW_CAP = 64;

const root = document.getElementById("root") as HTMLElement;
const terminal = new TerminalPanel(base, () => currentKey(base) ?? "");

declare global {
  interface Window {
    vakApp: unknown;
  }
}
window.vakApp = { state, terminal, get follower() { return ctx.follower; } };

onError((err) => {
  if (err instanceof ConnectError && err.code === Code.Unauthenticated) return loggedOut();
  onErrorNow(err);
});

/** The login ended (expired, logged out elsewhere, another token): back to the form. */
function loggedOut(): void {
  clearInterval(listTimer);
  ctx.follower?.close();
  ctx.follower = undefined;
  forgetKey();
  state.authenticated = false;
  state.errors = ["Your login ended (it expired, the server's token changed, or you logged out): log in again."];
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

/** A notice says what the last action did, for a few seconds. */
const NOTICE_MS = 6000;
let noticeShown = "";

function render(): void {
  applyTheme(state.config);
  if (state.notice && state.notice !== noticeShown) {
    const n = (noticeShown = state.notice);
    setTimeout(() => {
      if (state.notice !== n) return;
      state.notice = noticeShown = "";
      schedule();
    }, NOTICE_MS);
  }
  const scroller = root.querySelector("#scroll");
  const atBottom = !scroller || scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 40;
  const listScroll = root.querySelector("#sessions")?.scrollTop ?? 0;
  const focused = document.activeElement;
  const keep = focused instanceof HTMLElement && focused.id ? focused.id : "";
  const caret = focused instanceof HTMLTextAreaElement || focused instanceof HTMLInputElement ? [focused.selectionStart, focused.selectionEnd] : undefined;
  const drafts = new Map<string, string>();
  for (const el of root.querySelectorAll<HTMLInputElement | HTMLTextAreaElement>("input[id], textarea[id]")) {
    drafts.set(el.id, el.value);
  }
  root.replaceChildren(state.authenticated ? workspace() : loginForm());
  for (const [id, v] of drafts) {
    const el = document.getElementById(id) as HTMLInputElement | null;
    if (el && el.type !== "password") el.value = v;
  }
  if (keep) {
    const el = document.getElementById(keep) as HTMLElement | null;
    el?.focus({ preventScroll: true });
    if (caret && (el instanceof HTMLTextAreaElement || el instanceof HTMLInputElement)) {
      try {
        el.setSelectionRange(caret[0] ?? null, caret[1] ?? null);
      } catch {
        // (an input type without a caret)
      }
    }
  }
  const list = root.querySelector("#sessions");
  if (list) list.scrollTop = listScroll;
  const conv = root.querySelector("#scroll");
  if (conv && (atBottom || ctx.toBottom)) conv.scrollTop = conv.scrollHeight;
  if (conv) ctx.toBottom = false;
}

function loginForm(): HTMLElement {
  const input = h("input", { id: "token", type: "password", autocomplete: "current-password", required: true, "aria-describedby": "token-help" });
  const form = h(
    "form",
    { class: "login", id: "login", "aria-labelledby": "login-title" },
    h("h1", { id: "login-title" }, "Log in to vak"),
    h("label", { for: "token" }, "Token"),
    input,
    h(
      "p",
      { class: "hint", id: "token-help" },
      "The server's access token. On the machine vak serve runs on, ",
      h("code", {}, "vak token"),
      " prints it (it is also in server.json in vak's home folder).",
    ),
    h("button", { type: "submit", class: "primary" }, "Log in"),
    errors(),
  );
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    void appLogin(base, input.value.trim())
      .then((key) => {
        shareKey(key);
        return start();
      })
      .catch((err) => {
        state.errors = [describe(err)];
        render();
        document.getElementById("token")?.focus();
      });
  });
  return form;
}

function errors(): HTMLElement {
  const el = h("div", { class: "errors", id: "errors", role: "alert" });
  if (state.errors.length) {
    el.append(h("pre", {}, state.errors.join("\n")));
    if (state.authenticated)
      el.append(
        button("Dismiss", () => {
          state.errors = [];
          render();
        }, { class: "small", id: "dismiss-errors" }),
      );
  }
  return el;
}

function workspace(): HTMLElement {
  return h(
    "div",
    { class: `layout${state.side ? " with-side" : ""}${state.drawer ? " drawer-open" : ""}` },
    header(),
    h("p", { class: "notice", id: "notice", role: "status" }, state.notice),
    sidebar(),
    state.drawer
      ? button("", () => {
          state.drawer = false;
          render();
        }, { class: "backdrop", "aria-label": "close the session list", tabindex: "-1" })
      : null,
    conversationPane(errors),
    sidePane(),
  );
}

function close(): void {
  if (state.side === "terminal") terminal.close();
  state.side = "";
  render();
}

function sidePane(): HTMLElement | null {
  if (!state.side) return null;
  if (state.side === "settings") {
    return settingsPanel({ config: state.config, mcp: state.mcp, toolsOpen: state.mcpToolsOpen }, refreshMcp, close);
  }
  if (state.side === "tasks") {
    state.tasks.sessions = state.order.flatMap((id) => state.sessions.get(id)?.summary ?? []);
    return tasksPanel(state.tasks, { client: ctx.client, refresh: refreshTasks, render, open: openListed, close });
  }
  if (state.side === "workers") {
    return workersPanel(state.workers, { client: ctx.client, refresh: refreshWorkers, render, open: openListed, close });
  }
  if (state.side === "plan") {
    return planPanel(state.sessions.get(state.current), state.plan, {
      close,
      render,
      closeCommitment,
      notice: (text) => {
        state.notice = text;
      },
    });
  }
  if (state.side === "terminal") {
    return h(
      "aside",
      { class: "side side-terminal", id: "side", "aria-label": "terminal" },
      h("div", { class: "side-head" }, h("h2", {}, "Terminal"), button("Close", close, { class: "small", id: "close-terminal" })),
      terminal.el,
    );
  }
  const files = state.side === "files";
  return h(
    "aside",
    { class: `side side-${state.side}`, id: "side", "aria-label": files ? "files" : "diff" },
    h("div", { class: "side-head" }, h("h2", {}, files ? "Files" : "Changes"), button("Close", close, { class: "small", id: `close-${state.side}` })),
    files ? h("pre", { class: "plain files", id: "side-text" }, state.sideText) : diffPanel(state.diff, state.open),
  );
}

function openListed(id: string): void {
  if (state.sessions.has(id)) select(id);
  else void refreshList().then(() => select(id), onErrorNow);
}

// ---- actions ----

async function openSide(side: Side): Promise<void> {
  if (state.side === "terminal" && side !== "terminal") terminal.close();
  state.drawer = false;
  if (side === "files") return showFiles();
  if (side === "diff") return showDiff();
  state.side = side;
  render();
  if (side === "settings") await refreshMcp();
  else if (side === "tasks") await refreshTasks();
  else if (side === "workers") await refreshWorkers();
  else if (side === "terminal") terminal.open();
}

async function showFiles(): Promise<void> {
  // The current session's workspace (it may not be the server's own).
  const t = await ctx.client.listTree({ limit: 2000, sessionId: state.current || undefined });
  state.side = "files";
  state.sideText = t.files.join("\n") + (t.truncated ? "\n… (more files)" : "") || "(no files)";
  render();
}

async function showDiff(): Promise<void> {
  if (!state.current) throw new Error("Pick a session first: the diff is of its workspace.");
  state.side = "diff";
  state.diff = undefined;
  render();
  state.diff = diffView(await ctx.client.getDiff({ sessionId: state.current }));
  render();
}

async function refreshMcp(): Promise<void> {
  state.mcp = await ctx.client.getMcpConfig({});
  render();
}

/** Reads the tasks again; a script task's own new session is listed (and followed) too. */
async function refreshTasks(): Promise<void> {
  state.tasks.list = await ctx.client.listTasks({});
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

/**
 * Closes a commitment of the open session's plan. Its plan_item comes again
 * on the stream (item_replaced); the answer is shown at once meanwhile.
 */
async function closeCommitment(id: string, verdict: Verdict): Promise<Commitment> {
  const closed = await ctx.client.closeCommitment({ id, verdict });
  const s = state.sessions.get(closed.sessionId);
  const item = s?.timeline.items.find((i) => isPlanItem(i) && i.commitment?.id === closed.id);
  if (item) item.commitment = closed;
  return closed;
}

async function refreshWorkers(): Promise<void> {
  await loadWorkers(state.workers, ctx.client, state.current);
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

async function create(): Promise<void> {
  const { sessionId } = await ctx.client.createSession({ workspace: state.newWorkspace });
  const [summary] = (await ctx.client.listSessions({})).sessions.filter((s) => s.sessionId === sessionId);
  addSession(summary ?? ({ sessionId, title: "", busy: false, createdAt: new Date().toISOString() } as SessionSummary));
  await ctx.follower?.follow(sessionId);
  state.drawer = false;
  select(sessionId);
  document.getElementById("prompt")?.focus();
}

async function remove(id: string): Promise<void> {
  const title = titleOf(state.sessions.get(id), id);
  // Unfollowed first: once deleted, the stream no longer knows the session (404).
  await ctx.follower?.unfollow(id).catch(() => undefined);
  try {
    await ctx.client.deleteSession({ sessionId: id });
  } catch (err) {
    await ctx.follower?.follow(id).catch(() => undefined);
    throw err;
  }
  state.sessions.delete(id);
  state.order = state.order.filter((x) => x !== id);
  state.confirmDelete = "";
  state.menu = "";
  state.notice = `Deleted “${title}”.`;
  if (state.current === id) select(state.order[0] ?? "");
  render();
}

function addSession(summary: SessionSummary): void {
  if (state.sessions.has(summary.sessionId)) return;
  state.sessions.set(summary.sessionId, newSessionView(summary));
  state.order.unshift(summary.sessionId);
}

function select(id: string): void {
  if (id !== state.current) ctx.toBottom = true;
  state.current = id;
  state.side = state.side === "diff" ? "" : state.side;
  const path = id ? `/app/s/${id}` : "/app/";
  if (location.pathname !== path) history.pushState(null, "", path);
  const s = state.sessions.get(id);
  // A session beyond the followed ones: its timeline by GET, not live.
  if (s && !ctx.follower?.sessions.includes(id)) {
    void ctx.client.getPresentation({ sessionId: id }).then((t) => {
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

// Esc closes the drawer or a row menu (the composer's own Esc stops a run first).
document.addEventListener("keydown", (e) => {
  if (e.key !== "Escape" || e.defaultPrevented) return;
  if (state.drawer || state.menu) {
    const menu = state.menu;
    state.drawer = false;
    state.menu = "";
    state.confirmDelete = "";
    render();
    // Back on the button that opened the menu.
    if (menu) document.getElementById(`menu-${menu}`)?.focus();
  }
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
    document.getElementById("token")?.focus();
    return;
  }
  state.authenticated = true;
  const client = createAgentClient({ baseUrl: base });
  ctx.client = client;
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

  ctx.follower?.close();
  const follower = new StreamFollower({ baseUrl: base, sessions: state.order.slice(0, FOLLOW_CAP), config: true });
  ctx.follower = follower;
  follower.on("presentation", (ev) => {
    const s = state.sessions.get(ev.sessionId);
    if (s && apply(s.timeline, ev)) schedule();
  });
  follower.on("agent", (ev) => {
    const s = state.sessions.get(ev.sessionId);
    if (!s) return;
    s.active = Date.now();
    const kind = ev.kind.case;
    // The retrying line stays until the run's next event.
    if (s.retrying && kind !== "status") {
      s.retrying = undefined;
      schedule();
    }
    if (kind === "status") {
      s.busy = ev.kind.value.busy;
      const r = ev.kind.value.retrying;
      s.retrying = r ? { attempt: r.attempt, of: r.of, reason: r.reason } : undefined;
      schedule();
    } else if (kind === "userMessage" && !s.summary.title) {
      s.summary.title = ev.kind.value.text.split("\n")[0]?.slice(0, 80) ?? "";
      schedule();
    } else if (kind === "runFinished") {
      const stop = ev.kind.value.stopReason;
      // The final_result item run_finished opens is named by its seq (docs/protocol.md section 16).
      if (stop !== undefined) s.stopReasons.set(`result-${ev.seq}`, enumJsonName(StopReasonSchema, stop));
      s.retrying = undefined;
      tasksChanged();
      schedule();
    } else if (kind === "backgroundResult") {
      tasksChanged();
    } else if (["worker", "workbench", "draftDiscarded", "launchOutput"].includes(kind ?? "")) {
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
  let ticks = 0;
  listTimer = setInterval(() => {
    // The sidebar's relative times move on without any event.
    if (++ticks % 12 === 0) schedule();
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
  const follower = ctx.follower;
  if (!state.authenticated || !follower) return;
  const list = await ctx.client.listSessions({});
  const ids = new Set(list.sessions.map((s) => s.sessionId));
  let changed = false;
  for (const s of [...list.sessions].reverse()) {
    const known = state.sessions.get(s.sessionId);
    if (known) {
      // A rename elsewhere, or a session beyond the followed ones going busy.
      if (known.summary.title !== s.title && state.renaming !== s.sessionId) {
        known.summary.title = s.title;
        changed = true;
      }
      if (!follower.sessions.includes(s.sessionId) && known.busy !== s.busy) {
        known.busy = s.busy;
        changed = true;
      }
      continue;
    }
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

Object.assign(ctx, {
  render,
  schedule,
  select,
  create,
  remove,
  openSide,
  logout: async () => {
    ctx.follower?.close();
    forgetKey();
    await logout(base);
    state.authenticated = false;
    render();
  },
});

// A one-time login link first, then whatever login this browser already has
// (a spent link is said once the page shows, since start() clears old errors).
let refusedLink: string | undefined;
void ticketLogin(base)
  .then((key) => {
    if (key) shareKey(key);
  })
  .catch((err) => {
    refusedLink = describe(err);
  })
  .then(() => start())
  .then(() => {
    if (refusedLink) {
      state.errors.push(refusedLink);
      render();
    }
  })
  .catch((err) => {
    state.errors.push(describe(err));
    render();
  });
