// The login's session key for the pages vak serves (/app, /admin). The client keeps
// it in sessionStorage (one tab); the cookie is the browser's, so a second tab
// logging in for itself would replace the cookie under the first tab's key. So the
// pages also keep it in localStorage, which this origin's tabs share. Both stores
// are per origin, which is what keeps the key from other local web apps
// (docs/security.md).
import { keepKey, storedKey } from "../src/index.js";

const SHARED = `vak-app-key ${location.origin}`;

/** The key this tab uses: its own, else the one another tab of this origin logged in with. */
export function currentKey(base: string): string | undefined {
  const shared = localStorage.getItem(SHARED);
  if (!storedKey(base) && shared) keepKey(base, shared);
  return storedKey(base);
}

/** Shares a fresh login's key with this origin's other tabs. */
export function shareKey(key: string): void {
  localStorage.setItem(SHARED, key);
}

/** Forgets the shared key (logged out, or the login ended). */
export function forgetKey(): void {
  localStorage.removeItem(SHARED);
}

/**
 * POST /auth/login with `token`; answers the session key (kept for this tab as the
 * package's login does) or throws an error whose message is a sentence for the
 * login form: by the answer's status, never its body.
 */
export async function appLogin(base: string, token: string): Promise<string> {
  if (!token) throw new Error("Paste the token first.");
  return exchange(base, { token }, "That token is not right. Run vak token on the server's machine and paste what it prints.");
}

/**
 * A one-time login link (`vak open`, `vak serve --print-token`) carries its ticket in
 * the URL's fragment, `#ticket=…`, which no server ever sees. Takes it off the address
 * bar (so a reload or a shared URL never replays it) and logs in with it once.
 * Answers the session key, undefined when the address has no ticket, or throws a
 * sentence for the login form.
 */
export async function ticketLogin(base: string): Promise<string | undefined> {
  const m = /^#ticket=([0-9a-f]{16,128})$/.exec(location.hash);
  if (!m) return undefined;
  history.replaceState(null, "", location.pathname + location.search);
  return exchange(base, { ticket: m[1] ?? "" }, "This login link was used already or is older than a minute: run vak open again, or log in with the token.");
}

async function exchange(base: string, body: Record<string, string>, refused: string): Promise<string> {
  let resp: Response;
  try {
    resp = await fetch(`${base}/auth/login`, {
      method: "POST",
      credentials: "include",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
    });
  } catch {
    throw new Error("Could not reach the vak server: is vak serve still running?");
  }
  if (resp.status === 401 || resp.status === 403) throw new Error(refused);
  if (resp.status === 429) throw new Error("Too many tries: wait a minute, then log in again.");
  if (!resp.ok) throw new Error(`The server could not log you in (HTTP ${resp.status}). Try again in a moment.`);
  const { key } = (await resp.json()) as { key?: unknown };
  if (typeof key !== "string" || !key) throw new Error("The server answered without a session key: is this a vak server?");
  keepKey(base, key);
  return key;
}
