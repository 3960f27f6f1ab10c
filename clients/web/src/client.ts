// The typed client: every AgentService RPC, unary and server-streaming, over
// @connectrpc/connect-web's gRPC-web transport (binary protobuf on fetch) or,
// with `protocol: "connect"`, its Connect transport (binary or JSON).
import { createClient, type Client, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport, createGrpcWebTransport } from "@connectrpc/connect-web";
import { AgentService } from "./gen/vak/v1/agent_pb.js";

export type AgentClient = Client<typeof AgentService>;

/** The wire protocol a client speaks; vak serves both on its one port. */
export type ClientProtocol = "grpc-web" | "connect";

export interface ClientOptions {
  /** The server's URL, e.g. "http://127.0.0.1:8901" (no trailing path). */
  baseUrl: string;
  /**
   * The bearer token, sent as `authorization: Bearer <token>` on every call.
   * Leave it out to rely on a login cookie instead (see `login`): the calls
   * are then made with `credentials: "include"` and carry the login's
   * session key as `x-vak-key`.
   */
  token?: string;
  /**
   * The session key `login` returned, sent as `x-vak-key` when there is no
   * token: the server takes the login cookie only together with it. Default:
   * the key `login` kept in this page's sessionStorage for `baseUrl`.
   */
  key?: string;
  /** A default deadline for every call, in milliseconds. */
  timeoutMs?: number;
  /** More interceptors, run after the one that adds the token. */
  interceptors?: Interceptor[];
  /** A fetch to use instead of the global one. */
  fetch?: typeof globalThis.fetch;
  /**
   * The protocol: "grpc-web" (the default) or "connect" (the Connect
   * protocol: `POST /vak.v1.AgentService/<Method>`, server streams as
   * `application/connect+proto` or `application/connect+json`).
   */
  protocol?: ClientProtocol;
  /**
   * Connect only: send and read JSON (`application/json`, canonical proto3
   * JSON) instead of binary protobuf (`application/proto`). gRPC-web is
   * always binary; with it, `json: true` is an error.
   */
  json?: boolean;
}

/** An interceptor that sends `authorization: Bearer <token>` on every call. */
export function bearer(token: string): Interceptor {
  const value = `Bearer ${token}`;
  return (next) => async (req) => {
    req.header.set("authorization", value);
    return next(req);
  };
}

/** The header that carries a login's session key next to its cookie. */
export const KEY_HEADER = "x-vak-key";

/** An interceptor that sends a login's session key as `x-vak-key` on every call. */
export function sessionKey(key: string): Interceptor {
  return (next) => async (req) => {
    req.header.set(KEY_HEADER, key);
    return next(req);
  };
}

/** A client for vak.v1.AgentService over gRPC-web, or over Connect with `protocol: "connect"`. */
export function createAgentClient(opts: ClientOptions): AgentClient {
  const protocol = opts.protocol ?? "grpc-web";
  if (protocol !== "grpc-web" && protocol !== "connect") {
    throw new Error(`unknown protocol ${JSON.stringify(protocol)}: use "grpc-web" or "connect"`);
  }
  if (opts.json && protocol !== "connect") {
    throw new Error('json: true needs protocol: "connect" (gRPC-web is binary only)');
  }
  const baseFetch = opts.fetch ?? globalThis.fetch.bind(globalThis);
  const interceptors: Interceptor[] = [];
  if (opts.token !== undefined) {
    interceptors.push(bearer(opts.token));
  } else {
    const key = opts.key ?? storedKey(opts.baseUrl);
    if (key !== undefined) interceptors.push(sessionKey(key));
  }
  interceptors.push(...(opts.interceptors ?? []));
  // Without a token the login cookie is the credential, cross-origin too
  // (the server must list this page's origin with --allow-origin).
  const fetch: typeof globalThis.fetch =
    opts.token === undefined ? (input, init) => baseFetch(input, { ...init, credentials: "include" }) : baseFetch;
  const transportOptions = { baseUrl: trimSlash(opts.baseUrl), interceptors, defaultTimeoutMs: opts.timeoutMs, fetch };
  const transport =
    protocol === "connect"
      ? createConnectTransport({ ...transportOptions, useBinaryFormat: !opts.json })
      : createGrpcWebTransport({ ...transportOptions, useBinaryFormat: true });
  return createClient(AgentService, transport);
}

/**
 * POST /auth/login {token}: the server sets its login cookie
 * (`vak_session_<instance>`, HttpOnly, SameSite=Strict), which EventSource
 * and fetch then send by themselves, and answers the login's session key.
 * The cookie alone is no credential (browsers send it to every port of the
 * host, so to other local web apps too): every call must also carry the key,
 * which only this page's origin can read. It is returned and kept in this
 * origin's sessionStorage (when there is one) for `baseUrl`, where
 * `createAgentClient` and `StreamFollower` find it. Cross-origin this needs
 * the page's origin in --allow-origin.
 */
export async function login(baseUrl: string, token: string, f: typeof fetch = fetch): Promise<string> {
  const resp = await f(`${trimSlash(baseUrl)}/auth/login`, {
    method: "POST",
    credentials: "include",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ token }),
  });
  if (!resp.ok) throw new Error(`login failed: HTTP ${resp.status} ${await resp.text()}`);
  const { key } = (await resp.json()) as { key?: unknown };
  if (typeof key !== "string" || !key) throw new Error("login failed: the server answered no session key");
  storage()?.setItem(storageName(baseUrl), key);
  return key;
}

/** Keeps `key` as this page's session key for `baseUrl`, as `login` does (a key another tab got). */
export function keepKey(baseUrl: string, key: string): void {
  storage()?.setItem(storageName(baseUrl), key);
}

/** POST /auth/logout: forgets the login cookie on both sides, and the kept session key. */
export async function logout(baseUrl: string, f: typeof fetch = fetch): Promise<void> {
  storage()?.removeItem(storageName(baseUrl));
  await f(`${trimSlash(baseUrl)}/auth/logout`, { method: "POST", credentials: "include" });
}

/** The session key `login` kept in this origin's sessionStorage for `baseUrl`, if any. */
export function storedKey(baseUrl: string): string | undefined {
  return storage()?.getItem(storageName(baseUrl)) ?? undefined;
}

interface KeyStorage {
  getItem(name: string): string | null;
  setItem(name: string, value: string): void;
  removeItem(name: string): void;
}

/** The page's sessionStorage; none in Node (or where storage is blocked). */
function storage(): KeyStorage | undefined {
  try {
    return (globalThis as { sessionStorage?: KeyStorage }).sessionStorage;
  } catch {
    return undefined;
  }
}

function storageName(baseUrl: string): string {
  return `vak-key ${trimSlash(baseUrl)}`;
}

export function trimSlash(url: string): string {
  return url.replace(/\/+$/, "");
}
