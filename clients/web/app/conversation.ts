// The open session: its timeline (toolcard.ts) and the composer. Enter sends
// (steers while a run is live), Shift+Enter is a new line, Esc stops the live
// run, Up in an empty box brings back the last prompt to edit; a Stop button
// while a run is live; a "retrying (n/m): reason" line while the run waits to
// try the model service again.
import { enumJsonName, ItemKindSchema } from "../src/index.js";
import { button, h } from "./dom.js";
import { ctx, onErrorNow, state, titleOf, type SessionView } from "./state.js";
import { renderTimeline } from "./toolcard.js";

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
    const el = document.getElementById("prompt") as HTMLTextAreaElement | null;
    if (el) el.value = "";
  };
  const stop = () => ctx.client.cancel({ sessionId: id }).then(() => {
    state.notice = "Stopped the run.";
    ctx.schedule();
  });
  prompt.addEventListener("keydown", (e) => {
    if (e.isComposing) return;
    if (e.key === "Enter" && !e.shiftKey && !e.altKey) {
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
  return h(
    "div",
    { class: "composer" },
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
      h("kbd", {}, "↑"), " edits your last prompt",
      s.busy ? " · " : null,
      s.busy ? h("kbd", {}, "Esc") : null,
      s.busy ? " stops the run" : null,
    ),
  );
}
