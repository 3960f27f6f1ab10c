// Promoted skills as the composer's slash commands (docs/protocol.md section
// 41): typing "/" at the start of the message opens a list of the skills the
// open session's legs offer (GET /skills?session_id=, read each time the list
// opens, so a skill promoted a moment ago is there), narrowed to the names
// that start with what follows the "/". Up and Down move, Tab, Enter or a
// click put "/NAME " in the composer, Escape closes it. The line is sent as
// typed: the server asks the model to use the skill (the offline model calls
// skill__NAME itself). This file keeps the list's state and draws it;
// conversation.ts wires it to the composer.
import { enumJsonName, SkillKindSchema, SkillScope, type Skill } from "../src/index.js";
import { h } from "./dom.js";

export interface SlashView {
  /** The list is showing. */
  open: boolean;
  /** What follows the "/" (the first word typed so far). */
  query: string;
  /** The highlighted row among the matches. */
  selected: number;
  /** The session the skills were read for, and the skills (undefined: being read). */
  session: string;
  skills: Skill[] | undefined;
  /** Why the skills could not be read, in words. */
  error: string;
}

export function emptySlash(): SlashView {
  return { open: false, query: "", selected: 0, session: "", skills: undefined, error: "" };
}

/** The most rows the list shows (the rest are reached by typing more of the name). */
const MAX_ROWS = 8;

/**
 * What a composer text asks the list for: the name typed after a leading "/",
 * while it is still one word (no space yet); undefined when the list has no
 * business being open (no leading "/", a second word, a second line, "//").
 */
export function slashQuery(text: string): string | undefined {
  const m = /^\/([a-z0-9-]*)$/.exec(text);
  return m ? m[1] : undefined;
}

/** The skills whose names start with the query, at most MAX_ROWS, in the server's order. */
export function matches(v: SlashView): Skill[] {
  return (v.skills ?? []).filter((s) => s.name.startsWith(v.query)).slice(0, MAX_ROWS);
}

/** Moves the highlight by `by` rows, wrapping around. */
export function move(v: SlashView, by: number): void {
  const n = matches(v).length;
  if (n) v.selected = (((v.selected + by) % n) + n) % n;
}

/** The highlighted skill, if the list shows one. */
export function chosen(v: SlashView): Skill | undefined {
  return v.open ? matches(v)[v.selected] : undefined;
}

/** The list under the composer while it is open; `choose` takes a row's skill name. */
export function slashMenu(v: SlashView, choose: (name: string) => void): HTMLElement | null {
  if (!v.open) return null;
  const rows = matches(v);
  const note = (text: string) => h("p", { class: "hint slash-note", id: "skill-menu-note" }, text);
  const body =
    v.error ? note(`cannot list the skills: ${v.error}`)
    : v.skills === undefined ? note("reading the skills…")
    : !v.skills.length ? note("no skills promoted for this workspace")
    : !rows.length ? note(`no skill starts with /${v.query}`)
    : h(
        "ul",
        { class: "slash-list", id: "skill-menu", role: "listbox", "aria-label": "skills (slash commands)" },
        ...rows.map((s, i) => {
          const li = h(
            "li",
            { role: "option", id: `skill-opt-${s.name}`, "aria-selected": String(i === v.selected), class: i === v.selected ? "selected" : "" },
            h("strong", {}, `/${s.name}`),
            " ",
            h("span", { class: "kind" }, enumJsonName(SkillKindSchema, s.kind)),
            s.scope === SkillScope.GLOBAL ? h("span", { class: "kind" }, " every workspace") : null,
            " ",
            h("span", { class: "about" }, s.description.split("\n")[0] ?? ""),
          );
          // Not a focus change: the composer keeps the caret.
          li.addEventListener("mousedown", (e) => {
            e.preventDefault();
            choose(s.name);
          });
          return li;
        }),
      );
  return h("div", { class: "slash", id: "slash" }, body);
}
