// StreamFollower: the multiplexed GET /stream over an EventSource: the browser's
// own, or an injected one (Node 20 has no global EventSource: pass the
// `eventsource` package's).
//
// One connection carries every followed session. Each agent and presentation
// frame has an SSE `id:` holding the cursor vector of the whole stream
// (`<session>:<seq>,...`); the browser keeps the last one and resends it as
// `Last-Event-ID` when it reconnects by itself, so the server resumes each
// session exactly after the last frame this page received. When the browser
// gives up (an HTTP error ends an EventSource for good), the follower opens a
// new one with `?cursor=<last id>`, which the server reads the same way.
//
// A `resync` frame says the server could not resume one session exactly. The
// follower then stops reading that stream (frames merged under backpressure
// carry only their last seq, so what follows cannot be lined up with a
// transcript by seq), fetches that session's transcript (exact as of its
// `seq`), hands it to the `resync` listeners, and opens a new stream whose
// cursor vector has that session's entry set to the transcript's seq.
import {
  ConfigInfoSchema,
  CoworkingSchema,
  EventSchema,
  HostInfoSchema,
  PresentationEventSchema,
  StreamOpenedSchema,
  TranscriptSchema,
  type ConfigInfo,
  type Coworking,
  type Event,
  type HostInfo,
  type PresentationEvent,
  type StreamOpened,
  type Transcript,
} from "./gen/vak/v1/agent_pb.js";
import { KEY_HEADER, storedKey, trimSlash } from "./client.js";
import { fromVakJson } from "./enums.js";

export type FollowerState = "idle" | "connecting" | "open" | "reconnecting" | "closed";

/** What a StreamFollower dispatches; every listener gets the parsed proto message. */
export interface FollowerEvents {
  /** A (re)connected stream: its stream_id and the cursor vector it starts from. */
  opened: (opened: StreamOpened, reconnect: boolean) => void;
  /** One session event (the `Event` proto); `cursor` is the stream's cursor vector after it. */
  agent: (event: Event, cursor: string) => void;
  /** One presentation timeline event; `cursor` as for agent. */
  presentation: (event: PresentationEvent, cursor: string) => void;
  /**
   * The server could not resume this session exactly from the cursor
   * (`event.kind.value.reason`: cursor_too_old or cursor_ahead). The follower
   * stopped reading that stream and fetched the session's transcript, exact
   * as of `transcript.seq`: show it in place of what you had for that
   * session. The stream is opened again with that session's entry set to
   * `transcript.seq`, so its agent frames continue right after the transcript.
   */
  resync: (event: Event, transcript: Transcript) => void;
  coworking: (coworking: Coworking) => void;
  host: (host: HostInfo) => void;
  config: (config: ConfigInfo) => void;
  /** The session is closing (server shutdown); the follower keeps reconnecting. */
  session_closed: (event: Event) => void;
  state: (state: FollowerState) => void;
  /** A dropped connection or a failed follow/unfollow; the follower carries on. */
  error: (error: Error) => void;
}

type Listeners = { [K in keyof FollowerEvents]: Set<FollowerEvents[K]> };

/** The part of an SSE message event StreamFollower reads. */
export interface EventSourceMessage {
  data: string;
  lastEventId: string;
}

/**
 * What StreamFollower needs of an EventSource. The browser's `EventSource`
 * and the `eventsource` npm package's (for Node) both fit; so does any
 * WHATWG-compatible implementation.
 */
export interface EventSourceLike {
  readonly readyState: number;
  onerror: ((this: any, ev: any) => unknown) | null;
  addEventListener(type: string, listener: (ev: EventSourceMessage) => unknown): void;
  close(): void;
}

/** An EventSource constructor, as `new EventSource(url, { withCredentials })` takes it. */
export interface EventSourceConstructor {
  new (url: string, init?: { withCredentials?: boolean }): EventSourceLike;
  readonly CLOSED: number;
}

export interface StreamFollowerOptions {
  /** The server's URL, e.g. "http://127.0.0.1:8901". */
  baseUrl: string;
  /** Sessions to follow from the start (more with follow()). */
  sessions?: string[];
  /**
   * The bearer token. EventSource cannot send headers, so it goes in the URL
   * as `?token=`, which the server accepts only from a loopback peer.
   * Leave it out to use the login cookie (see `login`) instead.
   */
  token?: string;
  /**
   * With the login cookie: the session key `login` returned. EventSource
   * cannot send headers, so it goes in the URL as `?key=`; follow/unfollow
   * send it as `x-vak-key`. Default: the key `login` kept for `baseUrl`.
   */
  key?: string;
  /** Send cookies (the login cookie) cross-origin. Default: when there is no token. */
  withCredentials?: boolean;
  /** A cursor vector from an earlier stream to resume from. */
  cursor?: string;
  /** Also ask for host / config frames. */
  host?: boolean;
  config?: boolean;
  /** First and longest delay before reopening a stream the browser gave up on (ms). */
  retryMs?: number;
  maxRetryMs?: number;
  /**
   * An EventSource implementation. Default: the global one (every browser
   * has it). Node 20 has none: pass one, e.g. `EventSource` from the
   * `eventsource` package.
   */
  EventSource?: EventSourceConstructor;
  /** A fetch for follow/unfollow (default: the global one). */
  fetch?: typeof fetch;
}

/** The cursor vector `cursor` with `session`'s entry set to `seq` (added at the end when missing). */
export function withCursorEntry(cursor: string, session: string, seq: bigint): string {
  const entries = cursor
    .split(",")
    .map((e) => e.trim())
    .filter((e) => e !== "");
  const i = entries.findIndex((e) => e.slice(0, e.lastIndexOf(":")) === session);
  const entry = `${session}:${seq}`;
  if (i >= 0) entries[i] = entry;
  else entries.push(entry);
  return entries.join(",");
}

/** Parses a cursor vector `<session>:<seq>,...` into session -> seq. */
export function parseCursor(cursor: string): Map<string, bigint> {
  const out = new Map<string, bigint>();
  for (const part of cursor.split(",")) {
    const at = part.lastIndexOf(":");
    if (at <= 0) continue;
    const seq = part.slice(at + 1).trim();
    if (/^\d+$/.test(seq)) out.set(part.slice(0, at).trim(), BigInt(seq));
  }
  return out;
}

export class StreamFollower {
  /** The last cursor vector received (the SSE id of the last agent/presentation frame). */
  cursor: string;
  /** The id of the live stream, for follow/unfollow; changes on every reconnect. */
  streamId = "";
  state: FollowerState = "idle";
  /** How many times the stream was opened again after the first time. */
  reconnects = 0;
  /** Agent frames dropped because their seq was already delivered (should stay 0). */
  duplicates = 0;
  /** How many resyncs were handed to the listeners (each opened the stream again). */
  resyncs = 0;

  private readonly opts: StreamFollowerOptions;
  private readonly wanted: string[];
  private readonly lastSeq = new Map<string, bigint>();
  private readonly listeners: Listeners = {
    opened: new Set(),
    agent: new Set(),
    presentation: new Set(),
    resync: new Set(),
    coworking: new Set(),
    host: new Set(),
    config: new Set(),
    session_closed: new Set(),
    state: new Set(),
    error: new Set(),
  };
  private es: EventSourceLike | undefined;
  private opens = 0;
  private retryTimer: ReturnType<typeof setTimeout> | undefined;
  private retryDelay: number;

  constructor(opts: StreamFollowerOptions) {
    this.opts = opts;
    this.wanted = [...new Set(opts.sessions ?? [])];
    this.cursor = opts.cursor ?? "";
    for (const [s, seq] of parseCursor(this.cursor)) this.lastSeq.set(s, seq);
    this.retryDelay = opts.retryMs ?? 1000;
  }

  /** The sessions this follower wants followed. */
  get sessions(): readonly string[] {
    return this.wanted;
  }

  /** Subscribes a listener; returns the function that unsubscribes it. */
  on<K extends keyof FollowerEvents>(kind: K, fn: FollowerEvents[K]): () => void {
    this.listeners[kind].add(fn);
    return () => {
      this.listeners[kind].delete(fn);
    };
  }

  /** Opens the stream (once; it then reconnects by itself until close()). */
  start(): this {
    if (this.state === "idle") this.connect();
    return this;
  }

  /** Closes the stream for good. */
  close(): void {
    clearTimeout(this.retryTimer);
    this.es?.close();
    this.es = undefined;
    this.setState("closed");
  }

  /**
   * Adds a session to the live stream (POST /stream/{stream_id}/follow);
   * `after` resumes after that seq, else live. Before the stream is open,
   * or while it reconnects, the session is followed as soon as it opens.
   */
  async follow(sessionId: string, after?: bigint): Promise<readonly string[]> {
    if (!this.wanted.includes(sessionId)) this.wanted.push(sessionId);
    if (after !== undefined) this.lastSeq.set(sessionId, after);
    if (!this.streamId || this.state !== "open") return this.wanted;
    return this.control("follow", sessionId, after);
  }

  /** Removes a session from the live stream (POST /stream/{stream_id}/unfollow). */
  async unfollow(sessionId: string): Promise<readonly string[]> {
    const i = this.wanted.indexOf(sessionId);
    if (i >= 0) this.wanted.splice(i, 1);
    this.lastSeq.delete(sessionId);
    if (!this.streamId || this.state !== "open") return this.wanted;
    return this.control("unfollow", sessionId);
  }

  private async control(op: "follow" | "unfollow", sessionId: string, after?: bigint): Promise<string[]> {
    const body: Record<string, unknown> = { session_id: sessionId };
    if (after !== undefined) body.after = after.toString();
    const path = `/stream/${encodeURIComponent(this.streamId)}/${op}`;
    const text = await this.call("POST", path, body, `${op} ${sessionId}`);
    return (JSON.parse(text) as { sessions: string[] }).sessions;
  }

  /** GET /sessions/{id}/transcript: the session exactly as of the transcript's `seq`. */
  private async transcript(sessionId: string): Promise<Transcript> {
    const path = `/sessions/${encodeURIComponent(sessionId)}/transcript`;
    const text = await this.call("GET", path, undefined, `transcript of ${sessionId}`);
    return fromVakJson(TranscriptSchema, text);
  }

  /** One REST call with this follower's credentials; the answer's body, or an error naming `what`. */
  private async call(method: "GET" | "POST", path: string, body: unknown, what: string): Promise<string> {
    const f = this.opts.fetch ?? fetch;
    const headers: Record<string, string> = {};
    if (body !== undefined) headers["content-type"] = "application/json";
    if (this.opts.token !== undefined) headers.authorization = `Bearer ${this.opts.token}`;
    else {
      const key = this.key();
      if (key !== undefined) headers[KEY_HEADER] = key;
    }
    const resp = await f(`${trimSlash(this.opts.baseUrl)}${path}`, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: this.withCredentials() ? "include" : "same-origin",
    });
    const text = await resp.text();
    if (!resp.ok) throw new Error(`${what}: HTTP ${resp.status} ${text}`);
    return text;
  }

  private withCredentials(): boolean {
    return this.opts.withCredentials ?? this.opts.token === undefined;
  }

  /** The login's session key, when the cookie is the credential. */
  private key(): string | undefined {
    if (this.opts.token !== undefined) return undefined;
    return this.opts.key ?? storedKey(this.opts.baseUrl);
  }

  private url(): string {
    const q = new URLSearchParams();
    for (const s of this.wanted) q.append("session", s);
    if (this.cursor) q.set("cursor", this.cursor);
    if (this.opts.host) q.set("host", "1");
    if (this.opts.config) q.set("config", "1");
    if (this.opts.token !== undefined) q.set("token", this.opts.token);
    const key = this.key();
    if (key !== undefined) q.set("key", key);
    return `${trimSlash(this.opts.baseUrl)}/stream?${q}`;
  }

  private emit<K extends keyof FollowerEvents>(kind: K, ...args: Parameters<FollowerEvents[K]>): void {
    for (const fn of [...this.listeners[kind]]) {
      try {
        (fn as (...a: Parameters<FollowerEvents[K]>) => void)(...args);
      } catch (err) {
        // A listener's bug must not break the stream; report it asynchronously.
        setTimeout(() => {
          throw err;
        });
      }
    }
  }

  private setState(s: FollowerState): void {
    if (this.state === s) return;
    this.state = s;
    this.emit("state", s);
  }

  private connect(): void {
    const ES = this.opts.EventSource ?? (globalThis as { EventSource?: EventSourceConstructor }).EventSource;
    if (ES === undefined) {
      throw new Error(
        "StreamFollower: there is no global EventSource (Node 20 has none): pass one as the EventSource option, " +
          'e.g. `import { EventSource } from "eventsource"`',
      );
    }
    this.setState(this.opens === 0 ? "connecting" : "reconnecting");
    const es = new ES(this.url(), { withCredentials: this.withCredentials() });
    this.es = es;
    const on = (name: string, fn: (e: EventSourceMessage) => void) =>
      es.addEventListener(name, (e) => {
        if (this.es !== es) return;
        try {
          fn(e);
        } catch (err) {
          this.emit("error", new Error(`bad ${name} frame: ${String(err)}`));
        }
      });
    on("stream_opened", (e) => this.opened(fromVakJson(StreamOpenedSchema, e.data)));
    on("agent", (e) => this.agent(fromVakJson(EventSchema, e.data), e.lastEventId));
    on("presentation", (e) => {
      this.advance(e.lastEventId);
      this.emit("presentation", fromVakJson(PresentationEventSchema, e.data), this.cursor);
    });
    on("resync", (e) => {
      const ev = fromVakJson(EventSchema, e.data);
      // Nothing more is read from this stream: the transcript stands for
      // that session up to its seq, and a new stream goes on from there.
      es.close();
      this.es = undefined;
      this.setState("reconnecting");
      void this.resync(ev);
    });
    on("coworking", (e) => this.emit("coworking", fromVakJson(CoworkingSchema, e.data)));
    on("host", (e) => this.emit("host", fromVakJson(HostInfoSchema, e.data)));
    on("config", (e) => this.emit("config", fromVakJson(ConfigInfoSchema, e.data)));
    on("session_closed", (e) => this.emit("session_closed", fromVakJson(EventSchema, e.data)));
    es.onerror = () => {
      if (this.es !== es) return;
      if (es.readyState === ES.CLOSED) {
        // The browser gave up (an HTTP error or a non-SSE answer): reopen from our cursor.
        this.emit("error", new Error(`the stream failed; reopening in ${this.retryDelay} ms`));
        this.setState("reconnecting");
        clearTimeout(this.retryTimer);
        this.retryTimer = setTimeout(() => {
          if (this.es === es) this.connect();
        }, this.retryDelay);
        this.retryDelay = Math.min(this.retryDelay * 2, this.opts.maxRetryMs ?? 15000);
      } else {
        // The browser reconnects by itself and resends the last id as Last-Event-ID.
        this.emit("error", new Error(`the stream dropped at cursor ${this.cursor || "(none)"}; reconnecting`));
        this.setState("reconnecting");
      }
    };
  }

  /** Fetches the transcript for a resync of `ev.sessionId`, hands it over, and opens the stream after it. */
  private async resync(ev: Event): Promise<void> {
    let t: Transcript;
    try {
      t = await this.transcript(ev.sessionId);
    } catch (err) {
      if (this.isClosed()) return;
      this.emit("error", new Error(`resync: ${String(err)}; trying again in ${this.retryDelay} ms`));
      clearTimeout(this.retryTimer);
      this.retryTimer = setTimeout(() => {
        if (!this.isClosed()) void this.resync(ev);
      }, this.retryDelay);
      this.retryDelay = Math.min(this.retryDelay * 2, this.opts.maxRetryMs ?? 15000);
      return;
    }
    if (this.isClosed() || this.es !== undefined) return;
    this.lastSeq.set(ev.sessionId, t.seq);
    this.cursor = withCursorEntry(this.cursor, ev.sessionId, t.seq);
    this.resyncs++;
    this.emit("resync", ev, t);
    // A listener may have closed the follower.
    if (!this.isClosed() && this.es === undefined) this.connect();
  }

  /** (A method, not a comparison TypeScript would narrow: listeners may close the follower meanwhile.) */
  private isClosed(): boolean {
    return this.state === "closed";
  }

  private advance(id: string): void {
    if (id) this.cursor = id;
  }

  private opened(o: StreamOpened): void {
    const reconnect = this.opens > 0;
    this.opens++;
    if (reconnect) this.reconnects++;
    this.streamId = o.streamId;
    if (!this.cursor) this.cursor = o.cursor;
    for (const [s, seq] of parseCursor(o.cursor)) if (!this.lastSeq.has(s)) this.lastSeq.set(s, seq);
    this.retryDelay = this.opts.retryMs ?? 1000;
    this.setState("open");
    this.emit("opened", o, reconnect);
    void this.reconcile(o.cursor);
  }

  /** After a reconnect the server follows what the URL and cursor name: make it what we want. */
  private async reconcile(openedCursor: string): Promise<void> {
    const streamId = this.streamId;
    const has = new Set(parseCursor(openedCursor).keys());
    try {
      for (const s of [...has]) {
        if (!this.wanted.includes(s) && this.streamId === streamId) await this.control("unfollow", s);
      }
      for (const s of [...this.wanted]) {
        if (!has.has(s) && this.streamId === streamId) await this.control("follow", s, this.lastSeq.get(s));
      }
    } catch (err) {
      this.emit("error", err instanceof Error ? err : new Error(String(err)));
    }
  }

  private agent(ev: Event, id: string): void {
    this.advance(id);
    const last = this.lastSeq.get(ev.sessionId);
    if (ev.seq > 0n) {
      if (last !== undefined && ev.seq <= last) {
        this.duplicates++;
        return;
      }
      this.lastSeq.set(ev.sessionId, ev.seq);
    }
    this.emit("agent", ev, this.cursor);
  }
}
