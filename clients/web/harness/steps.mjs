// What the browser tests share: a deadline on any promise, screenshots into the
// artifacts folder, and test steps that save every tab's screenshot and page
// state when they fail; Debian's chromium started the one way they all use;
// and axe-core's accessibility check of a page.
import { test } from "node:test";
import { chromium } from "playwright-core";
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";

// axe-core's source, evaluated in the page through the browser's debugging protocol
// (not a <script>: the page's CSP would refuse an inline one).
const AXE = readFileSync(createRequire(import.meta.url).resolve("axe-core/axe.min.js"), "utf8");

/** axe-core on tab `p` as it is: the serious and critical violations, as lines prefixed with `what`. */
export async function axeProblems(p, what) {
  await p.evaluate(AXE);
  const found = await p.evaluate(async () => {
    const r = await window.axe.run(document, { resultTypes: ["violations"], runOnly: { type: "tag", values: ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "best-practice"] } });
    return r.violations
      .filter((v) => v.impact === "serious" || v.impact === "critical")
      .map((v) => `${v.impact} ${v.id}: ${v.help} (${v.nodes.slice(0, 3).map((n) => n.target.join(" ")).join("; ")})`);
  });
  return found.map((l) => `${what}: ${l}`);
}

/** Rejects if `p` does not settle within `ms`. */
export function within(ms, p, what) {
  let timer;
  const deadline = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms: ${what}`)), ms);
  });
  return Promise.race([p, deadline]).finally(() => clearTimeout(timer));
}

/** A full-page screenshot of tab `p` as `<dir>/<name>.png`. */
export async function screenshot(p, dir, name) {
  await within(10_000, p.screenshot({ path: join(dir, `${name}.png`), fullPage: true }), `screenshot ${name}`);
}

/**
 * A `step(name, fn)` for node:test: on failure it saves a screenshot of every tab
 * of `context()` and what `state(tab)` answers (JSON text) under `dir`, named
 * `<prefix>failed-<step>-tab<i>`, before rethrowing.
 */
export function stepper({ dir, prefix = "", context, state }) {
  return (name, fn) =>
    test(name, { timeout: 90_000 }, async () => {
      try {
        await fn();
      } catch (err) {
        const slug = `${prefix}failed-${name.replace(/[^a-z0-9]+/gi, "-").slice(0, 40)}`;
        for (const [i, p] of (context()?.pages() ?? []).entries()) {
          await screenshot(p, dir, `${slug}-tab${i}`).catch(() => {});
          const st = await state(p).catch((e) => String(e));
          writeFileSync(join(dir, `${slug}-tab${i}.json`), st);
        }
        throw err;
      }
    });
}

/**
 * Debian's chromium (`executable`; never a downloaded browser), headless, with a fresh
 * profile in `profileDir` (--user-data-dir) per run; `options` go to playwright.
 */
export function launchChromium(executable, profileDir, options = {}) {
  return within(
    30_000,
    chromium.launchPersistentContext(profileDir, {
      executablePath: executable,
      headless: true,
      timeout: 30_000,
      args: [
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-quic",
        "--no-first-run",
        "--disable-sync",
      ],
      ...options,
    }),
    "chromium start",
  );
}
