// The conversation's items as the page shows them: a prompt, the answer
// (markdown), thinking (collapsed), and each tool call as ONE card: its tool,
// the command or path as its title, its input once (collapsed when more than
// the title), the approval bar inside the card while it waits, a one-line
// note once the approval is settled, the output collapsed after, and how it
// ended (its exit status for a command). An approval and its tool call are
// paired by call_id wherever each appears in the timeline; an approval with
// no call (a plan) is a card of its own. The run's end says how it ended,
// with its stop_reason in words. The plan's items (plan_item) are not shown
// here but in the plan panel (plan.ts); the update_plan call's card opens it.
import { enumJsonName, ItemKindSchema, ItemStatusSchema, PlanExitMode, type TimelineItem } from "../src/index.js";
import { button, h } from "./dom.js";
import { inline, renderMarkdown } from "./markdown.js";
import { ctx, state, type SessionView } from "./state.js";

const STOP_WORDS: Record<string, string> = {
  max_tokens: "cut at the output limit",
  refusal: "the model refused",
  content_filter: "stopped by the provider's content filter",
};

const kindOf = (i: TimelineItem) => enumJsonName(ItemKindSchema, i.kind);
const statusOf = (i: TimelineItem) => enumJsonName(ItemStatusSchema, i.status);

/** The items of a session's timeline, tool calls and their approvals merged into cards. */
export function renderTimeline(s: SessionView): HTMLElement[] {
  const byCall = new Map<string, { call?: TimelineItem; approvals: TimelineItem[] }>();
  for (const item of s.timeline.items) {
    const k = kindOf(item);
    if ((k !== "tool_call" && k !== "approval") || !item.callId) continue;
    const g = byCall.get(item.callId) ?? { approvals: [] };
    if (k === "tool_call") g.call = item;
    else g.approvals.push(item);
    byCall.set(item.callId, g);
  }
  const out: HTMLElement[] = [];
  const done = new Set<string>();
  for (const item of s.timeline.items) {
    const k = kindOf(item);
    if (k === "plan_item") continue;
    if ((k === "tool_call" || k === "approval") && item.callId) {
      if (done.has(item.callId)) continue;
      done.add(item.callId);
      const g = byCall.get(item.callId) ?? { approvals: [] };
      out.push(toolCard(g.call, g.approvals));
      continue;
    }
    out.push(renderItem(item, s));
  }
  return out;
}

function attrs(item: TimelineItem, extra = ""): Record<string, string> {
  const kind = kindOf(item);
  const status = statusOf(item);
  return { class: `item ${kind} status-${status}${extra}`, "data-item": item.id, "data-kind": kind, "data-status": status };
}

function renderItem(item: TimelineItem, s: SessionView): HTMLElement {
  const status = statusOf(item);
  switch (kindOf(item)) {
    case "user_input":
      return h("div", attrs(item), h("div", { class: "who" }, "You"), h("div", { class: "text plain" }, item.text));
    case "assistant_text": {
      const body = h("div", { class: "text md" });
      body.appendChild(renderMarkdown(item.text));
      return h("div", attrs(item), h("div", { class: "who" }, "vak"), body);
    }
    case "thinking":
      return h("div", attrs(item), details(item.id, status === "streaming" ? "Thinking…" : "Thought", false, h("pre", { class: "plain" }, item.text)));
    case "approval":
      // An approval with no tool call (a plan to leave plan mode for).
      return toolCard(undefined, [item]);
    case "final_result":
      return finalResult(item, s);
    case "background":
      // Delivered between runs: a script's output, or (status failed) an alert.
      return h(
        "div",
        attrs(item),
        h("div", { class: "who" }, status === "failed" ? "⚠ background alert" : "⟲ background"),
        h("pre", { class: "text plain" }, item.text),
      );
    default:
      return h("div", attrs(item), item.text);
  }
}

function finalResult(item: TimelineItem, s: SessionView): HTMLElement {
  const status = statusOf(item);
  const stop = s.stopReasons.get(item.id);
  const a = attrs(item, stop ? " stopped" : "");
  if (stop) a["data-stop-reason"] = stop;
  const words = status === "completed" ? "Done" : status === "cancelled" ? "Stopped" : status === "failed" ? "Failed" : `Run ${status}`;
  const said = stop ? STOP_WORDS[stop] ?? item.text : item.text && item.text !== status ? item.text : "";
  return h("div", a, h("span", { class: "result-word" }, words), said ? h("span", { class: "result-text" }, `: ${said}`) : null);
}

/** A tool's title: the command, the path, the pattern or the URL it was given. */
export function titleFor(tool: string, input: Record<string, unknown> | undefined): string {
  if (!input) return "";
  for (const k of ["command", "cmd", "path", "file_path", "pattern", "url", "query", "prompt", "text", "name"]) {
    const v = input[k];
    if (typeof v === "string" && v) return v.split("\n")[0] ?? v;
  }
  if (tool === "exit_plan_mode") return "leave plan mode";
  return "";
}

const CALL_WORDS: Record<string, string> = { running: "running…", completed: "done", failed: "failed", cancelled: "cancelled" };
const APPROVAL_WORDS: Record<string, string> = { pending: "waiting for your approval", approved: "approved", denied: "denied", expired: "expired: nobody answered in time" };

function toolCard(call: TimelineItem | undefined, approvals: TimelineItem[]): HTMLElement {
  const first = call ?? (approvals[0] as TimelineItem);
  const pending = approvals.find((a) => statusOf(a) === "pending");
  const tool = first.tool || "tool";
  const input = (call?.input ?? approvals[0]?.input) as Record<string, unknown> | undefined;
  const title = titleFor(tool, input);
  const callStatus = call ? statusOf(call) : "";
  const words = pending ? APPROVAL_WORDS.pending : call ? CALL_WORDS[callStatus] ?? callStatus : APPROVAL_WORDS[statusOf(first)] ?? statusOf(first);
  // A command's exit status, from the bash tool's last output line ("[exit status: N]"), shown, never acted on.
  const exit = call && callStatus !== "running" ? /\[exit status: (-?\d+)\]\s*$/.exec(call.text)?.[1] : undefined;
  const phase = pending ? "pending" : call ? callStatus : statusOf(first);
  const a = call ? attrs(call, " card") : { class: `item approval-card card status-${phase}`, "data-item": first.id, "data-kind": "approval_card", "data-status": phase };
  a["data-call"] = first.callId;
  a["data-state"] = phase;
  const card = h(
    "div",
    a,
    h(
      "div",
      { class: "card-head" },
      h("span", { class: "tool-name" }, tool),
      title ? h("code", { class: "card-title", title }, title) : null,
      h("span", { class: `badge badge-${phase}` }, words, exit !== undefined ? ` · exit ${exit}` : ""),
    ),
  );
  // The input once: when it says more than the title (a file's content, several arguments).
  const json = JSON.stringify(input ?? {}, null, 2);
  const more = input && Object.keys(input).length > 0 && !(Object.keys(input).length === 1 && title);
  if (more) card.appendChild(details(`${first.id}:input`, "Input", false, h("pre", { class: "input" }, json)));
  for (const ap of approvals) card.appendChild(approvalBar(ap));
  if (call && (call.text || callStatus === "running")) {
    const lines = call.text ? call.text.split("\n").length : 0;
    card.appendChild(details(call.id, callStatus === "running" ? "Output so far" : `Output (${lines} ${lines === 1 ? "line" : "lines"})`, false, h("pre", { class: "output" }, call.text)));
  }
  // The plan it changed is in the plan panel.
  if (call && tool === "update_plan" && callStatus === "completed") {
    card.appendChild(h("div", { class: "actions" }, button("Show the plan", () => ctx.openSide("plan"), { class: "small show-plan", id: `show-plan-${call.id}` })));
  }
  return card;
}

function approvalBar(item: TimelineItem): HTMLElement {
  const status = statusOf(item);
  const sid = state.current;
  const a = attrs(item, status === "pending" ? " bar" : " settled");
  if (status !== "pending") {
    // (Why it was asked is the card's title; a denial's reason is in the output the model saw.)
    return h("div", a, h("span", { class: "settled-word" }, APPROVAL_WORDS[status] ?? status));
  }
  const reason = h("input", { id: `deny-reason-${item.id}`, placeholder: "reason (for deny)", "aria-label": "reason for denying" });
  const deny = button("Deny", () => ctx.client.approve({ sessionId: sid, requestId: item.requestId, approve: false, reason: reason.value }), { class: "deny danger", id: `deny-${item.id}` });
  const buttons =
    item.tool === "exit_plan_mode"
      ? // A plan: approving it leaves plan mode for the mode chosen here (docs/protocol.md section 13).
        [
          button("Approve, then accept edits", () => ctx.client.approve({ sessionId: sid, requestId: item.requestId, approve: true, mode: PlanExitMode.ACCEPT_EDITS }), { class: "approve-accept-edits primary", id: `approve-edits-${item.id}` }),
          button("Approve, then ask (default)", () => ctx.client.approve({ sessionId: sid, requestId: item.requestId, approve: true, mode: PlanExitMode.DEFAULT }), { class: "approve", id: `approve-${item.id}` }),
        ]
      : [
          button("Approve", () => ctx.client.approve({ sessionId: sid, requestId: item.requestId, approve: true }), { class: "approve primary", id: `approve-${item.id}` }),
          button("Always allow", () => ctx.client.approve({ sessionId: sid, requestId: item.requestId, approve: true, always: true }), { class: "always", id: `always-${item.id}`, title: "approve, and never ask again for this in this workspace" }),
        ];
  return h(
    "div",
    { ...a, role: "group", "aria-label": `approve ${item.tool}?` },
    item.text ? h("div", { class: "text why" }, ...inline(item.text)) : null,
    h("div", { class: "actions" }, ...buttons, reason, deny),
  );
}

export function details(id: string, summary: string, openByDefault: boolean, ...body: (Node | string)[]): HTMLElement {
  const d = h("details", { open: state.open.has(id) || (openByDefault && !state.open.has(`${id}:closed`)) }, h("summary", { id: `sum-${id}` }, summary), ...body);
  d.addEventListener("toggle", () => {
    if (d.open) state.open.add(id);
    else state.open.delete(id);
  });
  return d;
}
