// The typed gRPC-web client: every AgentService RPC, unary and server-streaming,
// over @connectrpc/connect-web's gRPC-web transport (binary protobuf on fetch).
import { createClient, type Client, type Interceptor } from "@connectrpc/connect";
import { createGrpcWebTransport } from "@connectrpc/connect-web";
import { AgentService } from "./gen/vak/v1/agent_pb.js";

export type AgentClient = Client<typeof AgentService>;

export interface ClientOptions {
  /** The server's URL, e.g. "http://127.0.0.1:8901" (no trailing path). */
  baseUrl: string;
  /**
   * The bearer token, sent as `authorization: Bearer <token>` on every call.
   * Leave it out to rely on a login cookie instead (see `login`): the calls
   * are then made with `credentials: "include"`.
   */
  token?: string;
  /** A default deadline for every call, in milliseconds. */
  timeoutMs?: number;
  /** More interceptors, run after the one that adds the token. */
  interceptors?: Interceptor[];
  /** A fetch to use instead of the global one. */
  fetch?: typeof globalThis.fetch;
}

/** An interceptor that sends `authorization: Bearer <token>` on every call. */
export function bearer(token: string): Interceptor {
  const value = `Bearer ${token}`;
  return (next) => async (req) => {
    req.header.set("authorization", value);
    return next(req);
  };
}

/** A client for vak.v1.AgentService over gRPC-web. */
export function createAgentClient(opts: ClientOptions): AgentClient {
  const baseFetch = opts.fetch ?? globalThis.fetch.bind(globalThis);
  const interceptors: Interceptor[] = [];
  if (opts.token !== undefined) interceptors.push(bearer(opts.token));
  interceptors.push(...(opts.interceptors ?? []));
  const transport = createGrpcWebTransport({
    baseUrl: trimSlash(opts.baseUrl),
    useBinaryFormat: true,
    interceptors,
    defaultTimeoutMs: opts.timeoutMs,
    // Without a token the login cookie is the credential, cross-origin too
    // (the server must list this page's origin with --allow-origin).
    fetch:
      opts.token === undefined
        ? (input, init) => baseFetch(input, { ...init, credentials: "include" })
        : baseFetch,
  });
  return createClient(AgentService, transport);
}

/**
 * POST /auth/login {token}: the server sets the `vak_session` cookie
 * (HttpOnly, SameSite=Strict), which EventSource and fetch then send by
 * themselves. Cross-origin this needs the page's origin in --allow-origin.
 */
export async function login(baseUrl: string, token: string, f: typeof fetch = fetch): Promise<void> {
  const resp = await f(`${trimSlash(baseUrl)}/auth/login`, {
    method: "POST",
    credentials: "include",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ token }),
  });
  if (!resp.ok) throw new Error(`login failed: HTTP ${resp.status} ${await resp.text()}`);
}

/** POST /auth/logout: forgets the login cookie on both sides. */
export async function logout(baseUrl: string, f: typeof fetch = fetch): Promise<void> {
  await f(`${trimSlash(baseUrl)}/auth/logout`, { method: "POST", credentials: "include" });
}

export function trimSlash(url: string): string {
  return url.replace(/\/+$/, "");
}
