// The header: the session drawer's button (on a phone), the model, the
// permission mode as a select that switches it (SetMode), the connection
// state in words with a tooltip saying what it means, the other viewers of
// the open session as avatars (each with a tooltip), the right-hand panel's
// tabs (Files, Diff, Tasks, Workers, Plan with its open items' count,
// Terminal, Settings), /admin and log out.
import {
  enumFromJsonName,
  enumJsonName,
  PermissionMode,
  PermissionModeSchema,
  SurfaceSchema,
  storedKey,
  type Client,
  type FollowerState,
} from "../src/index.js";
import { button, h } from "./dom.js";
import { openCount, planOf } from "./plan.js";
import { ctx, onErrorNow, state, type Side } from "./state.js";

const CONN: Record<FollowerState, [string, string]> = {
  idle: ["offline", "Not connected to the server yet."],
  connecting: ["connecting…", "Connecting to the server's live stream."],
  open: ["live", "Connected: runs, approvals and other viewers show up as they happen."],
  reconnecting: ["reconnecting…", "The connection to the server dropped; trying again. Nothing is lost: the page catches up when it is back."],
  closed: ["offline", "Not connected to the server: the page will not update until it is reloaded."],
};

/** The connection state in words, and what it means. */
export function connWords(st: FollowerState): [string, string] {
  return CONN[st] ?? ["offline", "Not connected."];
}

const SURFACE: Record<string, [string, string]> = {
  stream: ["W", "a browser tab or app (the /stream connection)"],
  sse: ["S", "a program following the session's events (SSE)"],
  grpc: ["G", "a program on the gRPC API"],
};

const MODES = [PermissionMode.DEFAULT, PermissionMode.ACCEPT_EDITS, PermissionMode.PLAN];
const MODE_HINT: Record<string, string> = {
  default: "asks before edits and commands",
  "accept-edits": "edits files without asking; still asks for commands",
  plan: "reads and plans; changes nothing until you approve the plan",
  bypass: "runs everything without asking",
};

export function header(): HTMLElement {
  const r = state.config?.route;
  const [words, tip] = connWords(state.conn);
  return h(
    "header",
    { class: "top" },
    button("Sessions", () => {
      state.drawer = !state.drawer;
      ctx.render();
      if (state.drawer) document.getElementById("new-session")?.focus();
    }, { class: "drawer-toggle", id: "toggle-sidebar", "aria-expanded": state.drawer ? "true" : "false", "aria-controls": "sidebar" }),
    h("strong", { class: "brand" }, "vak"),
    h("span", { class: "route", id: "route", title: r ? `model route: ${r.provider} · ${r.model}${r.baseUrl ? ` at ${r.baseUrl}` : ""}` : "" }, r ? `${r.label || r.provider} · ${r.model}` : ""),
    modeSelect(),
    h("span", { class: `conn conn-${state.conn}`, id: "conn", role: "status", "data-state": state.conn, title: tip, "aria-label": `connection: ${words}. ${tip}` }, h("span", { class: "conn-dot", "aria-hidden": "true" }), words),
    presence(),
    h("div", { class: "panel-tabs", role: "tablist", "aria-label": "side panel" }, ...tabs()),
    h("a", { href: `/admin?key=${encodeURIComponent(storedKey(location.origin) ?? "")}`, id: "admin-link", class: "admin-link" }, "Admin"),
    button("Log out", () => ctx.logout(), { id: "logout", class: "small" }),
  );
}

function modeSelect(): HTMLElement {
  const current = state.config ? enumJsonName(PermissionModeSchema, state.config.permissionMode) : "";
  const select = h("select", { id: "mode-select", "aria-label": "permission mode", disabled: !state.config });
  const modes = state.config?.permissionMode === PermissionMode.BYPASS ? [...MODES, PermissionMode.BYPASS] : MODES;
  for (const m of modes) {
    const name = enumJsonName(PermissionModeSchema, m);
    select.appendChild(h("option", { value: name, selected: name === current, title: MODE_HINT[name] }, name));
  }
  select.addEventListener("change", () => {
    const mode = enumFromJsonName(PermissionModeSchema, select.value);
    if (mode === undefined) return;
    void ctx.client.setMode({ mode: mode as PermissionMode }).then(() => {
      state.notice = `Mode set to ${select.value}: ${MODE_HINT[select.value] ?? ""}.`;
      ctx.schedule();
    }, onErrorNow);
  });
  return h("label", { class: "mode", id: "mode", title: MODE_HINT[current] ?? "" }, h("span", { class: "mode-label" }, "mode"), select);
}

/** The open session's other viewers, one avatar each; nothing when this tab is alone. */
function presence(): HTMLElement {
  const s = state.sessions.get(state.current);
  const own = ctx.follower?.streamId ?? "";
  const others: Client[] = (s?.clients ?? []).filter((c) => c.clientId !== own);
  const el = h("div", { class: "presence", id: "presence", "data-others": String(others.length), "aria-label": others.length ? `${others.length} other ${others.length === 1 ? "viewer" : "viewers"} of this session` : "no other viewers" });
  if (others.length) el.setAttribute("role", "group");
  for (const c of others.slice(0, 5)) {
    const surface = enumJsonName(SurfaceSchema, c.surface);
    const [letter, what] = SURFACE[surface] ?? ["?", "another client"];
    el.appendChild(h("span", { class: `avatar avatar-${surface}`, title: `Also watching: ${what}`, role: "img", "aria-label": `Also watching: ${what}` }, letter));
  }
  if (others.length > 5) el.appendChild(h("span", { class: "avatar more", title: `${others.length - 5} more viewers` }, `+${others.length - 5}`));
  return el;
}

function tabs(): HTMLElement[] {
  const list: [Exclude<Side, "">, string][] = [
    ["files", "Files"],
    ["diff", "Diff"],
    ["tasks", "Tasks"],
    ["workers", "Workers"],
    ["plan", "Plan"],
  ];
  if (state.host?.features?.terminal) list.push(["terminal", "Terminal"]);
  list.push(["settings", "Settings"]);
  // How many items of the open session's plan are still open, beside its tab.
  const open = openCount(planOf(state.sessions.get(state.current)));
  return list.map(([side, label]) => {
    const tab = button(label, () => ctx.openSide(side), {
      id: `show-${side}`,
      class: "tab",
      role: "tab",
      "aria-selected": state.side === side ? "true" : "false",
      "aria-controls": "side",
    });
    if (side === "plan" && open > 0) tab.append(" ", h("span", { class: "tab-count", id: "plan-open-count" }, String(open)), h("span", { class: "sr-only" }, " open"));
    return tab;
  });
}
