// `npm run build:app` (`make app`): the browser app (/app) and console (/admin) into
// dist-app/, which vak embeds at build time (crates/vak-server/src/http/assets.rs):
//   index.html, admin.html            the shells (served no-cache), naming...
//   assets/<name>-<hash>.{js,css}     ...content-hashed bundles (served immutable)
//   *.gz, *.br                        precompressed here, so the server never compresses
// No inline script or style anywhere: the server's Content-Security-Policy forbids both.
import { build } from "esbuild";
import { mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { basename, dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";
import { brotliCompressSync, constants, gzipSync } from "node:zlib";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const out = join(root, "dist-app");
// Empty the folder but keep its committed .gitignore (build.rs watches the folder).
mkdirSync(out, { recursive: true });
for (const name of readdirSync(out)) {
  if (name !== ".gitignore") rmSync(join(out, name), { recursive: true, force: true });
}

const result = await build({
  entryPoints: { app: join(root, "app/app.ts"), admin: join(root, "app/admin.ts") },
  outdir: join(out, "assets"),
  entryNames: "[name]-[hash]",
  chunkNames: "chunk-[hash]",
  bundle: true,
  format: "esm",
  splitting: true,
  platform: "browser",
  target: "es2022",
  minify: true,
  metafile: true,
  absWorkingDir: root,
  logLevel: "warning",
});

// Which hashed files each entry became.
const outputs = {};
for (const [file, meta] of Object.entries(result.metafile.outputs)) {
  const name = meta.entryPoint ? basename(meta.entryPoint, ".ts") : undefined;
  if (!name) continue;
  outputs[name] = { js: "/app/" + relative(out, join(root, file)).replaceAll("\\", "/"), css: meta.cssBundle ? "/app/" + relative(out, join(root, meta.cssBundle)).replaceAll("\\", "/") : undefined };
}
for (const [entry, shell] of [["app", "index.html"], ["admin", "admin.html"]]) {
  const o = outputs[entry];
  if (!o) throw new Error(`esbuild made no output for ${entry}`);
  let html = readFileSync(join(root, "app", shell), "utf8");
  html = html.replace("<!-- assets -->", [
    o.css ? `<link rel="stylesheet" href="${o.css}">` : "",
    `<script type="module" src="${o.js}"></script>`,
  ].filter(Boolean).join("\n"));
  writeFileSync(join(out, shell), html);
}

// Precompress every text file.
function* walk(dir) {
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) yield* walk(p);
    else yield p;
  }
}
for (const file of [...walk(out)]) {
  if (!/\.(html|js|css|svg|json)$/.test(file)) continue;
  const body = readFileSync(file);
  writeFileSync(file + ".gz", gzipSync(body, { level: 9 }));
  writeFileSync(file + ".br", brotliCompressSync(body, { params: { [constants.BROTLI_PARAM_QUALITY]: 11 } }));
}
console.log(`vak app build: ${out}`);
