// `npm run build` (and `prepare`, which npm runs on `npm ci` here and when this
// folder is installed into another project): generates src/gen/ from
// ../../proto with protoc-gen-es, then compiles src/ into dist/ with tsc:
// ES modules, .d.ts declarations and source maps. dist/ is emptied first, so
// nothing stale is ever packed.
import { spawnSync } from "node:child_process";
import { existsSync, rmSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const bin = (name) => join(root, "node_modules", ".bin", name);
const proto = join(root, "..", "..", "proto");

for (const tool of ["buf", "protoc-gen-es", "tsc"]) {
  if (!existsSync(bin(tool))) {
    console.error(`vak client build: ${tool} is missing; install the build tools first: npm ci --prefix ${root}`);
    process.exit(1);
  }
}
if (!existsSync(join(proto, "vak", "v1", "agent.proto"))) {
  console.error(`vak client build: no ${join(proto, "vak", "v1", "agent.proto")}; build from a vak checkout`);
  process.exit(1);
}

function run(cmd, args) {
  // node_modules/.bin first on PATH: buf finds the protoc-gen-es plugin there.
  const env = { ...process.env, PATH: `${join(root, "node_modules", ".bin")}:${process.env.PATH ?? ""}` };
  const r = spawnSync(cmd, args, { cwd: root, stdio: "inherit", env });
  if (r.status !== 0) {
    console.error(`vak client build: ${[cmd, ...args].join(" ")} failed (${r.error ?? r.status ?? r.signal})`);
    process.exit(1);
  }
}

run(bin("buf"), ["generate", proto, "--template", "buf.gen.yaml"]);
rmSync(join(root, "dist"), { recursive: true, force: true });
run(bin("tsc"), ["-p", "tsconfig.build.json"]);
console.log(`vak client build: ${join(root, "dist")}`);
