// The terminal panel: xterm.js onto GET /pty (a WebSocket with the login
// cookie and its session key). Binary frames are bytes both ways; text
// frames are JSON control messages (resize in; started and exit out). The
// panel's element lives across the app's re-renders, so the shell does too.
import "@xterm/xterm/css/xterm.css";
import { Terminal } from "@xterm/xterm";
import { h } from "./dom.js";

const COLS = 100;
const ROWS = 24;

/**
 * A document for xterm whose `<style>` elements become constructed
 * stylesheets: xterm's DOM renderer writes its theme and cell sizes into
 * `<style>` elements, which the server's CSP (style-src 'self', no inline
 * style) refuses; a constructed stylesheet is CSSOM, which the CSP allows.
 */
function cspSafeDocument(): Document {
  const styleElement = (): HTMLElement => {
    const el = document.createElement("span");
    el.hidden = true;
    const sheet = new CSSStyleSheet();
    document.adoptedStyleSheets = [...document.adoptedStyleSheets, sheet];
    Object.defineProperty(el, "textContent", {
      get: () => "",
      set: (css: string) => sheet.replaceSync(css ?? ""),
    });
    const remove = el.remove.bind(el);
    el.remove = () => {
      document.adoptedStyleSheets = document.adoptedStyleSheets.filter((s) => s !== sheet);
      remove();
    };
    return el;
  };
  return new Proxy(document, {
    get(target, prop) {
      if (prop === "createElement") {
        return (tag: string, options?: ElementCreationOptions) =>
          tag.toLowerCase() === "style" ? styleElement() : target.createElement(tag, options);
      }
      const v = Reflect.get(target, prop, target) as unknown;
      return typeof v === "function" ? (v as (...a: unknown[]) => unknown).bind(target) : v;
    },
  });
}

export class TerminalPanel {
  /** Kept across renders: the app re-attaches it wherever the panel goes. */
  readonly el: HTMLElement;
  private readonly screen: HTMLElement;
  private readonly status: HTMLElement;
  private term: Terminal | undefined;
  private ws: WebSocket | undefined;
  /** "", "connecting", "open" or "exited (code N)": for the page and the test. */
  state = "";

  constructor(private readonly base: string, private readonly key: () => string) {
    this.status = h("span", { class: "term-status", id: "term-status" });
    this.screen = h("div", { class: "term-screen", id: "term-screen" });
    this.el = h("div", { class: "terminal" }, this.status, this.screen);
  }

  /** Opens a shell (once; a live one stays). */
  open(): void {
    if (this.ws && this.ws.readyState <= WebSocket.OPEN) return;
    this.term?.dispose();
    const term = new Terminal({ cols: COLS, rows: ROWS, documentOverride: cspSafeDocument(), fontSize: 13 });
    this.term = term;
    term.open(this.screen);
    const url = new URL("/pty", this.base);
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    url.searchParams.set("key", this.key());
    url.searchParams.set("cols", String(COLS));
    url.searchParams.set("rows", String(ROWS));
    const ws = new WebSocket(url);
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    this.setState("connecting");
    const encoder = new TextEncoder();
    term.onData((d) => {
      if (ws.readyState === WebSocket.OPEN) ws.send(encoder.encode(d));
    });
    term.onResize(({ cols, rows }) => {
      if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: "resize", cols, rows }));
    });
    ws.onmessage = (ev: MessageEvent) => {
      if (ev.data instanceof ArrayBuffer) {
        term.write(new Uint8Array(ev.data));
        return;
      }
      const msg = JSON.parse(String(ev.data)) as { type: string; code?: number | null };
      if (msg.type === "started") this.setState("open");
      else if (msg.type === "exit") this.setState(`exited (code ${msg.code ?? "?"})`);
    };
    ws.onclose = (ev) => {
      if (this.state === "open" || this.state === "connecting") {
        this.setState(ev.reason ? `closed: ${ev.reason}` : "closed");
      }
    };
    term.focus();
  }

  /** Ends the shell (closing the socket hangs it up). */
  close(): void {
    this.ws?.close();
    this.ws = undefined;
    this.term?.dispose();
    this.term = undefined;
    this.setState("");
  }

  /** The screen's text, for the browser test. */
  text(): string {
    const b = this.term?.buffer.active;
    if (!b) return "";
    const lines: string[] = [];
    for (let i = 0; i < b.length; i++) lines.push(b.getLine(i)?.translateToString(true) ?? "");
    return lines.join("\n");
  }

  private setState(s: string): void {
    this.state = s;
    this.status.textContent = s;
    this.el.dataset.state = s;
  }
}
