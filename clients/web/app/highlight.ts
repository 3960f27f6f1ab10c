// Syntax highlighting for the conversation's code blocks: highlight.js's core
// with a few common languages, bundled. Its answer is HTML; it is parsed in an
// inert document and copied node by node, keeping only text and <span
// class="hljs-…">, so nothing the model wrote is ever parsed into the page.
import hljs from "highlight.js/lib/core";
import bash from "highlight.js/lib/languages/bash";
import css from "highlight.js/lib/languages/css";
import diff from "highlight.js/lib/languages/diff";
import go from "highlight.js/lib/languages/go";
import ini from "highlight.js/lib/languages/ini";
import javascript from "highlight.js/lib/languages/javascript";
import json from "highlight.js/lib/languages/json";
import markdown from "highlight.js/lib/languages/markdown";
import python from "highlight.js/lib/languages/python";
import rust from "highlight.js/lib/languages/rust";
import sql from "highlight.js/lib/languages/sql";
import typescript from "highlight.js/lib/languages/typescript";
import xml from "highlight.js/lib/languages/xml";
import yaml from "highlight.js/lib/languages/yaml";

const LANGUAGES = { bash, css, diff, go, ini, javascript, json, markdown, python, rust, sql, typescript, xml, yaml };
for (const [name, lang] of Object.entries(LANGUAGES)) hljs.registerLanguage(name, lang);
hljs.registerAliases(["sh", "shell", "console", "zsh"], { languageName: "bash" });
hljs.registerAliases(["js", "mjs", "jsx"], { languageName: "javascript" });
hljs.registerAliases(["ts", "tsx"], { languageName: "typescript" });
hljs.registerAliases(["py"], { languageName: "python" });
hljs.registerAliases(["rs"], { languageName: "rust" });
hljs.registerAliases(["toml"], { languageName: "ini" });
hljs.registerAliases(["html", "svg"], { languageName: "xml" });
hljs.registerAliases(["yml"], { languageName: "yaml" });
hljs.registerAliases(["md"], { languageName: "markdown" });

/** Longer code is shown plain (highlighting is for reading, not for megabytes). */
const MAX_CODE = 100_000;
const CLASS = /^hljs-[\w-]+(?: [\w-]+_*)*$/;

/** Fills `code` with `text`, highlighted when `lang` is one of the bundled languages; answers the language used. */
export function highlightInto(code: HTMLElement, text: string, lang: string): string {
  const name = lang && hljs.getLanguage(lang) ? lang : "";
  if (!name || text.length > MAX_CODE) {
    code.textContent = text;
    return "";
  }
  // The page re-renders every frame while a run streams: each block is highlighted once.
  const key = `${name}\0${text}`;
  let done = cache.get(key);
  if (!done) {
    const html = hljs.highlight(text, { language: name, ignoreIllegals: true }).value;
    const inert = new DOMParser().parseFromString(`<pre>${html}</pre>`, "text/html").body.firstElementChild;
    done = document.createDocumentFragment();
    done.append(...(inert ? copy(inert) : [document.createTextNode(text)]));
    if (cache.size >= CACHE) cache.delete(cache.keys().next().value as string);
    cache.set(key, done);
  }
  code.replaceChildren(done.cloneNode(true));
  code.classList.add("hljs");
  return name;
}

/** Highlighted blocks kept, oldest dropped first. */
const CACHE = 200;
const cache = new Map<string, DocumentFragment>();

/** The children of an inert node as live nodes: text, and spans with an hljs class. */
function copy(from: Element): Node[] {
  const out: Node[] = [];
  for (const n of from.childNodes) {
    if (n.nodeType === Node.TEXT_NODE) out.push(document.createTextNode(n.textContent ?? ""));
    else if (n instanceof Element) {
      const cls = n.getAttribute("class") ?? "";
      if (n.tagName === "SPAN" && CLASS.test(cls)) {
        const span = document.createElement("span");
        span.className = cls;
        span.append(...copy(n));
        out.push(span);
      } else out.push(...copy(n));
    }
  }
  return out;
}
