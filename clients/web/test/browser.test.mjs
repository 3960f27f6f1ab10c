// The browser test: Debian's chromium (headless, via playwright-core) loads the
// demo page from a static server; the page talks gRPC-web to a live `vak serve`
// and follows GET /stream through a TCP proxy that cuts the SSE connection from
// the server's side in the middle of a frame. Run by `npm test` (after the build).
//
//   VAK_BIN      the vak binary (default: <repo>/target/debug/vak)
//   CHROMIUM_BIN the browser (default: /usr/bin/chromium)
import { after, before } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { request as httpRequest, createServer } from "node:http";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { startProxy } from "../harness/proxy.mjs";
import { serveStatic } from "../harness/static.mjs";
import { launchChromium, screenshot, stepper, within } from "../harness/steps.mjs";
import { startVak } from "../harness/vak.mjs";
import { RunOutcome } from "../dist/index.js";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const artifacts = join(root, "artifacts");
const CHROMIUM = process.env.CHROMIUM_BIN || "/usr/bin/chromium";

// One text line, an approval-gated write, a pause, a 300-delta burst, one more line.
const PROMPT = "hello browser\n/write f.txt hello from the browser\n/sleep 300\n/burst 300\nbye";
const BURST = Array.from({ length: 300 }, (_, i) => `t${i} `).join("");
// Turn 1 ends at the tool directive; turn 2 starts after the tool result (no
// leading newline), and its second text line starts with one.
const EXPECTED = `echo: hello browser${BURST}\necho: bye`;
// The proxy forwards the stream up to the end of this text, inside the agent
// frame of burst delta 100, and the test then closes the connection there.
const TRIGGER = '"text":"t100 "';

let tmp, workspace, token, site, vak, proxy, vak2, proxy2, ctx, page, sessionId, cut, cookieSession;
const consoleLines = [];

const shot = (p, name) => screenshot(p, artifacts, name);
/** A test step: on failure it saves a screenshot and the page's state before rethrowing. */
const step = stepper({
  dir: artifacts,
  context: () => ctx,
  state: (p) => p.evaluate(() => JSON.stringify(window.vakPage?.state ?? null, null, 1)),
});

const pageState = (p) =>
  p.evaluate(() => {
    const v = window.vakPage;
    return {
      ...v.state,
      cursor: v.follower?.cursor,
      reconnects: v.follower?.reconnects,
      duplicates: v.follower?.duplicates,
      conn: v.follower?.state,
    };
  });

async function openPage(hash) {
  const p = await within(10_000, ctx.newPage(), "a new tab");
  p.setDefaultTimeout(15_000);
  p.on("console", (m) => consoleLines.push(`[${m.type()}] ${m.text()}`));
  p.on("pageerror", (e) => consoleLines.push(`[pageerror] ${e.message}`));
  await p.goto(`${site.url}/#${new URLSearchParams(hash)}`, { timeout: 15_000 });
  return p;
}

before(
  async () => {
    // Everything but app/, which test/app.test.mjs owns (it may have run first).
    for (const name of existsSync(artifacts) ? readdirSync(artifacts) : []) {
      if (name !== "app") rmSync(join(artifacts, name), { recursive: true, force: true });
    }
    mkdirSync(artifacts, { recursive: true });
    if (!existsSync(join(root, "dist-page", "app.js"))) throw new Error("dist-page/app.js is missing: run `npm run build:page`");
    if (!existsSync(CHROMIUM)) throw new Error(`no browser at ${CHROMIUM}: apt-get install -y chromium`);
    tmp = mkdtempSync(join(tmpdir(), "vak-web-"));
    workspace = join(tmp, "workspace");
    mkdirSync(workspace);
    token = randomBytes(24).toString("hex");
    site = await serveStatic(join(root, "dist-page"));
    vak = await startVak([
      "--home", join(tmp, "home"),
      "--workspace", workspace,
      "--token", token,
      "--allow-origin", site.url,
    ]);
    proxy = await startProxy(vak.port);
    ctx = await launchChromium(CHROMIUM, join(tmp, "profile"));
  },
  { timeout: 90_000 },
);

after(async () => {
  writeFileSync(join(artifacts, "console.log"), consoleLines.join("\n") + "\n");
  if (proxy) writeFileSync(join(artifacts, "proxy-requests.json"), JSON.stringify(proxy.requests, null, 1));
  await within(15_000, ctx?.close() ?? Promise.resolve(), "closing chromium").catch(() => {});
  await proxy?.close();
  await proxy2?.close();
  for (const [v, name] of [[vak, "vak"], [vak2, "vak-ring16"]]) {
    if (!v) continue;
    await v.stop();
    writeFileSync(join(artifacts, `${name}.log`), v.output());
  }
  await site?.close();
  if (tmp) rmSync(tmp, { recursive: true, force: true });
});

step("the page creates a session over gRPC-web and opens GET /stream", async () => {
  cut = proxy.cutWhen("/stream", TRIGGER);
  page = await openPage({ server: vak.url, stream: proxy.url, token });
  await page.waitForFunction(() => window.vakPage?.state.sessionId && window.vakPage.follower?.state === "open", null, {
    timeout: 15_000,
  });
  const st = await pageState(page);
  sessionId = st.sessionId;
  assert.match(sessionId, /^[0-9a-f]{32}$/);
  assert.deepEqual(st.errors, []);
  assert.equal(st.cursor, `${sessionId}:0`);
  await shot(page, "01-session-open");
});

step("a prompt runs over gRPC-web and its approval is answered in the page", async () => {
  await page.fill("#prompt", PROMPT);
  await page.click("#run");
  const approve = page.locator("#approvals button.approve");
  await approve.waitFor({ timeout: 15_000 });
  assert.match(await page.locator("#approvals li").first().innerText(), /write 22 bytes to f\.txt/);
  await shot(page, "02-approval-requested");
  await approve.click();
  await page.locator("#approvals li .outcome").waitFor({ timeout: 15_000 });
  assert.equal(await page.locator("#approvals li .outcome").innerText(), "approved");
  await shot(page, "03-approved");
});

step("a server-side cut mid-frame resumes with Last-Event-ID: nothing lost or repeated", async () => {
  const held = await within(20_000, cut, "the proxy to see burst delta 100 on /stream");
  assert.ok(held.request.path.startsWith("/stream?"), held.request.path);
  // The page has everything before the held frame: delta 99 is the last text.
  await page.waitForFunction(() => window.vakPage.state.text.endsWith(" t99 "), null, { timeout: 10_000 });
  held.cut();
  await page.waitForFunction(() => window.vakPage.state.drops.length > 0, null, { timeout: 10_000 });
  await shot(page, "04-cut");
  await page.waitForFunction(
    (len) => {
      const v = window.vakPage;
      return v.follower.reconnects >= 1 && v.state.outcome === "completed" && v.state.text.length >= len;
    },
    EXPECTED.length,
    { timeout: 30_000 },
  );
  // Frames that were still coming would show up as extra text: give them a moment.
  await new Promise((r) => setTimeout(r, 500));
  const st = await pageState(page);
  await shot(page, "05-resumed-complete");

  assert.equal(st.text, EXPECTED, "the text on the page");
  assert.equal(await page.locator("#text").innerText(), EXPECTED, "the rendered text");
  assert.equal(st.duplicates, 0, "frames the follower had to drop as repeats");
  assert.equal(st.resyncs, 0);
  assert.deepEqual(st.errors, []);
  assert.equal(st.reconnects, 1);

  // The cut came in the middle of the stream (inside the frame of delta 100).
  const drop = st.drops[0];
  assert.equal(drop.textLength, EXPECTED.indexOf("t100 "), "the page had the text up to delta 99 at the cut");

  // The browser's own reconnect carried the cursor vector as Last-Event-ID.
  const gets = proxy.requests.filter((r) => r.method === "GET" && r.path.startsWith("/stream?"));
  assert.equal(gets.length, 2, JSON.stringify(gets, null, 1));
  assert.equal(gets[0].headers["last-event-id"], undefined);
  const resumed = gets[1].headers["last-event-id"];
  assert.match(resumed ?? "", new RegExp(`^${sessionId}:\\d+$`));
  assert.equal(resumed, drop.cursor, "Last-Event-ID is the cursor of the last frame the page got");
  assert.equal(gets[1].path, gets[0].path, "EventSource reconnects to the same URL");
  assert.ok(gets[1].conn !== gets[0].conn, "on a new connection");
});

step("the gRPC-web server stream (Subscribe) carried the same text", async () => {
  await page.waitForFunction(() => window.vakPage.state.grpcOutcome === "completed", null, { timeout: 15_000 });
  const st = await pageState(page);
  assert.equal(st.grpcText, EXPECTED);
});

step("the approved write_file reached the workspace", () => {
  assert.equal(readFileSync(join(workspace, "f.txt"), "utf8"), "hello from the browser");
});

step("follow and unfollow change the live stream", async () => {
  const r = await page.evaluate(async () => {
    const { follower, client } = window.vakPage;
    const { sessionId: b } = await client.createSession({});
    let text = "";
    let finished;
    const done = new Promise((res) => (finished = res));
    const off = follower.on("agent", (ev) => {
      if (ev.sessionId !== b) return;
      if (ev.kind.case === "textDelta") text += ev.kind.value.text;
      if (ev.kind.case === "runFinished") finished(ev.kind.value.outcome);
    });
    const followed = [...(await follower.follow(b))];
    await client.run({ sessionId: b, prompt: "second session" });
    const outcome = await Promise.race([
      done,
      new Promise((_, rej) => setTimeout(() => rej(new Error("no run_finished for the followed session")), 10_000)),
    ]);
    off();
    const cursor = follower.cursor;
    const unfollowed = [...(await follower.unfollow(b))];
    return { b, followed, outcome, text, cursor, unfollowed };
  });
  assert.deepEqual(r.followed, [sessionId, r.b]);
  assert.equal(r.outcome, RunOutcome.COMPLETED);
  assert.equal(r.text, "echo: second session");
  assert.match(r.cursor, new RegExp(`^${sessionId}:\\d+,${r.b}:\\d+$`));
  assert.deepEqual(r.unfollowed, [sessionId]);
  const posts = proxy.requests.filter((q) => q.method === "POST").map((q) => q.path.replace(/st_[0-9a-f]+/, "ST"));
  assert.deepEqual(posts, ["/stream/ST/follow", "/stream/ST/unfollow"]);
});

step("a login cookie works instead of the token (gRPC-web and EventSource)", async () => {
  const p = await openPage({ server: vak.url, stream: proxy.url, token, auth: "cookie" });
  await p.waitForFunction(() => window.vakPage?.state.sessionId && window.vakPage.follower?.state === "open", null, {
    timeout: 15_000,
  });
  await p.fill("#prompt", "hello cookie");
  await p.click("#run");
  await p.waitForFunction(() => window.vakPage.state.outcome === "completed", null, { timeout: 15_000 });
  const st = await pageState(p);
  await shot(p, "06-cookie-login");
  assert.equal(st.text, "echo: hello cookie");
  assert.deepEqual(st.errors, []);
  const get = proxy.requests.find((q) => q.method === "GET" && q.path.includes(`session=${st.sessionId}`));
  assert.ok(get, "the cookie page's GET /stream went through the proxy");
  assert.ok(!get.path.includes("token="), get.path);
  assert.match(get.headers.cookie ?? "", /(^|; )vak_session_[0-9a-f]{16}=/);
  // EventSource cannot send headers: the login's session key rides in the URL.
  assert.match(get.path, /[?&]key=[0-9a-f]{64}(&|$)/, get.path);
  cookieSession = st.sessionId;
  await p.close();
});

/** A request from Node (no browser, no Origin): resolves to { status, body } (a stream is cut after its head). */
function replay(port, method, path, headers, body) {
  return within(
    10_000,
    new Promise((resolve, reject) => {
      const req = httpRequest({ host: "127.0.0.1", port, method, path, headers }, (res) => {
        if ((res.headers["content-type"] ?? "").startsWith("text/event-stream")) {
          res.destroy();
          resolve({ status: res.statusCode, body: "(a stream)" });
          return;
        }
        let text = "";
        res.setEncoding("utf8").on("data", (d) => (text += d));
        res.on("end", () => resolve({ status: res.statusCode, body: text }));
      });
      req.on("error", reject);
      req.end(body);
    }),
    `${method} ${path}`,
  );
}

step("another local web app gets the login cookie, but replaying it without the key is a 401", async () => {
  // A little web app on another loopback port, opened in the same browser:
  // its page makes a request to itself, and the app keeps the Cookie header it gets.
  let gotProbe;
  const probed = new Promise((r) => (gotProbe = r));
  const other = createServer((req, res) => {
    if (req.url === "/") {
      res.writeHead(200, { "content-type": "text/html" });
      res.end('<!doctype html><title>another app</title><script>fetch("/probe").then((r) => r.text()).then((t) => (document.title = t));</script>');
    } else if (req.url === "/probe") {
      gotProbe(req.headers.cookie ?? "");
      res.writeHead(200, { "content-type": "text/plain" }).end("probed");
    } else {
      res.writeHead(404).end();
    }
  });
  await new Promise((r) => other.listen(0, "127.0.0.1", r));
  try {
    const otherPort = other.address().port;
    assert.notEqual(otherPort, vak.port);
    const p = await within(10_000, ctx.newPage(), "a new tab");
    await p.goto(`http://127.0.0.1:${otherPort}/`, { timeout: 15_000 });
    const cookie = await within(10_000, probed, "the other app's page to call its own server");
    await p.waitForFunction(() => document.title === "probed", null, { timeout: 10_000 });
    await p.close();
    // Browsers scope cookies by host, not port: the other app did receive vak's login cookie.
    assert.match(cookie, /(^|; )vak_session_[0-9a-f]{16}=[0-9a-f]+/, `the cookie the other app got: ${cookie}`);

    // Replayed server-side with no Origin and no session key, it opens nothing.
    const sid = cookieSession;
    for (const [method, path, body] of [
      ["GET", "/sessions"],
      ["GET", `/sessions/${sid}/events`],
      ["GET", `/stream?session=${sid}`],
      ["POST", `/sessions/${sid}/run`, JSON.stringify({ prompt: "/bash id" })],
    ]) {
      const r = await replay(vak.port, method, path, { cookie, "content-type": "application/json" }, body);
      assert.equal(r.status, 401, `${method} ${path} with the cookie alone: ${r.body}`);
      assert.match(r.body, /unauthenticated/);
    }
    const r = await replay(vak.port, "GET", "/auth/session", { cookie });
    assert.deepEqual(JSON.parse(r.body), { authenticated: false });
  } finally {
    other.closeAllConnections();
    await new Promise((r) => other.close(r));
  }
});

step("a cursor older than the ring: the server replays it from its ledger, no resync, the text stays exact", async () => {
  vak2 = await startVak([
    "--home", join(tmp, "home2"),
    "--workspace", workspace,
    "--token", token,
    "--ring", "16",
    "--allow-origin", site.url,
  ]);
  proxy2 = await startProxy(vak2.port);
  const cut2 = proxy2.cutWhen("/stream", '"text":"t20 "');
  const p = await openPage({ server: vak2.url, stream: proxy2.url, token });
  await p.waitForFunction(() => window.vakPage?.state.sessionId && window.vakPage.follower?.state === "open", null, {
    timeout: 15_000,
  });
  await p.fill("#prompt", "/burst 100\nbye");
  await p.click("#run");
  const held = await within(20_000, cut2, "the proxy to see burst delta 20");
  await p.waitForFunction(() => window.vakPage.state.text.endsWith(" t19 "), null, { timeout: 10_000 });
  // The run ends while the stream is held: far more than 16 frames pass the page's cursor.
  await p.waitForFunction(() => window.vakPage.state.grpcOutcome === "completed", null, { timeout: 15_000 });
  held.cut();
  const burst = Array.from({ length: 100 }, (_, i) => `t${i} `).join("");
  // The reconnect's Last-Event-ID is older than the ring of 16: the server
  // replays the rest from the session's ledger, so nothing resyncs.
  await p.waitForFunction(
    (want) =>
      window.vakPage.state.text === want &&
      window.vakPage.follower?.state === "open" &&
      window.vakPage.state.outcome === "completed",
    `${burst}\necho: bye`,
    { timeout: 20_000 },
  );
  const st = await pageState(p);
  await shot(p, "07-replayed");
  assert.equal(st.text, `${burst}\necho: bye`);
  assert.equal(st.grpcText, `${burst}\necho: bye`);
  assert.deepEqual(st.errors, []);
  assert.equal(st.resyncs, 0, st.log.join("\n"));
  const gets = proxy2.requests.filter((r) => r.method === "GET" && r.path.startsWith("/stream?"));
  assert.equal(gets.length, 2);
  assert.equal(gets[1].headers["last-event-id"], st.drops[0].cursor);
  const transcriptGets = proxy2.requests.filter((r) => r.method === "GET" && r.path.endsWith("/transcript"));
  assert.equal(transcriptGets.length, 0);
  await p.close();
});
