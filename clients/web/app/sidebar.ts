// The session list: New session and the search on top (always in view), then
// the sessions grouped by workspace, each row its title, when it last changed
// and a dot while a run is live, with its actions (rename, delete) in a row
// menu that opens in the row's own line (so it never overflows the list);
// at the bottom, where a new session runs and a form to open another folder.
// On a phone the list is a drawer the header's Sessions button opens.
import { button, h } from "./dom.js";
import { ctx, folderName, onErrorNow, relativeTime, state, titleOf, type SessionView } from "./state.js";

export function sidebar(): HTMLElement {
  return h(
    "nav",
    { class: `sidebar${state.drawer ? " open" : ""}`, id: "sidebar", "aria-label": "sessions" },
    h(
      "div",
      { class: "sidebar-top" },
      h(
        "div",
        { class: "sidebar-actions" },
        button("+ New session", () => ctx.create(), { id: "new-session", class: "primary" }),
        // On a phone the list is a drawer over the page: it closes here too.
        button("Close", () => {
          state.drawer = false;
          ctx.render();
          document.getElementById("toggle-sidebar")?.focus();
        }, { class: "drawer-close", id: "close-sidebar", "aria-label": "close the session list" }),
      ),
      searchBox(),
    ),
    sessionGroups(),
    workspacePicker(),
  );
}

/** The sessions by workspace: the server's own first, then the others by their newest session. */
function sessionGroups(): HTMLElement {
  const home = state.host?.workspace ?? "";
  const groups = new Map<string, string[]>();
  for (const id of state.order) {
    const s = state.sessions.get(id);
    if (!s) continue;
    const ws = s.summary.workspace || home;
    const g = groups.get(ws) ?? [];
    g.push(id);
    groups.set(ws, g);
  }
  const names = [...groups.keys()].sort((a, b) => (a === home ? -1 : b === home ? 1 : 0));
  const wrap = h("div", { class: "session-groups", id: "sessions", "data-count": String(state.order.length) });
  for (const ws of names) {
    const ids = groups.get(ws) ?? [];
    const label = folderName(ws);
    const headingId = `ws-${[...ws].reduce((n, c) => (n * 31 + c.charCodeAt(0)) >>> 0, 7).toString(36)}`;
    const list = h("ul", { class: "sessions", "aria-labelledby": headingId });
    for (const id of ids) list.appendChild(row(id, state.sessions.get(id) as SessionView));
    wrap.appendChild(
      h("section", { class: "ws-group", "data-workspace": ws }, names.length > 1 || ws !== home ? h("h2", { class: "ws-name", id: headingId, title: ws === home ? `the server's workspace: ${ws}` : ws }, label) : h("h2", { class: "ws-name sr-only", id: headingId }, label), list),
    );
  }
  if (!state.order.length) wrap.appendChild(h("p", { class: "hint" }, "No sessions yet: start one with New session."));
  return wrap;
}

function row(id: string, s: SessionView): HTMLElement {
  const title = titleOf(s, id);
  const li = h("li", { class: id === state.current ? "current" : "", "data-session": id, "data-busy": s.busy ? "true" : "false" });
  if (state.renaming === id) {
    li.appendChild(renameForm(id, s));
    return li;
  }
  const when = s.active || Date.parse(s.summary.createdAt);
  const open = h(
    "a",
    { href: `/app/s/${id}`, class: "open", id: `open-${id}`, "aria-current": id === state.current ? "page" : undefined },
    h("span", { class: `dot${s.busy ? " busy" : ""}`, title: s.busy ? "a run is live" : "", "aria-label": s.busy ? "running" : undefined, role: s.busy ? "img" : undefined }),
    h("span", { class: "title" }, title),
    h("span", { class: "when", title: new Date(when).toLocaleString() }, relativeTime(when)),
  );
  open.addEventListener("click", (e) => {
    e.preventDefault();
    state.drawer = false;
    ctx.select(id);
  });
  const menuOpen = state.menu === id;
  const toggle = button("⋯", () => {
    state.menu = menuOpen ? "" : id;
    state.confirmDelete = "";
    ctx.render();
    if (!menuOpen) document.querySelector<HTMLElement>(`li[data-session="${id}"] .row-actions button`)?.focus();
  }, { class: "row-menu", id: `menu-${id}`, "aria-label": `Actions for ${title}`, "aria-expanded": menuOpen ? "true" : "false", title: "Rename or delete" });
  li.append(h("div", { class: "row-main" }, open, toggle));
  if (menuOpen) li.appendChild(actions(id));
  return li;
}

function actions(id: string): HTMLElement {
  const confirming = state.confirmDelete === id;
  return h(
    "div",
    { class: "row-actions", role: "group", "aria-label": "session actions" },
    confirming ? h("span", { class: "confirm" }, "Delete it and its history?") : null,
    confirming
      ? button("Really delete?", () => ctx.remove(id), { class: "small danger row-delete-confirm", id: `delete-really-${id}` })
      : button("Rename", () => {
          state.renaming = id;
          state.menu = "";
          ctx.render();
          document.getElementById(`rename-${id}`)?.focus();
        }, { class: "small row-rename", id: `rename-btn-${id}` }),
    confirming
      ? button("Keep it", () => {
          state.confirmDelete = "";
          ctx.render();
        }, { class: "small", id: `delete-keep-${id}` })
      : button("Delete", () => {
          state.confirmDelete = id;
          ctx.render();
        }, { class: "small danger row-delete", id: `delete-btn-${id}` }),
  );
}

function renameForm(id: string, s: SessionView): HTMLElement {
  const input = h("input", { id: `rename-${id}`, value: s.summary.title, "aria-label": "new title", maxlength: "200" });
  const form = h(
    "form",
    { class: "rename" },
    input,
    h("button", { type: "submit", class: "small" }, "Save"),
    button("Cancel", () => {
      state.renaming = "";
      ctx.render();
    }, { class: "small" }),
  );
  input.addEventListener("keydown", (e) => {
    if (e.key === "Escape") {
      state.renaming = "";
      ctx.render();
    }
  });
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    void ctx.client
      .renameSession({ sessionId: id, title: input.value })
      .then((summary) => {
        s.summary = summary;
        state.renaming = "";
        state.notice = `Renamed to “${summary.title}”.`;
        ctx.schedule();
      })
      .catch(onErrorNow);
  });
  return form;
}

/** Finds old conversations: each hit names its session and opens it. */
function searchBox(): HTMLElement {
  const input = h("input", { id: "search", type: "search", value: state.search.q, placeholder: "Search conversations", "aria-label": "search conversations" });
  const form = h("form", { class: "search", role: "search" }, input);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const q = input.value.trim();
    if (!q) {
      state.search = { q: "", hits: [], done: false };
      ctx.render();
      return;
    }
    void ctx.client
      .search({ q, limit: 20 })
      .then((r) => {
        state.search = { q, hits: r.hits, done: true };
        ctx.render();
      })
      .catch(onErrorNow);
  });
  const hits = h("ul", { class: "hits", id: "search-hits" });
  for (const hit of state.search.hits) {
    const title = titleOf(state.sessions.get(hit.sessionId), hit.sessionId);
    // The snippet marks matches with ** (Markdown bold): shown as text, without them.
    const a = h("a", { href: `/app/s/${hit.sessionId}`, "data-session": hit.sessionId }, h("strong", {}, title), " ", hit.snippet.replaceAll("**", ""));
    a.addEventListener("click", (e) => {
      e.preventDefault();
      state.drawer = false;
      if (state.sessions.has(hit.sessionId)) ctx.select(hit.sessionId);
    });
    hits.appendChild(h("li", {}, a));
  }
  const none = state.search.done && state.search.hits.length === 0 ? h("p", { class: "hint" }, `Nothing found for ${state.search.q}.`) : null;
  const clear = state.search.done
    ? button("Clear search", () => {
        state.search = { q: "", hits: [], done: false };
        input.value = "";
        ctx.render();
      }, { class: "small link", id: "clear-search" })
    : null;
  return h("div", { class: "search-box" }, form, hits, none, clear);
}

/** Where New session creates one (a trusted open workspace), and a form that opens (and trusts) another folder. */
function workspacePicker(): HTMLElement {
  const trusted = (state.host?.workspaces ?? []).filter((w) => w.trusted);
  const select = h("select", { id: "new-workspace", "aria-label": "workspace of a new session" });
  for (const w of trusted) {
    const value = w.primary ? "" : w.path;
    const name = folderName(w.path);
    select.appendChild(h("option", { value, title: w.path, selected: value === state.newWorkspace }, w.primary ? `${name} (the server's)` : name));
  }
  select.addEventListener("change", () => {
    state.newWorkspace = select.value;
  });
  const input = h("input", { id: "open-workspace", placeholder: "/absolute/folder", "aria-label": "folder to open" });
  const form = h("form", { class: "open-workspace" }, input, h("button", { type: "submit", class: "small" }, "Open"));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const path = input.value.trim();
    if (!path) return;
    void openWorkspace(path).catch(onErrorNow);
  });
  return h(
    "div",
    { class: "workspace-picker" },
    trusted.length > 1 ? h("label", { class: "field" }, h("span", {}, "New sessions in"), select) : null,
    h("label", { class: "field", for: "open-workspace" }, h("span", {}, "Open a folder")),
    form,
  );
}

async function openWorkspace(path: string): Promise<void> {
  const { workspace } = await ctx.client.openWorkspace({ path, trust: true });
  state.host = await ctx.client.getHost({});
  state.newWorkspace = workspace?.primary ? "" : workspace?.path ?? "";
  state.notice = `Opened ${path}: new sessions run there.`;
  const input = document.getElementById("open-workspace") as HTMLInputElement | null;
  if (input) input.value = "";
  ctx.render();
}
