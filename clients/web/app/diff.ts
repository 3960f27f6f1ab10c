// The Diff tab: GetDiff's unified diff cut into one collapsible section per
// file (its path and +added −removed counts, lines coloured by kind), and a
// sentence instead of a diff when the workspace has none to give: it is no
// git repository, or git is not installed (branching on the answer's reason,
// never on its text).
import { DiffReason, type WorkspaceDiff } from "../src/index.js";
import { h } from "./dom.js";

export interface DiffFile {
  path: string;
  added: number;
  removed: number;
  lines: string[];
}

export interface DiffView {
  /** A sentence for a workspace without a diff; empty when there is one. */
  why: string;
  files: DiffFile[];
  truncated: boolean;
}

/** Files shown open at first; the rest start collapsed (their header stays). */
const OPEN_FILES = 20;

export function diffView(d: WorkspaceDiff): DiffView {
  if (d.reason === DiffReason.NOT_A_GIT_REPO) {
    return { why: "This workspace is not a git repository, so there are no changes to compare. Run git init in it to see what the agent changes.", files: [], truncated: false };
  }
  if (d.reason === DiffReason.GIT_UNAVAILABLE) {
    return { why: "git is not installed on the server, so the changes cannot be shown.", files: [], truncated: false };
  }
  return { why: "", files: splitDiff(d.diff), truncated: d.truncated };
}

/** A unified diff (`diff --git` headers) as files; text before the first header is dropped. */
export function splitDiff(text: string): DiffFile[] {
  const files: DiffFile[] = [];
  let cur: DiffFile | undefined;
  for (const line of text.split("\n")) {
    const head = /^diff --git a\/(.*) b\/(.*)$/.exec(line);
    if (head) {
      cur = { path: head[2] ?? head[1] ?? "", added: 0, removed: 0, lines: [] };
      files.push(cur);
      continue;
    }
    if (!cur) continue;
    if (line.startsWith("+++ ") || line.startsWith("--- ")) continue;
    if (/^(index |new file mode|deleted file mode|similarity |rename |old mode|new mode)/.test(line)) continue;
    if (line.startsWith("+")) cur.added++;
    else if (line.startsWith("-")) cur.removed++;
    cur.lines.push(line);
  }
  for (const f of files) while (f.lines.length && f.lines[f.lines.length - 1] === "") f.lines.pop();
  return files;
}

export function diffPanel(view: DiffView | undefined, open: Set<string>): HTMLElement {
  if (!view) return h("p", { class: "hint", id: "diff" }, "Reading the diff…");
  if (view.why) return h("p", { class: "hint diff-why", id: "diff", "data-reason": "none" }, view.why);
  if (view.files.length === 0) return h("p", { class: "hint", id: "diff", "data-files": "0" }, "No changes: the workspace matches its last commit.");
  const list = h("div", { class: "diff", id: "diff", "data-files": String(view.files.length) });
  view.files.forEach((f, i) => {
    const key = `diff:${f.path}`;
    const pre = h("pre", { class: "diff-lines" });
    for (const line of f.lines) {
      const kind = line.startsWith("@@") ? "hunk" : line.startsWith("+") ? "add" : line.startsWith("-") ? "del" : "ctx";
      pre.appendChild(h("span", { class: `diff-${kind}` }, line + "\n"));
    }
    const d = h(
      "details",
      { class: "diff-file", "data-path": f.path, open: open.has(key) || (i < OPEN_FILES && !open.has(`${key}:closed`)) },
      h(
        "summary",
        {},
        h("span", { class: "diff-path" }, f.path),
        h("span", { class: "diff-count" }, h("span", { class: "diff-added" }, `+${f.added}`), " ", h("span", { class: "diff-removed" }, `−${f.removed}`)),
      ),
      pre,
    );
    d.addEventListener("toggle", () => {
      open.delete(d.open ? `${key}:closed` : key);
      open.add(d.open ? key : `${key}:closed`);
    });
    list.appendChild(d);
  });
  if (view.truncated) list.appendChild(h("p", { class: "hint" }, "The diff is longer than the server sends (1 MiB): this is its beginning."));
  return list;
}
