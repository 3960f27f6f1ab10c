// The operations console served at /admin: sessions with their state and seq
// and who is attached, connected clients with their open streams and the
// stream caps, the live /stream connections, the effective config and
// providers (key fingerprints, never key values), the server's recent
// failures, the scheduler's next fires and its time zone, and the day's model
// spend against [finops] max_day_usd (GetAdminStatus); and two actions: cancel a session's run, close
// (delete) a session. Read through the same gRPC-web client and login as the
// app; refreshed live from GET /stream (status frames) and every few seconds.
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
};
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

function table(head: string[], rows: (Node | string)[][], id: string): HTMLElement {
  return h(
    "table",
    { id },
    h("thead", {}, h("tr", {}, ...head.map((x) => h("th", {}, x)))),
    h("tbody", {}, ...rows.map((r) => h("tr", {}, ...r.map((c) => h("td", {}, c))))),
  );
}

function render(): void {
  const c = state.config;
  const st = state.status;
  const attached = (id: string) =>
    (st?.sessions.find((p) => p.sessionId === id)?.clients ?? []).map((x) => `${enumJsonName(SurfaceSchema, x.surface)} ${x.clientId}`).join(", ");
  root.replaceChildren(
    h(
      "div",
      { class: "admin" },
      h("header", { class: "top" }, h("strong", {}, "vak admin"), h("span", { class: "conn", id: "conn", "data-state": state.conn }, state.conn), h("a", { href: "/app/" }, "app")),
      h("h2", {}, "Sessions"),
      table(
        ["session", "title", "state", "seq", "attached", "created", ""],
        state.sessions.map((s) => [
          h("code", {}, s.sessionId),
          s.title,
          s.busy ? "busy" : s.loaded ? "idle" : "on disk",
          String(s.latestSeq),
          attached(s.sessionId),
          s.createdAt,
          h(
            "span",
            { class: "actions", "data-session": s.sessionId },
            s.busy ? button("Cancel run", () => client.cancel({ sessionId: s.sessionId }).then(refresh), { class: "small" }) : "",
            button("Close session", () => client.deleteSession({ sessionId: s.sessionId }).then(refresh), { class: "small danger" }),
          ),
        ]),
        "admin-sessions",
      ),
      h("h2", {}, "Clients and streams"),
      h(
        "p",
        { id: "admin-caps" },
        st
          ? `${st.openStreams} of ${st.maxStreams} streams open; at most ${st.maxStreamsPerClient} per client; live /stream connections: ${st.streams.join(", ") || "none"}`
          : "",
      ),
      table(["client", "open streams"], (st?.clients ?? []).map((x) => [x.client, String(x.openStreams)]), "admin-clients"),
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
