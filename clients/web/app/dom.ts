// DOM helpers: every node is built with createElement and textContent, so no
// string from the server or the model is ever parsed as HTML.
type Child = Node | string | null | undefined | false;

/** An element with attributes (strings only; `on*` handlers are passed in `on`). */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Record<string, string | boolean | undefined> = {},
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === false) continue;
    if (k.startsWith("on")) throw new Error(`h(): no inline handler attributes (${k})`);
    el.setAttribute(k, v === true ? "" : v);
  }
  append(el, children);
  return el;
}

export function append(el: Node, children: Child[]): void {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    el.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
  }
}

/** A button that runs `fn` on click; errors go to `onError`. */
export function button(
  label: string,
  fn: () => unknown,
  attrs: Record<string, string | boolean | undefined> = {},
): HTMLButtonElement {
  const b = h("button", { type: "button", ...attrs }, label);
  b.addEventListener("click", () => void Promise.resolve().then(fn).catch(reportError));
  return b;
}

let errorSink: (err: unknown) => void = (err) => console.warn(err);
export function onError(fn: (err: unknown) => void): void {
  errorSink = fn;
}
export function reportError(err: unknown): void {
  errorSink(err);
}
