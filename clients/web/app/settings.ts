// The app's settings panel: the model route and the permission mode (from
// GetConfig and the stream's config frames), and the MCP servers
// (GetMcpConfig, read when the panel opens and on Refresh): each with its
// transport, its state (ready, starting, failed, disabled: a class and a
// data-state each), its tools (collapsed when there are many), pid, restarts
// and last error. Read-only: the table is changed with PUT /config/mcp.
import {
  enumJsonName,
  McpServerStateSchema,
  PermissionModeSchema,
  type ConfigInfo,
  type McpConfig,
  type McpServer,
} from "../src/index.js";
import { button, h } from "./dom.js";

/** More tools than this are listed collapsed (their count stays visible). */
const OPEN_TOOLS = 8;

export interface SettingsView {
  config: ConfigInfo | undefined;
  /** undefined until the first GetMcpConfig answer. */
  mcp: McpConfig | undefined;
  /** Whose tool lists the user opened or closed (by server name), kept across re-renders. */
  toolsOpen: Map<string, boolean>;
}

export function settingsPanel(view: SettingsView, refresh: () => Promise<void>, close: () => void): HTMLElement {
  const r = view.config?.route;
  return h(
    "aside",
    { class: "side side-settings", id: "side" },
    h("div", { class: "side-head" }, h("strong", {}, "Settings"), button("Close", close, { class: "small", id: "close-settings" })),
    h(
      "dl",
      { class: "settings-config" },
      h("dt", {}, "Model"),
      h("dd", { id: "settings-route" }, r ? `${r.label || r.provider} · ${r.model}` : "…"),
      h("dt", {}, "Permission mode"),
      h("dd", { id: "settings-mode" }, view.config ? enumJsonName(PermissionModeSchema, view.config.permissionMode) : "…"),
    ),
    h(
      "div",
      { class: "side-head" },
      h("strong", {}, "MCP servers"),
      button("Refresh", refresh, { class: "small", id: "refresh-mcp" }),
    ),
    mcpServers(view),
  );
}

function mcpServers(view: SettingsView): HTMLElement {
  if (!view.mcp) return h("p", { class: "hint", id: "mcp-servers" }, "Loading…");
  const names = Object.keys(view.mcp.servers).sort();
  if (names.length === 0) {
    return h("p", { class: "hint", id: "mcp-servers", "data-count": "0" }, "No MCP servers (configure them in config.toml's [mcp.servers] or with PUT /config/mcp).");
  }
  const list = h("ul", { class: "mcp-servers", id: "mcp-servers", "data-count": String(names.length) });
  for (const name of names) list.appendChild(server(name, view.mcp.servers[name] as McpServer, view.toolsOpen));
  return list;
}

function server(name: string, s: McpServer, toolsOpen: Map<string, boolean>): HTMLElement {
  const state = enumJsonName(McpServerStateSchema, s.state) || "unknown";
  const transport = s.url !== undefined ? `url ${s.url}` : `command ${[s.command ?? "", ...s.args].join(" ")}`;
  const facts: string[] = [`${s.toolCount} ${s.toolCount === 1 ? "tool" : "tools"}`];
  if (s.pid !== undefined) facts.push(`pid ${s.pid}`);
  if (s.restarts > 0) facts.push(`${s.restarts} ${s.restarts === 1 ? "restart" : "restarts"}`);
  const tools = h("ul", { class: "mcp-tools" }, ...s.tools.map((t) => h("li", {}, h("code", {}, t))));
  const details = h(
    "details",
    { class: "mcp-tool-list", open: toolsOpen.get(name) ?? s.tools.length <= OPEN_TOOLS },
    h("summary", {}, `Tools (${s.tools.length})`),
    tools,
  );
  details.addEventListener("toggle", () => toolsOpen.set(name, details.open));
  return h(
    "li",
    { class: `mcp-server mcp-${state}`, "data-server": name, "data-state": state },
    h("div", { class: "mcp-head" }, h("strong", { class: "mcp-name" }, name), h("span", { class: "mcp-state" }, state)),
    h("div", { class: "mcp-transport", title: transport }, transport),
    h("div", { class: "mcp-facts" }, facts.join(" · ")),
    s.lastError ? h("pre", { class: "mcp-error" }, s.lastError) : null,
    s.tools.length ? details : null,
  );
}
