// The package test: installs @vak/client into a new project exactly as
// README.md shows (its commands are read from the README), runs the README's
// Node script against a live `vak serve`, and typechecks the README's examples
// against the installed package. Run by `npm test`, after the build.
//
//   VAK_BIN  the vak binary (default: <repo>/target/debug/vak)
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, lstatSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { startVak } from "../harness/vak.mjs";

const web = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const repo = resolve(web, "..", "..");
const NAME = "@vak/client";

/**
 * The fenced block that follows the line `<!-- test/package.test.mjs ... -->`
 * whose text contains `marker`, and its info string.
 */
function readmeBlock(readme, marker) {
  const lines = readFileSync(readme, "utf8").split("\n");
  const at = lines.findIndex((l) => l.startsWith("<!-- test/package.test.mjs") && l.includes(marker));
  assert.ok(at >= 0, `${readme} has no "<!-- test/package.test.mjs ... ${marker}" line`);
  const open = /^```(\w*)$/.exec(lines[at + 1] ?? "");
  assert.ok(open, `${readme}: a fenced block must follow the "${marker}" marker`);
  const end = lines.indexOf("```", at + 2);
  assert.ok(end > at, `${readme}: the "${marker}" block is not closed`);
  return { lang: open[1], text: lines.slice(at + 2, end).join("\n") + "\n" };
}

/** Runs a command; resolves to { code, out } (stdout + stderr), rejects after `ms`. */
function run(cmd, args, { cwd, env = {}, ms }) {
  return new Promise((resolveRun, reject) => {
    const child = spawn(cmd, args, {
      cwd,
      env: { ...process.env, ...env },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let out = "";
    child.stdout.setEncoding("utf8").on("data", (d) => (out += d));
    child.stderr.setEncoding("utf8").on("data", (d) => (out += d));
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`timed out after ${ms} ms: ${cmd} ${args.join(" ")}\n${out}`));
    }, ms);
    child.once("error", (err) => {
      clearTimeout(timer);
      reject(err);
    });
    child.once("exit", (code, signal) => {
      clearTimeout(timer);
      resolveRun({ code: code ?? signal, out });
    });
  });
}

let tmp, app, vak;

before(() => {
  tmp = mkdtempSync(join(tmpdir(), "vak-pkg-"));
});

after(async () => {
  await vak?.stop();
  if (tmp && !process.env.KEEP_TMP) rmSync(tmp, { recursive: true, force: true });
});

test("the README's install block installs the package into a new project", { timeout: 300_000 }, async () => {
  const install = readmeBlock(join(web, "README.md"), "runs this block");
  assert.equal(install.lang, "sh");
  // The top-level README shows the same commands.
  const top = readFileSync(join(repo, "README.md"), "utf8");
  assert.ok(top.includes("```sh\n" + install.text + "```"), `README.md must show the same block:\n${install.text}`);

  const tmpRoot = join(tmp, "t");
  mkdirSync(tmpRoot);
  const where = join(tmp, "app-dir");
  // The block as written, then where it left the shell (the new project).
  const script = `set -euo pipefail\n${install.text}printf '%s' "$PWD" > '${where}'\n`;
  const r = await run("bash", ["-c", script], {
    cwd: repo,
    ms: 280_000,
    env: {
      TMPDIR: tmpRoot,
      npm_config_prefer_offline: "true",
      npm_config_audit: "false",
      npm_config_fund: "false",
      npm_config_update_notifier: "false",
    },
  });
  assert.equal(r.code, 0, `the install block failed:\n${r.out}`);
  app = readFileSync(where, "utf8");
  assert.ok(app.startsWith(tmpRoot), `the project is not a fresh directory under TMPDIR: ${app}`);

  const pkg = join(app, "node_modules", ...NAME.split("/"));
  assert.ok(!lstatSync(pkg).isSymbolicLink(), `${pkg} is a link, not an installed copy`);
  for (const f of ["dist/index.js", "dist/index.d.ts", "dist/stream.d.ts", "dist/gen/vak/v1/agent_pb.js", "dist/gen/vak/v1/agent_pb.d.ts"]) {
    assert.ok(existsSync(join(pkg, f)), `the installed package has no ${f}`);
  }
  assert.equal(JSON.parse(readFileSync(join(pkg, "package.json"), "utf8")).name, NAME);
  for (const dep of ["@bufbuild/protobuf", "@connectrpc/connect", "@connectrpc/connect-web", "eventsource"]) {
    assert.ok(existsSync(join(app, "node_modules", dep, "package.json")), `${dep} is not installed in the project`);
  }
  const deps = JSON.parse(readFileSync(join(app, "package.json"), "utf8")).dependencies ?? {};
  assert.ok(NAME in deps, `the project's package.json does not depend on ${NAME}`);
});

test("the README's Node script runs a prompt against vak serve", { timeout: 120_000 }, async (t) => {
  if (!app) return t.skip("no project (the install failed)");
  const script = readmeBlock(join(web, "README.md"), "runs this script");
  assert.equal(script.lang, "js");
  assert.match(script.text, /from "@vak\/client"/);
  writeFileSync(join(app, "app.mjs"), script.text);

  const home = join(tmp, "home");
  const workspace = join(tmp, "workspace");
  mkdirSync(workspace);
  vak = await startVak(["--home", home, "--workspace", workspace, "--token", randomBytes(24).toString("hex")]);
  const r = await run(process.execPath, ["app.mjs", "hello world"], {
    cwd: app,
    ms: 60_000,
    env: { VAK_HOME: home },
  });
  assert.equal(r.code, 0, `node app.mjs failed:\n${r.out}\nserver:\n${vak.output()}`);
  assert.equal(r.out, "echo: hello world\n(completed)\n");
});

test("without --install-links npm links the folder, and the package still imports by name", { timeout: 120_000 }, async (t) => {
  if (!app) return t.skip("no project (the install failed)");
  const linked = join(tmp, "linked");
  mkdirSync(linked);
  const env = { npm_config_prefer_offline: "true", npm_config_audit: "false", npm_config_fund: "false" };
  for (const args of [["init", "-y"], ["install", web]]) {
    const r = await run("npm", args, { cwd: linked, env, ms: 100_000 });
    assert.equal(r.code, 0, `npm ${args.join(" ")} failed:\n${r.out}`);
  }
  assert.ok(lstatSync(join(linked, "node_modules", "@vak", "client")).isSymbolicLink());
  const probe = `import("${NAME}").then((m) => console.log(typeof m.createAgentClient, typeof m.StreamFollower, typeof m.EventSchema))`;
  const r = await run(process.execPath, ["--input-type=module", "-e", probe], { cwd: linked, ms: 30_000 });
  assert.equal(r.out, "function function object\n", r.out);
});

test("the README's examples typecheck against the installed package", { timeout: 120_000 }, async (t) => {
  if (!app || !existsSync(join(app, "app.mjs"))) return t.skip("no project or no app.mjs");
  const browser = readmeBlock(join(web, "README.md"), "typechecks this block");
  assert.equal(browser.lang, "ts");
  assert.match(browser.text, /from "@vak\/client"/);
  writeFileSync(join(app, "browser.mts"), browser.text);
  writeFileSync(
    join(app, "tsconfig.json"),
    JSON.stringify(
      {
        compilerOptions: {
          target: "es2022",
          module: "nodenext",
          moduleResolution: "nodenext",
          lib: ["es2022", "dom"],
          // app.mjs imports node:fs: Node's types, from this folder's devDependencies.
          typeRoots: [join(web, "node_modules", "@types")],
          types: ["node"],
          strict: true,
          allowJs: true,
          checkJs: true,
          noEmit: true,
        },
        files: ["browser.mts", "app.mjs"],
      },
      null,
      2,
    ),
  );
  const tsc = join(web, "node_modules", ".bin", "tsc");
  const r = await run(tsc, ["-p", "."], { cwd: app, ms: 100_000 });
  assert.equal(r.code, 0, `tsc (browser.mts and app.mjs, with the DOM library) found errors:\n${r.out}`);

  // Node without the DOM library: the package's own declarations need none
  // (skipLibCheck only because @connectrpc/connect's name DOM's HeadersInit).
  writeFileSync(
    join(app, "tsconfig.node.json"),
    JSON.stringify(
      {
        compilerOptions: {
          target: "es2022",
          module: "nodenext",
          moduleResolution: "nodenext",
          lib: ["es2022"],
          typeRoots: [join(web, "node_modules", "@types")],
          types: ["node"],
          strict: true,
          allowJs: true,
          checkJs: true,
          skipLibCheck: true,
          noEmit: true,
        },
        files: ["app.mjs"],
      },
      null,
      2,
    ),
  );
  const n = await run(tsc, ["-p", "tsconfig.node.json"], { cwd: app, ms: 100_000 });
  assert.equal(n.code, 0, `tsc (app.mjs, Node types, no DOM library) found errors:\n${n.out}`);
});
