// The operations console served at /admin: sessions with their state and seq
// and who is attached, connected clients with their open streams and the
// stream caps, the live /stream connections, the effective config and
// providers (key fingerprints, never key values), the server's recent
// failures, the scheduler's next fires and its time zone, and the day's model
// spend against [finops] max_day_usd (GetAdminStatus); and two actions: cancel a session's run, close
// (delete) a session, each saying what it did. Who is attached reads as the
// kind of client and how long it has been attached, never raw stream ids.
// Read through the same gRPC-web client and login as the app; refreshed live
// from GET /stream (status frames) and every few seconds.
import "./app.css";
import { ConnectError } from "@connectrpc/connect";
import {
  createAgentClient,
  enumJsonName,
  KeySourceSchema,
  PermissionModeSchema,
  RouteSourceSchema,
  StreamFollower,
  SurfaceSchema,
  type AdminStatus,
  type Client,
  type ConfigInfo,
  type ListProvidersResponse,
  type SessionSummary,
} from "../src/index.js";
import { button, h, onError } from "./dom.js";
import { currentKey } from "./login.js";

const base = location.origin;
// The key the shell was opened with (`/admin?key=`, the app's link) or the app's.
const urlKey = new URLSearchParams(location.search).get("key") ?? undefined;
const key = currentKey(base) ?? urlKey;
const client = createAgentClient({ baseUrl: base, key });
const root = document.getElementById("root") as HTMLElement;
const state = {
  sessions: [] as SessionSummary[],
  config: undefined as ConfigInfo | undefined,
  providers: undefined as ListProvidersResponse | undefined,
  status: undefined as AdminStatus | undefined,
  errors: [] as string[],
  conn: "idle",
  /** What the last action did. */
  notice: "",
  /** The session whose Close asks once more. */
  confirmClose: "",
};

const SURFACE_WORDS: Record<string, string> = { stream: "a browser tab or app", sse: "an SSE follower", grpc: "a gRPC client" };
const CONN_WORDS: Record<string, string> = { idle: "offline", connecting: "connecting…", open: "live", reconnecting: "reconnecting…", closed: "offline" };

/** "under a minute", "5 min", "2 h": how long ago `ms` (epoch milliseconds) was. */
function age(ms: number): string {
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 60) return "under a minute";
  if (s < 3600) return `${Math.round(s / 60)} min`;
  return `${Math.round(s / 3600)} h`;
}

/** One attached client in words: its kind, and how long it has been attached. */
function clientWords(c: Client): Node {
  const surface = enumJsonName(SurfaceSchema, c.surface);
  const since = Date.parse(c.attachedAt);
  const how = Number.isNaN(since) ? "" : `, for ${age(since)}`;
  return h("span", { class: "client", title: `client id ${c.clientId}, attached ${c.attachedAt}` }, `${SURFACE_WORDS[surface] ?? surface}${how}`);
}
declare global {
  interface Window {
    vakAdmin: unknown;
  }
}
window.vakAdmin = { state };

function message(err: unknown): string {
  return err instanceof ConnectError ? `${err.code}: ${err.rawMessage}` : err instanceof Error ? err.message : String(err);
}
onError((err) => {
  state.errors.push(`${new Date().toISOString()} ${message(err)}`);
  if (state.errors.length > 50) state.errors.shift();
  render();
});

function table(head: string[], rows: (Node | string)[][], id: string, keys: string[] = []): HTMLElement {
  return h(
    "div",
    // Scrolled sideways on a phone: focusable, so the keyboard can scroll it too.
    { class: "table-wrap", tabindex: "0", role: "region", "aria-label": id.replace(/^admin-/, "").replace("-", " ") },
    h(
      "table",
      { id },
      h("thead", {}, h("tr", {}, ...head.map((x) => h("th", { scope: "col" }, x || h("span", { class: "sr-only" }, "actions"))))),
      // Each cell names its column: on a phone a row is a card of labelled lines (app.css).
      h("tbody", {}, ...rows.map((r, n) => h("tr", { "data-key": keys[n] }, ...r.map((c, i) => h("td", { "data-label": head[i] ?? "" }, c))))),
    ),
  );
}

function runState(s: SessionSummary): Node {
  if (s.busy) return h("span", { class: "state-busy" }, "running");
  return document.createTextNode(s.loaded ? "idle (in memory)" : "on disk");
}

function sessionActions(s: SessionSummary): HTMLElement {
  const name = s.title ? `“${s.title}”` : `session ${s.sessionId.slice(0, 8)}`;
  const confirming = state.confirmClose === s.sessionId;
  return h(
    "span",
    { class: "actions", "data-session": s.sessionId },
    s.busy
      ? button("Cancel run", async () => {
          await client.cancel({ sessionId: s.sessionId });
          state.notice = `Cancelled the run of ${name}.`;
          await refresh();
        }, { class: "small", "aria-label": `Cancel run of ${name}` })
      : "",
    confirming
      ? button("Really close?", async () => {
          await client.deleteSession({ sessionId: s.sessionId });
          state.confirmClose = "";
          state.notice = `Closed ${name}: the session and its history are deleted.`;
          await refresh();
        }, { class: "small danger", "aria-label": `Really close? ${name}` })
      : button("Close session", () => {
          state.confirmClose = s.sessionId;
          render();
        }, { class: "small danger", "aria-label": `Close session ${name} (deletes it)` }),
  );
}

function render(): void {
  const c = state.config;
  const st = state.status;
  const attached = (id: string): Node => {
    const list = st?.sessions.find((p) => p.sessionId === id)?.clients ?? [];
    if (!list.length) return document.createTextNode("nobody");
    const ul = h("ul", { class: "clients" });
    for (const c of list) ul.appendChild(h("li", {}, clientWords(c)));
    return ul;
  };
  root.replaceChildren(
    h(
      "div",
      { class: "admin" },
      h(
        "header",
        { class: "top" },
        h("h1", { class: "brand" }, "vak admin"),
        h("span", { class: `conn conn-${state.conn}`, id: "conn", role: "status", "data-state": state.conn, title: "this page's live connection to the server" }, h("span", { class: "conn-dot", "aria-hidden": "true" }), CONN_WORDS[state.conn] ?? state.conn),
        h("a", { href: "/app/", class: "admin-link" }, "Back to the app"),
      ),
      h("p", { class: "notice", id: "admin-notice", role: "status" }, state.notice),
      h("h2", {}, "Sessions"),
      table(
        ["session", "run", "events", "attached", "created", ""],
        state.sessions.map((s) => [
          // Its title, and the start of its id (the whole id on hover).
          h("span", { class: "session-name" }, h("span", { class: s.title ? "" : "untitled" }, s.title || "untitled"), " ", h("code", { title: s.sessionId }, s.sessionId.slice(0, 8))),
          runState(s),
          String(s.latestSeq),
          attached(s.sessionId),
          h("span", { class: "nowrap" }, s.createdAt.replace("T", " ").replace(/\.\d+Z$|Z$/, " UTC")),
          sessionActions(s),
        ]),
        "admin-sessions",
        state.sessions.map((s) => s.sessionId),
      ),
      h("h2", {}, "Clients and streams"),
      h(
        "p",
        { id: "admin-caps" },
        st
          ? `${st.openStreams} of ${st.maxStreams} streams open; at most ${st.maxStreamsPerClient} per client; ${st.streams.length} live /stream ${st.streams.length === 1 ? "connection" : "connections"} (browser tabs and apps)`
          : "",
      ),
      table(["client address", "open streams"], (st?.clients ?? []).map((x) => [x.client, String(x.openStreams)]), "admin-clients"),
      h("h2", {}, "Configuration"),
      c
        ? table(
            ["setting", "value"],
            [
              ["route", `${c.route?.provider ?? ""} · ${c.route?.model ?? ""} (${c.route ? enumJsonName(RouteSourceSchema, c.route.source) : ""})`],
              ["base url", c.route?.baseUrl ?? "(the service's own)"],
              ["permission mode", enumJsonName(PermissionModeSchema, c.permissionMode)],
              ["max turns", String(c.maxTurns)],
              ["replay ring", String(c.ring)],
              ["revision", c.revision],
            ],
            "admin-config",
          )
        : "",
      h("h2", {}, "Providers"),
      table(
        ["provider", "configured", "keys", "key sources", "fingerprints"],
        (state.providers?.providers ?? []).map((p) => [
          p.label || p.name,
          p.configured ? "yes" : "no",
          String(p.poolSize),
          p.keySources.map((s) => enumJsonName(KeySourceSchema, s)).join(", "),
          p.fingerprints.join(", "),
        ]),
        "admin-providers",
      ),
      h("h2", {}, "Scheduler"),
      h("p", { id: "admin-timezone" }, st ? `Schedules are read in ${st.timezone || "the server's time zone"}.` : ""),
      table(
        ["next fire", "task", "name"],
        (st?.scheduler ?? []).map((f) => [f.nextFire, h("code", {}, f.taskId), f.name]),
        "admin-scheduler",
      ),
      h("h2", {}, "Spend"),
      spend(st),
      h("h2", {}, "Recent errors"),
      table(
        ["at", "request", "status", "message"],
        (st?.recentErrors ?? []).map((e) => [
          e.at,
          `${e.method} ${e.path}`,
          e.grpcStatus !== undefined ? `${e.status} (grpc ${e.grpcStatus})` : String(e.status),
          e.message,
        ]),
        "admin-errors",
      ),
      h("h3", {}, "This page's errors"),
      h("pre", { class: "errors", id: "errors" }, state.errors.join("\n") || "none"),
    ),
  );
}

/** Today's model spend, and the share of [finops] max_day_usd it is when one is set. */
function spend(st: AdminStatus | undefined): HTMLElement {
  if (!st) return h("p", { id: "admin-spend" });
  const today = `$${st.todayUsd.toFixed(4)}`;
  const max = st.maxDayUsd;
  if (max === undefined) return h("p", { id: "admin-spend", "data-over": "false" }, `Today: ${today} (no daily budget: [finops] max_day_usd is not set)`);
  const share = max > 0 ? Math.round((st.todayUsd / max) * 100) : 100;
  const over = st.todayUsd >= max;
  return h(
    "p",
    { id: "admin-spend", class: over ? "spend-over" : "", "data-over": over ? "true" : "false" },
    `Today: ${today} of $${max.toFixed(2)} (${share}% of the daily budget)`,
  );
}

async function refresh(): Promise<void> {
  const [list, config, providers, status] = await Promise.all([
    client.listSessions({}),
    client.getConfig({}),
    client.listProviders({}),
    client.getAdminStatus({}),
  ]);
  state.status = status;
  state.sessions = [...list.sessions].sort((a, b) => (a.createdAt < b.createdAt ? 1 : -1));
  state.config = config;
  state.providers = providers;
  render();
}

async function start(): Promise<void> {
  await refresh();
  // Busy state moves with every run: follow the listed sessions' status frames.
  const f = new StreamFollower({ baseUrl: base, key, sessions: state.sessions.slice(0, 64).map((s) => s.sessionId), config: true });
  f.on("agent", (ev) => {
    if (ev.kind.case !== "status") return;
    const s = state.sessions.find((x) => x.sessionId === ev.sessionId);
    if (s) {
      s.busy = ev.kind.value.busy;
      if (ev.seq > s.latestSeq) s.latestSeq = ev.seq;
      render();
    }
  });
  f.on("config", (c) => {
    state.config = c;
    render();
  });
  f.on("state", (st) => {
    state.conn = st;
    render();
    // Once open, this page's own stream is one of the streams listed.
    if (st === "open") void refresh().catch(onErrorNow);
  });
  f.start();
  setInterval(() => void refresh().catch((e) => onErrorNow(e)), 5000);
}

function onErrorNow(err: unknown): void {
  state.errors.push(`${new Date().toISOString()} ${message(err)}`);
  render();
}

void start().catch(onErrorNow);
