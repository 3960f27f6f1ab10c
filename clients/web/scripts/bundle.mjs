// `npm run bundle`: the demo page into dist-page/ (index.html + app.js, one ES module
// with the client library and its dependencies inside).
import { build } from "esbuild";
import { copyFileSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const out = join(root, "dist-page");
mkdirSync(out, { recursive: true });
await build({
  entryPoints: [join(root, "page/app.ts")],
  outfile: join(out, "app.js"),
  bundle: true,
  format: "esm",
  platform: "browser",
  target: "es2022",
  sourcemap: true,
  logLevel: "warning",
});
copyFileSync(join(root, "page/index.html"), join(out, "index.html"));
console.log(`bundled the page into ${out}`);
