// A TCP proxy in front of vak that records every HTTP/1.1 request head it
// carries and can cut a connection from the server's side in the middle of
// a response, as a crashed proxy or a dropped network would.
import { createServer, connect } from "node:net";

/**
 * Proxies 127.0.0.1:<free port> to 127.0.0.1:`targetPort`.
 * Returns { url, requests, cutWhen(pathPrefix, trigger), retarget(port), close }.
 */
export function startProxy(targetPort) {
  /** Every request head seen: { conn, method, path, headers (lowercase names) }. */
  const requests = [];
  const sockets = new Set();
  let rule;
  let next = 0;

  const server = createServer((client) => {
    const conn = ++next;
    const upstream = connect(targetPort, "127.0.0.1");
    sockets.add(client);
    sockets.add(upstream);
    let inBuf = Buffer.alloc(0);
    let bodyLeft = 0;
    let current; // the request this connection is answering
    let tail = ""; // the end of the response bytes, to find a trigger across reads
    let cut = false;

    const parse = () => {
      for (;;) {
        if (bodyLeft > 0) {
          const n = Math.min(bodyLeft, inBuf.length);
          bodyLeft -= n;
          inBuf = inBuf.subarray(n);
          if (bodyLeft > 0) return;
        }
        const end = inBuf.indexOf("\r\n\r\n");
        if (end < 0) return;
        const [line, ...lines] = inBuf.subarray(0, end).toString("latin1").split("\r\n");
        inBuf = inBuf.subarray(end + 4);
        const [method, path] = line.split(" ");
        const headers = {};
        for (const l of lines) {
          const i = l.indexOf(":");
          if (i > 0) headers[l.slice(0, i).trim().toLowerCase()] = l.slice(i + 1).trim();
        }
        bodyLeft = Number(headers["content-length"] ?? 0);
        current = { conn, method, path, headers, at: Date.now(), response: "" };
        requests.push(current);
      }
    };

    client.on("data", (d) => {
      inBuf = Buffer.concat([inBuf, d]);
      parse();
      upstream.write(d);
    });
    upstream.on("data", (d) => {
      if (cut) return;
      // The start of each response, for the test's artifacts.
      if (current && current.response.length < 2000) current.response += d.toString("latin1").slice(0, 2000);
      const r = rule;
      if (r && !r.done && current && current.method === "GET" && current.path.startsWith(r.path)) {
        const text = d.toString("latin1");
        const at = (tail + text).indexOf(r.trigger);
        if (at >= 0) {
          // Forward up to the end of the trigger (inside a frame) and hold
          // the rest back; the caller cuts once the browser has shown what
          // came before, so the cut falls inside that frame.
          const upto = Math.max(0, at + r.trigger.length - tail.length);
          cut = true;
          r.done = true;
          const request = current;
          client.write(d.subarray(0, upto), () =>
            r.resolve({
              conn,
              request,
              cut: () => {
                client.destroy();
                upstream.destroy();
              },
            }),
          );
          return;
        }
        tail = (tail + text).slice(-r.trigger.length);
      }
      client.write(d);
    });
    const end = () => {
      client.destroy();
      upstream.destroy();
      sockets.delete(client);
      sockets.delete(upstream);
    };
    client.on("error", end).on("close", end);
    upstream.on("error", end).on("close", end);
  });

  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      resolve({
        url: `http://127.0.0.1:${port}`,
        requests,
        /**
         * Arms a cut: the first response to a GET whose path starts with
         * `path` and whose bytes contain `trigger` is forwarded up to the end
         * of the trigger and no further. Resolves to { conn, request, cut },
         * where cut() closes both sides of that connection.
         */
        cutWhen(path, trigger) {
          return new Promise((res) => {
            rule = { path, trigger, done: false, resolve: res };
          });
        },
        /** New connections go to `port` (a restarted server); open ones are closed. */
        retarget(port) {
          targetPort = port;
          for (const s of sockets) s.destroy();
        },
        close() {
          for (const s of sockets) s.destroy();
          return new Promise((r) => server.close(() => r()));
        },
      });
    });
  });
}
