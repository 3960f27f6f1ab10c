// The presentation timeline (docs/protocol.md section 16) as the page's data
// model: a snapshot replaces it, events change it. Applying is idempotent per
// item (a text delta at or below the item's seq is already in its text), so a
// frame seen twice around a reconnect never doubles a line. The timeline also
// keeps the latest turn chain's goal (section 40), which the plan panel shows:
// a `goal` event carries its whole new state, so it simply replaces it.
import type { GoalState, OutputTimeline, PresentationEvent, TimelineItem } from "../src/index.js";

export interface Timeline {
  seq: bigint;
  items: TimelineItem[];
  /** The latest turn chain's goal; absent before the session's first prompt. */
  goal?: GoalState;
}

export const empty = (): Timeline => ({ seq: 0n, items: [] });

export function fromSnapshot(t: OutputTimeline): Timeline {
  return { seq: t.seq, items: t.items.map((i) => ({ ...i })), goal: t.goal };
}

/** Applies one presentation event; answers whether anything changed. */
export function apply(tl: Timeline, ev: PresentationEvent): boolean {
  const k = ev.kind;
  const find = (id: string) => tl.items.find((i) => i.id === id);
  let changed = true;
  switch (k.case) {
    case "snapshot": {
      const s = fromSnapshot(k.value);
      tl.items = s.items;
      tl.seq = s.seq;
      // (A chain's end changes its goal's control only here: the snapshot after run_finished.)
      tl.goal = s.goal;
      return true;
    }
    case "goal":
      tl.goal = k.value;
      break;
    case "itemStarted": {
      const it = find(k.value.id);
      if (it) changed = false;
      else tl.items.push({ ...k.value });
      break;
    }
    case "textDelta": {
      const it = find(k.value.itemId);
      if (!it || ev.seq <= it.seq) changed = false;
      else {
        it.text += k.value.text;
        it.seq = ev.seq;
      }
      break;
    }
    case "itemReplaced": {
      const i = tl.items.findIndex((x) => x.id === k.value.id);
      if (i >= 0) tl.items[i] = { ...k.value };
      else tl.items.push({ ...k.value });
      break;
    }
    case "itemCompleted": {
      const it = find(k.value.itemId);
      if (!it) changed = false;
      else {
        it.status = k.value.status;
        if (ev.seq > it.seq) it.seq = ev.seq;
      }
      break;
    }
    default:
      changed = false;
  }
  if (ev.seq > tl.seq) tl.seq = ev.seq;
  return changed;
}
