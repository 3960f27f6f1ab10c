// The demo page: creates a session over gRPC-web, runs prompts, answers
// approvals, and shows the assistant's text as it streams on GET /stream
// (and, side by side, on the gRPC-web server-streaming Subscribe RPC).
//
// Configured by the URL fragment (never sent to any server):
//   #server=http://127.0.0.1:8901&token=T[&stream=URL][&auth=cookie]
// `stream` is where GET /stream is opened (default: server). With
// auth=cookie the page logs in (POST /auth/login) and sends no token itself:
// the login cookie goes with the session key the login answered.
import { ConnectError } from "@connectrpc/connect";
import {
  AdmissionStateSchema,
  ApprovalOutcomeSchema,
  createAgentClient,
  enumJsonName,
  ItemKind,
  ResyncReasonSchema,
  RunOutcomeSchema,
  login,
  StreamFollower,
  type AgentClient,
  type Event,
  type FollowerState,
} from "../src/index.js";

const $ = <T extends HTMLElement>(id: string) => {
  const el = document.getElementById(id);
  if (!el) throw new Error(`#${id} is missing`);
  return el as T;
};

const params = new URLSearchParams(location.hash.slice(1));
const server = params.get("server") ?? location.origin;
const streamBase = params.get("stream") ?? server;
const token = params.get("token") ?? "";
const cookieAuth = params.get("auth") === "cookie";

/** What the page knows, for people (rendered) and for the browser test (window.vakPage). */
const state = {
  sessionId: "",
  text: "",
  grpcText: "",
  outcome: "",
  grpcOutcome: "",
  approvals: [] as { requestId: string; reason: string; outcome: string }[],
  /** The cursor (and how much text the page had) each time the stream dropped. */
  drops: [] as { cursor: string; textLength: number }[],
  resyncs: 0,
  errors: [] as string[],
  log: [] as string[],
};

let client: AgentClient;
/** With auth=cookie: the login's session key, sent with the cookie. */
let key: string | undefined;
let follower: StreamFollower | undefined;
/** While a resync refetches the timeline, agent frames wait here. */
let held: Event[] | undefined;
/** Agent frames up to this seq are already in the refetched text. */
let horizon = 0n;

function log(line: string): void {
  state.log.push(line);
  if (state.log.length > 200) state.log.shift();
  const el = $("log");
  el.textContent = state.log.slice(-40).join("\n");
}

function fail(where: string, err: unknown): void {
  const msg = err instanceof ConnectError ? `${err.code}: ${err.rawMessage}` : String(err);
  state.errors.push(`${where}: ${msg}`);
  log(`error (${where}): ${msg}`);
  $("errors").textContent = state.errors.join("\n");
}

function render(): void {
  $("session").textContent = state.sessionId || "(none)";
  $("cursor").textContent = follower?.cursor || "(none)";
  $("reconnects").textContent = String(follower?.reconnects ?? 0);
  $("outcome").textContent = state.outcome || "-";
  $("text").textContent = state.text;
  $("grpc-text").textContent = state.grpcText;
}

function setConn(s: FollowerState): void {
  const el = $("conn");
  el.textContent = s;
  el.dataset.state = s;
}

function renderApprovals(): void {
  const ul = $("approvals");
  ul.replaceChildren();
  for (const a of state.approvals) {
    const li = document.createElement("li");
    li.dataset.requestId = a.requestId;
    li.append(`${a.reason} `);
    if (a.outcome) {
      const b = document.createElement("b");
      b.className = "outcome";
      b.textContent = a.outcome;
      li.append(b);
    } else {
      for (const approve of [true, false]) {
        const btn = document.createElement("button");
        btn.className = approve ? "approve" : "deny";
        btn.textContent = approve ? "Approve" : "Deny";
        btn.onclick = () => void answer(a.requestId, approve);
        li.append(btn);
      }
    }
    ul.append(li);
  }
}

async function answer(requestId: string, approve: boolean): Promise<void> {
  try {
    const r = await client.approve({ sessionId: state.sessionId, requestId, approve });
    log(`approve ${requestId}: ${enumJsonName(ApprovalOutcomeSchema, r.outcome)}`);
  } catch (err) {
    fail("approve", err);
  }
}

function onAgent(ev: Event): void {
  if (ev.sessionId !== state.sessionId) return;
  if (held) {
    held.push(ev);
    return;
  }
  const k = ev.kind;
  // After a resync the refetched text already holds every delta up to the horizon.
  if (k.case === "textDelta" && ev.seq <= horizon) return;
  switch (k.case) {
    case "textDelta":
      state.text += k.value.text;
      break;
    case "approvalRequested":
      if (!state.approvals.some((a) => a.requestId === k.value.requestId)) {
        state.approvals.push({ requestId: k.value.requestId, reason: k.value.reason, outcome: "" });
      }
      renderApprovals();
      log(`approval requested: ${k.value.requestId} (${k.value.reason})`);
      break;
    case "approvalResolved": {
      const a = state.approvals.find((x) => x.requestId === k.value.requestId);
      if (a) a.outcome = enumJsonName(ApprovalOutcomeSchema, k.value.outcome);
      renderApprovals();
      log(`approval ${k.value.requestId}: ${enumJsonName(ApprovalOutcomeSchema, k.value.outcome)}`);
      break;
    }
    case "runFinished":
      state.outcome = enumJsonName(RunOutcomeSchema, k.value.outcome);
      log(`run finished: ${state.outcome} (${k.value.message})`);
      break;
    case "toolResult":
      log(`tool result ${k.value.callId}: ${k.value.ok ? "ok" : "failed"}: ${k.value.output}`);
      break;
    default:
      break;
  }
  render();
}

/** A resync: the text is rebuilt from the presentation timeline, then the held frames after it apply. */
async function resync(): Promise<void> {
  state.resyncs++;
  held = [];
  try {
    const t = await client.getPresentation({ sessionId: state.sessionId });
    state.text = t.items
      .filter((i) => i.kind === ItemKind.ASSISTANT_TEXT)
      .map((i) => i.text)
      .join("");
    horizon = t.seq;
  } catch (err) {
    fail("resync", err);
  }
  const frames = held;
  held = undefined;
  for (const ev of frames) onAgent(ev);
  render();
}

function follow(sessionId: string): void {
  follower?.close();
  const f = new StreamFollower({
    baseUrl: streamBase,
    sessions: [sessionId],
    token: cookieAuth ? undefined : token,
    key,
  });
  follower = f;
  f.on("state", (s) => {
    setConn(s);
    log(`stream: ${s}`);
  });
  f.on("opened", (o, again) => {
    log(`stream_opened ${o.streamId} cursor=${o.cursor}${again ? " (reconnected)" : ""}`);
    render();
  });
  f.on("error", (e) => {
    if (f.state !== "closed") state.drops.push({ cursor: f.cursor, textLength: state.text.length });
    log(e.message);
    render();
  });
  f.on("agent", onAgent);
  f.on("resync", (ev) => {
    if (ev.sessionId !== state.sessionId) return;
    log(`resync: ${ev.kind.case === "resync" ? enumJsonName(ResyncReasonSchema, ev.kind.value.reason) : "?"}`);
    void resync();
  });
  f.start();
}

/** The same session over the gRPC-web server-streaming Subscribe, from its first seq. */
async function subscribeGrpc(sessionId: string): Promise<void> {
  try {
    for await (const ev of client.subscribe({ sessionId, after: 0n })) {
      const k = ev.kind;
      if (k.case === "textDelta") state.grpcText += k.value.text;
      if (k.case === "runFinished") state.grpcOutcome = enumJsonName(RunOutcomeSchema, k.value.outcome);
      render();
    }
  } catch (err) {
    fail("subscribe", err);
  }
}

async function newSession(): Promise<void> {
  try {
    const r = await client.createSession({});
    Object.assign(state, { sessionId: r.sessionId, text: "", grpcText: "", outcome: "", approvals: [] });
    horizon = 0n;
    renderApprovals();
    log(`session ${r.sessionId} created over gRPC-web`);
    follow(r.sessionId);
    void subscribeGrpc(r.sessionId);
  } catch (err) {
    fail("create session", err);
  }
  render();
}

async function run(): Promise<void> {
  const prompt = $<HTMLTextAreaElement>("prompt").value;
  // Cleared first: the run can finish before its admission's answer arrives.
  state.outcome = "";
  try {
    const r = await client.run({ sessionId: state.sessionId, prompt });
    log(`run ${r.requestId}: ${enumJsonName(AdmissionStateSchema, r.state)}`);
  } catch (err) {
    fail("run", err);
  }
  render();
}

async function main(): Promise<void> {
  $("server").textContent = server;
  if (cookieAuth) {
    key = await login(server, token);
    log("logged in (login cookie and session key)");
  }
  client = createAgentClient({ baseUrl: server, token: cookieAuth ? undefined : token, key });
  $("new-session").onclick = () => void newSession();
  $("run").onclick = () => void run();
  setConn("idle");
  // For the browser test and the devtools console.
  (window as unknown as Record<string, unknown>).vakPage = {
    state,
    client,
    get follower() {
      return follower;
    },
  };
  if (token) await newSession();
  document.body.dataset.ready = "1";
}

main().catch((err) => fail("start", err));
