// What the app knows (window.vakApp exposes it to the browser test) and the
// handles its view modules share: the client, the stream, re-rendering and
// the few actions a view starts. app.ts fills `ctx` in at start, so the view
// modules (sidebar, conversation, status, panels) import this file and dom.ts
// only, never app.ts or each other in a cycle.
import type {
  AgentClient,
  Client,
  ConfigInfo,
  FollowerState,
  HostInfo,
  McpConfig,
  SearchHit,
  SessionSummary,
  StreamFollower,
} from "../src/index.js";
import type { TasksView } from "./tasks.js";
import { emptyWorkers } from "./workers.js";
import { emptyPlan } from "./plan.js";
import { emptySlash } from "./slash.js";
import { empty, type Timeline } from "./timeline.js";
import type { DiffView } from "./diff.js";

/** A run waiting to try the model service again (status.retrying), shown until its next event. */
export interface RetryLine {
  attempt: number;
  of: number;
  reason: string;
}

export interface SessionView {
  summary: SessionSummary;
  busy: boolean;
  timeline: Timeline;
  /** Who is attached (coworking presence), this tab's own stream included. */
  clients: Client[];
  /** When this page last saw the session change (ms since the epoch; 0: not while open). */
  active: number;
  retrying: RetryLine | undefined;
  /** run_finished's stop_reason ("max_tokens", "refusal", "content_filter") by the final_result item it made. */
  stopReasons: Map<string, string>;
}

export type Side = "" | "files" | "diff" | "terminal" | "settings" | "tasks" | "workers" | "plan";

export const state = {
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
  /** Thinking, tool output and inputs the user opened, by item id (kept across re-renders). */
  open: new Set<string>(),
  side: "" as Side,
  /** The Files tab: the workspace's paths (or a line saying why not). */
  sideText: "",
  /** The Diff tab, per file. */
  diff: undefined as DiffView | undefined,
  /** The session whose row menu is open, the one being renamed, the one asked about deleting. */
  menu: "",
  renaming: "",
  confirmDelete: "",
  /** On a phone the session list is a drawer: open or not. */
  drawer: false,
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
  /** The plan panel: the open session's plan is its timeline's plan items; this keeps the refused closes. */
  plan: emptyPlan(),
  /** The composer's list of skills as slash commands (slash.ts). */
  slash: emptySlash(),
  /** What the last action in the page did, said once (the status line under the header). */
  notice: "",
};

export function newSessionView(summary: SessionSummary): SessionView {
  return { summary, busy: summary.busy, timeline: empty(), clients: [], active: 0, retrying: undefined, stopReasons: new Map() };
}

/** The handles app.ts sets at start. */
export const ctx = {
  client: undefined as unknown as AgentClient,
  follower: undefined as StreamFollower | undefined,
  render: (): void => undefined,
  schedule: (): void => undefined,
  select: (_id: string): void => undefined,
  create: (): Promise<void> => Promise.resolve(),
  remove: (_id: string): Promise<void> => Promise.resolve(),
  openSide: (_side: Side): Promise<void> => Promise.resolve(),
  logout: (): Promise<void> => Promise.resolve(),
  /** The next render scrolls the conversation to its end (a prompt sent, a session opened). */
  toBottom: false,
};

/** An error for the page's error line, in words (never a raw JSON body). */
export function onErrorNow(err: unknown): void {
  state.errors.push(describe(err));
  if (state.errors.length > 20) state.errors.shift();
  ctx.schedule();
}

/** Words for an error: a ConnectError's message without its code prefix, else the error's message. */
export function describe(err: unknown): string {
  if (err && typeof err === "object" && "rawMessage" in err && typeof err.rawMessage === "string") return err.rawMessage;
  return err instanceof Error ? err.message : String(err);
}

/** A session's name in the list: its title, else its first hex digits. */
export function titleOf(s: SessionView | undefined, id: string): string {
  return s?.summary.title || `New session ${id.slice(0, 6)}`;
}

/** The last component of an absolute folder path. */
export function folderName(path: string): string {
  return path.split("/").filter(Boolean).pop() ?? path;
}

/** "just now", "5 min ago", "3 h ago", "2 d ago", else the date. */
export function relativeTime(ms: number, now = Date.now()): string {
  if (!ms || Number.isNaN(ms)) return "";
  const s = Math.max(0, Math.round((now - ms) / 1000));
  if (s < 45) return "just now";
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  if (s < 7 * 86400) return `${Math.round(s / 86400)} d ago`;
  return new Date(ms).toISOString().slice(0, 10);
}
