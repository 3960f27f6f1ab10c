// The presentation timeline (docs/protocol.md section 16) as the page's data
// model: a snapshot replaces it, events change it. Applying is idempotent per
// item (a text delta at or below the item's seq is already in its text), so a
// frame seen twice around a reconnect never doubles a line.
import type { OutputTimeline, PresentationEvent, TimelineItem } from "../src/index.js";

export interface Timeline {
  seq: bigint;
  items: TimelineItem[];
}

export const empty = (): Timeline => ({ seq: 0n, items: [] });

export function fromSnapshot(t: OutputTimeline): Timeline {
  return { seq: t.seq, items: t.items.map((i) => ({ ...i })) };
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
      return true;
    }
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
