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
