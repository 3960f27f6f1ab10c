// The app's plan panel, beside the conversation of the open session. On top,
// the goal of the session's latest turn chain (docs/protocol.md section 40),
// when it has one: what the user asked rather than what the model promised,
// so that steering's effect is visible: the objective (the chain's first
// prompt, or what replaced it), the additions steering made, the revisions a
// correction or a replacement superseded (struck through), and where the
// chain stands (running, paused, cancelled, done) as a badge. The server sends
// the whole goal again at each change, and the snapshot after the chain's end
// has it done or cancelled (timeline.ts keeps it).
// Below it, the plan the model keeps with update_plan (section 38), one row
// per commitment with its status, its stakes, what a fulfilled close needs,
// how many tool calls it cites as evidence and, once closed, its verdict;
// "Close as fulfilled" and "Abandon" for an open one. A fulfilled close the
// cited evidence does not support is refused (409, evidence_missing): the
// server's message, which names each missing piece, shows under the row until
// the next close of it. The rows are the session's plan_item presentation
// items, which the stream keeps live with the rest of its timeline (app.ts),
// so the panel reads nothing of its own; the conversation leaves them out
// (toolcard.ts), the update_plan call's card stays there.
import { Code, ConnectError } from "@connectrpc/connect";
import {
  enumJsonName,
  GoalControlSchema,
  ItemKindSchema,
  PlanStatusSchema,
  RequirementKind,
  StakesSchema,
  Verdict,
  VerdictSchema,
  type Commitment,
  type GoalState,
  type Requirement,
  type TimelineItem,
} from "../src/index.js";
import { button, h, reportError } from "./dom.js";
import type { SessionView } from "./state.js";

export interface PlanView {
  /** Why the last close of a commitment was refused, by commitment id (the server's words). */
  refused: Map<string, string>;
}

export function emptyPlan(): PlanView {
  return { refused: new Map() };
}

export interface PlanActions {
  close: () => void;
  render: () => void;
  /** Closes a commitment; answers it closed (the client's CloseCommitment). */
  closeCommitment: (id: string, verdict: Verdict) => Promise<Commitment>;
  /** Says what an action did (the page's notice line). */
  notice: (text: string) => void;
}

/** A session's plan: the commitments of its plan_item items, in the plan's order. */
export function planOf(s: SessionView | undefined): Commitment[] {
  if (!s) return [];
  return s.timeline.items.flatMap((i) => (isPlanItem(i) && i.commitment ? [i.commitment] : []));
}

export function isPlanItem(i: TimelineItem): boolean {
  return enumJsonName(ItemKindSchema, i.kind) === "plan_item";
}

/** The commitments still open (not closed). */
export function openCount(plan: Commitment[]): number {
  return plan.filter((c) => !c.closed).length;
}

const STATUS_WORDS: Record<string, string> = { pending: "to do", in_progress: "in progress", done: "done", dropped: "dropped" };
const VERDICT_WORDS: Record<string, string> = { fulfilled: "fulfilled", abandoned: "abandoned", superseded: "superseded" };

export function planPanel(s: SessionView | undefined, view: PlanView, a: PlanActions): HTMLElement {
  const plan = planOf(s);
  const goal = s?.timeline.goal;
  return h(
    "aside",
    { class: "side side-plan", id: "side", "aria-label": "plan" },
    h("div", { class: "side-head" }, h("h2", {}, "Plan"), button("Close", a.close, { class: "small", id: "close-plan" })),
    goal ? goalSection(goal) : null,
    // Its own heading only beside a goal: alone, the panel's is enough.
    goal ? h("h3", { class: "plan-heading", id: "plan-heading" }, "Commitments") : null,
    h(
      "p",
      { class: "hint", id: "plan-help" },
      "What the model said it will do. Close an item as fulfilled once the tool calls it cites show it is done, or abandon it.",
    ),
    planList(plan, goal !== undefined, view, a),
  );
}

const CONTROL_WORDS: Record<string, string> = {
  running: "the run is working on it",
  paused: "its next leg waits for a “resume” (or a cancel)",
  cancelled: "the run was stopped",
  done: "the run ended",
};

/**
 * The goal: the objective, the additions and the superseded revisions, each
 * as the user wrote it, and the control state as a badge (its wire name, so
 * the page and the protocol say the same word; its meaning in the title).
 */
function goalSection(g: GoalState): HTMLElement {
  const control = enumJsonName(GoalControlSchema, g.control);
  const list = (id: string, label: string, texts: string[], struck: boolean) => {
    const ul = h("ul", { class: `goal-list ${id}`, id, "aria-label": label, "data-count": String(texts.length) });
    // (<s>: no longer what is asked; the list's label says "superseded" to a screen reader.)
    for (const t of texts) ul.appendChild(h("li", {}, struck ? h("s", {}, t) : t));
    return ul;
  };
  return h(
    "section",
    { class: `goal control-${control || "none"}`, id: "goal", "aria-labelledby": "goal-heading", "data-control": control },
    h(
      "div",
      { class: "goal-head" },
      h("h3", { id: "goal-heading" }, "Goal"),
      h("span", { class: "sr-only" }, "state: "),
      h("span", { class: `badge goal-control control-${control || "none"}`, id: "goal-control", title: CONTROL_WORDS[control] }, control || "unknown"),
    ),
    h("p", { class: "hint" }, "What was asked: the first prompt of the latest run, and what steering added or changed."),
    h(
      "dl",
      { class: "task-facts goal-facts" },
      h("dt", {}, "objective"),
      h("dd", { class: "goal-objective", id: "goal-objective" }, g.objective),
      g.additions.length ? h("dt", {}, "added") : null,
      g.additions.length ? h("dd", {}, list("goal-additions", "additions", g.additions, false)) : null,
      g.superseded.length ? h("dt", {}, "superseded") : null,
      g.superseded.length ? h("dd", {}, list("goal-superseded", "superseded revisions", g.superseded, true)) : null,
    ),
  );
}

function planList(plan: Commitment[], hasGoal: boolean, view: PlanView, a: PlanActions): HTMLElement {
  if (plan.length === 0) {
    // Beside a goal the session is not empty: it is the model's side that is missing.
    const none = hasGoal
      ? "No commitments yet: the model makes them with its update_plan tool."
      : "No plan in this session yet: the model makes one with its update_plan tool.";
    return h("p", { class: "hint", id: "plan", "data-count": "0" }, none);
  }
  const ul = h("ul", { class: "tasks plan", id: "plan", "data-count": String(plan.length), "data-open": String(openCount(plan)) });
  for (const c of plan) ul.appendChild(row(c, view, a));
  return ul;
}

function row(c: Commitment, view: PlanView, a: PlanActions): HTMLElement {
  const status = enumJsonName(PlanStatusSchema, c.status);
  const stakes = enumJsonName(StakesSchema, c.stakes);
  const verdict = c.closed ? enumJsonName(VerdictSchema, c.closed.verdict) : "";
  const cited = c.evidence.length;
  // (A refusal no longer matters once it closed, here or elsewhere.)
  const refusal = c.closed ? undefined : view.refused.get(c.id);
  const needs = c.requires.map(requirementWords);
  return h(
    "li",
    {
      class: `task commitment ${verdict ? `closed closed-${verdict}` : "open"} stakes-${stakes || "none"}`,
      "data-item": c.item,
      "data-commitment": c.id,
      "data-status": status,
      "data-closed": verdict,
    },
    h(
      "div",
      { class: "task-head" },
      h("strong", { class: "commitment-text" }, c.text),
      h("span", { class: "commitment-status" }, verdict ? `closed: ${VERDICT_WORDS[verdict] ?? verdict}` : STATUS_WORDS[status] ?? status),
    ),
    h(
      "dl",
      { class: "task-facts" },
      h("dt", {}, "stakes"),
      h("dd", { class: "commitment-stakes" }, stakes || "—"),
      h("dt", {}, "evidence"),
      h("dd", { class: "commitment-evidence", "data-count": String(cited) }, cited === 0 ? "no tool call cited" : `${cited} tool ${cited === 1 ? "call" : "calls"} cited`),
      needs.length ? h("dt", {}, "needs") : null,
      needs.length ? h("dd", { class: "commitment-requires" }, needs.join("; ")) : null,
      c.due ? h("dt", {}, "due") : null,
      c.due ? h("dd", { class: "commitment-due" }, c.due) : null,
      c.blockedBy.length ? h("dt", {}, "after") : null,
      c.blockedBy.length ? h("dd", { class: "commitment-blocked" }, c.blockedBy.join(", ")) : null,
      c.closed?.note ? h("dt", {}, "note") : null,
      c.closed?.note ? h("dd", { class: "commitment-note" }, c.closed.note) : null,
    ),
    refusal ? h("p", { class: "errors commitment-refusal", id: `plan-refusal-${c.item}`, role: "alert" }, refusal) : null,
    c.closed
      ? null
      : h(
          "div",
          { class: "actions" },
          button("Close as fulfilled", closeAs(c, Verdict.FULFILLED, view, a), {
            class: "small primary commitment-fulfil",
            id: `plan-fulfil-${c.item}`,
            "aria-describedby": refusal ? `plan-refusal-${c.item}` : undefined,
          }),
          button("Abandon", closeAs(c, Verdict.ABANDONED, view, a), { class: "small danger commitment-abandon", id: `plan-abandon-${c.item}` }),
        ),
  );
}

/** What a fulfilled close needs, in words (none given: one cited call that succeeded). */
function requirementWords(r: Requirement): string {
  switch (r.kind) {
    case RequirementKind.TOOL_OK:
      return `a successful ${r.tool ? `${r.tool} call` : "tool call"}${r.pattern ? ` matching /${r.pattern}/` : ""}`;
    case RequirementKind.FILE_CHANGED:
      return `a change to ${r.path ?? "a file"}`;
    case RequirementKind.APPROVAL:
      return "a call you approved";
    default:
      return "evidence";
  }
}

/**
 * Closes `c` with `verdict`. A refusal the server explains (no evidence for
 * it, closed meanwhile, gone) shows under the row in the server's words;
 * anything else goes to the page's errors.
 */
function closeAs(c: Commitment, verdict: Verdict, view: PlanView, a: PlanActions): () => Promise<void> {
  return async () => {
    try {
      await a.closeCommitment(c.id, verdict);
      view.refused.delete(c.id);
      a.notice(`Closed “${c.text}” as ${enumJsonName(VerdictSchema, verdict)}.`);
    } catch (err) {
      const mine = [Code.FailedPrecondition, Code.InvalidArgument, Code.NotFound];
      if (!(err instanceof ConnectError) || !mine.includes(err.code)) return reportError(err);
      view.refused.set(c.id, err.rawMessage);
    }
    a.render();
  };
}
