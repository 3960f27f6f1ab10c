// A static file server on 127.0.0.1 for the bundled demo page (dist-page/).
//   node harness/static.mjs [port]     serves dist-page/ and prints its URL
import { createServer } from "node:http";
import { readFile } from "node:fs/promises";
import { extname, join, normalize, dirname } from "node:path";
import { fileURLToPath } from "node:url";

const TYPES = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".map": "application/json",
  ".css": "text/css",
};

/** Serves `dir` on 127.0.0.1:`port` (0: any free port); resolves to { url, close }. */
export function serveStatic(dir, port = 0) {
  const server = createServer(async (req, res) => {
    const path = decodeURIComponent(new URL(req.url ?? "/", "http://x").pathname);
    const rel = normalize(path === "/" ? "/index.html" : path);
    if (rel.includes("..")) {
      res.writeHead(400).end();
      return;
    }
    try {
      const body = await readFile(join(dir, rel));
      res.writeHead(200, {
        "content-type": TYPES[extname(rel)] ?? "application/octet-stream",
        "cache-control": "no-store",
      });
      res.end(body);
    } catch {
      res.writeHead(404, { "content-type": "text/plain" }).end("not found");
    }
  });
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, "127.0.0.1", () => {
      const { port: p } = server.address();
      resolve({
        url: `http://127.0.0.1:${p}`,
        close: () =>
          new Promise((r) => {
            server.closeAllConnections();
            server.close(() => r());
          }),
      });
    });
  });
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const dir = join(dirname(fileURLToPath(import.meta.url)), "..", "dist-page");
  const { url } = await serveStatic(dir, Number(process.argv[2] ?? 0));
  console.log(`serving ${dir} on ${url}`);
}
