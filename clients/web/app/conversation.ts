// The open session: its timeline (toolcard.ts) and the composer. Enter sends
// (steers while a run is live), Shift+Enter is a new line, Esc stops the live
// run, Up in an empty box brings back the last prompt to edit; a Stop button
// while a run is live; a "retrying (n/m): reason" line while the run waits to
// try the model service again. A "/" at the start of the box lists the
// promoted skills as slash commands (slash.ts).
import { enumJsonName, ItemKindSchema } from "../src/index.js";
import { button, h } from "./dom.js";
import { ctx, describe, onErrorNow, state, titleOf, type SessionView } from "./state.js";
import { renderTimeline } from "./toolcard.js";
import { chosen, move, slashMenu, slashQuery } from "./slash.js";

export function conversationPane(errors: () => HTMLElement): HTMLElement {
  const s = state.sessions.get(state.current);
  if (!s) {
    return h(
      "main",
      { class: "conversation empty", id: "main" },
      h("div", { class: "welcome" }, h("h1", {}, "vak"), h("p", {}, "Start a new session, or pick one from the list."), button("+ New session", () => ctx.create(), { class: "primary", id: "new-session-main" })),
      errors(),
    );
  }
  const items = h("div", { class: "timeline", id: "timeline", role: "log", "aria-label": `conversation: ${titleOf(s, s.summary.sessionId)}` });
  for (const el of renderTimeline(s)) items.appendChild(el);
  if (!s.timeline.items.length) items.appendChild(h("p", { class: "hint start" }, "Ask vak to read, change or run something in this workspace."));
  return h(
    "main",
    { class: "conversation", id: "main", "data-session": s.summary.sessionId },
    h("div", { class: "scroll", id: "scroll" }, items),
    retrying(s),
    composer(s),
    errors(),
  );
}

function retrying(s: SessionView): HTMLElement | null {
  const r = s.retrying;
  if (!r) return null;
  return h("div", { class: "retrying", id: "retrying", role: "status" }, `retrying (${r.attempt}/${r.of}): ${r.reason}`);
}

/** The text of the session's last prompt (what Up brings back). */
function lastPrompt(s: SessionView): string {
  for (let i = s.timeline.items.length - 1; i >= 0; i--) {
    const it = s.timeline.items[i];
    if (it && enumJsonName(ItemKindSchema, it.kind) === "user_input") return it.text;
  }
  return "";
}

function composer(s: SessionView): HTMLElement {
  const id = s.summary.sessionId;
  const prompt = h("textarea", {
    id: "prompt",
    rows: "1",
    placeholder: s.busy ? "Steer the run in flight…" : "Ask vak…",
    "aria-label": s.busy ? "steer the run" : "prompt",
    "aria-describedby": "composer-hint",
  });
  const send = async () => {
    const text = prompt.value;
    if (!text.trim()) return;
    prompt.value = "";
    ctx.toBottom = true;
    try {
      if (s.busy) await ctx.client.steer({ sessionId: id, text });
      else await ctx.client.run({ sessionId: id, prompt: text });
    } catch (err) {
      // Not sent: the words come back to the box.
      const el = document.getElementById("prompt") as HTMLTextAreaElement | null;
      if (el && !el.value) el.value = text;
      throw err;
    }
    // Only what was sent: the person may have typed the next message while
    // this one was on its way (a fast second steer was wiped here before).
    const el = document.getElementById("prompt") as HTMLTextAreaElement | null;
    if (el && el.value === text) el.value = "";
  };
  const stop = () => ctx.client.cancel({ sessionId: id }).then(() => {
    state.notice = "Stopped the run.";
    ctx.schedule();
  });
  const slash = state.slash;
  // Only the open session's list: another session's may be another workspace's.
  if (slash.open && slash.session !== id) slash.open = false;
  const choose = (name: string) => {
    const el = (document.getElementById("prompt") as HTMLTextAreaElement | null) ?? prompt;
    el.value = `/${name} `;
    el.setSelectionRange(el.value.length, el.value.length);
    slash.open = false;
    ctx.schedule();
  };
  prompt.addEventListener("input", () => {
    const query = slashQuery(prompt.value);
    if (query === undefined) {
      if (slash.open) {
        slash.open = false;
        ctx.schedule();
      }
      return;
    }
    if (!slash.open) openSlash(id);
    slash.query = query;
    slash.selected = 0;
    ctx.schedule();
  });
  prompt.addEventListener("keydown", (e) => {
    if (e.isComposing) return;
    const pick = chosen(slash);
    if (slash.open && (e.key === "ArrowDown" || e.key === "ArrowUp")) {
      e.preventDefault();
      move(slash, e.key === "ArrowDown" ? 1 : -1);
      ctx.schedule();
    } else if (pick && (e.key === "Tab" || (e.key === "Enter" && !e.shiftKey && !e.altKey))) {
      e.preventDefault();
      choose(pick.name);
    } else if (slash.open && e.key === "Escape") {
      // Closes the list only; a second Esc stops a live run.
      e.preventDefault();
      e.stopPropagation();
      slash.open = false;
      ctx.schedule();
    } else if (e.key === "Enter" && !e.shiftKey && !e.altKey) {
      e.preventDefault();
      void send().catch(onErrorNow);
    } else if (e.key === "Escape" && s.busy) {
      e.preventDefault();
      void stop().catch(onErrorNow);
    } else if (e.key === "ArrowUp" && prompt.value === "") {
      const last = lastPrompt(s);
      if (!last) return;
      e.preventDefault();
      prompt.value = last;
      prompt.setSelectionRange(last.length, last.length);
    }
  });
  if (slash.open) prompt.setAttribute("aria-controls", "slash");
  return h(
    "div",
    { class: "composer" },
    slashMenu(slash, choose),
    h(
      "div",
      { class: "composer-box" },
      prompt,
      s.busy ? button("Stop", stop, { id: "cancel", class: "danger stop", title: "Stop the run (Esc)" }) : null,
      button(s.busy ? "Steer" : "Send", send, { id: "send", class: "primary", title: s.busy ? "Send to the run in flight (Enter)" : "Send (Enter)" }),
    ),
    h(
      "p",
      { class: "composer-hint", id: "composer-hint" },
      h("kbd", {}, "Enter"), " sends · ", h("kbd", {}, "Shift"), "+", h("kbd", {}, "Enter"), " new line · ",
      h("kbd", {}, "↑"), " edits your last prompt · ", h("kbd", {}, "/"), " lists the skills",
      s.busy ? " · " : null,
      s.busy ? h("kbd", {}, "Esc") : null,
      s.busy ? " stops the run" : null,
    ),
  );
}

/** Opens the slash list for session `id` and reads its skills afresh. */
function openSlash(id: string): void {
  const slash = state.slash;
  Object.assign(slash, { open: true, session: id, skills: undefined, error: "" });
  ctx.client
    .listSkills({ sessionId: id })
    .then((list) => {
      if (slash.session === id) slash.skills = list.skills;
    })
    .catch((err: unknown) => {
      if (slash.session === id) slash.error = describe(err);
    })
    .finally(() => ctx.schedule());
}
