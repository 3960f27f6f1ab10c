// A small markdown subset rendered by building DOM nodes: fenced code, headings,
// bullet and numbered lists, paragraphs, `code`, **bold** and *emphasis*.
// Everything else, HTML included, is text: the model's output never reaches
// innerHTML, so `<script>` or `<img onerror>` is shown, never run. A fenced
// block is highlighted (highlight.ts) and has a copy button.
import { button, h } from "./dom.js";
import { highlightInto } from "./highlight.js";

export function renderMarkdown(text: string): DocumentFragment {
  const frag = document.createDocumentFragment();
  const lines = text.split("\n");
  let para: string[] = [];
  let list: HTMLElement | undefined;
  const flushPara = () => {
    if (para.length) frag.appendChild(h("p", {}, ...inline(para.join("\n"))));
    para = [];
  };
  const flushList = () => {
    if (list) frag.appendChild(list);
    list = undefined;
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i] ?? "";
    const fence = /^```\s*([\w+-]*)\s*$/.exec(line);
    if (fence) {
      flushPara();
      flushList();
      const body: string[] = [];
      i++;
      while (i < lines.length && !/^```\s*$/.test(lines[i] ?? "")) body.push(lines[i++] ?? "");
      frag.appendChild(codeBlock(body.join("\n"), fence[1] ?? ""));
      continue;
    }
    const heading = /^(#{1,6})\s+(.*)$/.exec(line);
    if (heading) {
      flushPara();
      flushList();
      const level = Math.min(6, (heading[1] ?? "#").length + 2) as 3 | 4 | 5 | 6;
      frag.appendChild(h(`h${level}`, {}, ...inline(heading[2] ?? "")));
      continue;
    }
    const bullet = /^\s*(?:[-*+]|(\d+)[.)])\s+(.*)$/.exec(line);
    if (bullet) {
      flushPara();
      const ordered = bullet[1] !== undefined;
      if (!list || (list.tagName === "OL") !== ordered) {
        flushList();
        list = h(ordered ? "ol" : "ul");
      }
      list.appendChild(h("li", {}, ...inline(bullet[2] ?? "")));
      continue;
    }
    if (line.trim() === "") {
      flushPara();
      flushList();
      continue;
    }
    flushList();
    para.push(line);
  }
  flushPara();
  flushList();
  return frag;
}

/** Inline spans: `code` first (nothing inside it is markup), then **bold** and *em*. */
export function inline(text: string): Node[] {
  const out: Node[] = [];
  const re = /`([^`\n]+)`|\*\*([^*\n]+)\*\*|\*([^*\n]+)\*/g;
  let last = 0;
  for (let m = re.exec(text); m; m = re.exec(text)) {
    if (m.index > last) out.push(document.createTextNode(text.slice(last, m.index)));
    if (m[1] !== undefined) out.push(h("code", {}, m[1]));
    else if (m[2] !== undefined) out.push(h("strong", {}, m[2]));
    else out.push(h("em", {}, m[3] ?? ""));
    last = m.index + m[0].length;
  }
  if (last < text.length) out.push(document.createTextNode(text.slice(last)));
  return out;
}

/** A fenced block: its language, a copy button, and the code (highlighted when the language is known). */
export function codeBlock(text: string, lang: string): HTMLElement {
  const code = h("code", lang ? { "data-lang": lang } : {});
  highlightInto(code, text, lang.toLowerCase());
  const copy = button(
    "Copy",
    async () => {
      try {
        await navigator.clipboard.writeText(text);
        copy.textContent = "Copied";
      } catch {
        // No clipboard API (a page served over plain http to another machine): select the code to copy by hand.
        const range = document.createRange();
        range.selectNodeContents(code);
        getSelection()?.removeAllRanges();
        getSelection()?.addRange(range);
        copy.textContent = "Selected: press Ctrl+C";
      }
      setTimeout(() => (copy.textContent = "Copy"), 2000);
    },
    { class: "small copy", "aria-label": lang ? `Copy the ${lang} code` : "Copy the code" },
  );
  return h(
    "div",
    { class: "code-block" },
    h("div", { class: "code-head" }, h("span", { class: "code-lang" }, lang || "text"), copy),
    h("pre", { class: "code" }, code),
  );
}
