// Follows sessions on vak's multiplexed GET /stream with the `eventsource` package, a
// third-party SSE client that reconnects by itself and resends the last id it saw as
// Last-Event-ID. Driven by tests/it/eventsource_client.rs.
//
//   node follow.mjs <base-url> <token> <session>...
//
// stdout, one JSON object per line:
//   {"id": "<cursor vector>", "data": <Event JSON>}     every agent frame
//   {"event": "stream_opened" | "resync", "data": ...}  the stream-level frames
// It exits 0 once every session has sent run_finished, 1 if the library gives up.
import { EventSource } from 'eventsource';

const [base, token, ...sessions] = process.argv.slice(2);
if (!base || !token || sessions.length === 0) {
  console.error('usage: node follow.mjs <base-url> <token> <session>...');
  process.exit(2);
}

const query = sessions.map((s) => `session=${encodeURIComponent(s)}`).join('&');
const waiting = new Set(sessions);
const es = new EventSource(`${base}/stream?${query}`, {
  // EventSource has no way to set headers; the package takes a custom fetch for that.
  fetch: (input, init) =>
    fetch(input, { ...init, headers: { ...init.headers, Authorization: `Bearer ${token}` } }),
});

const print = (obj, then) => process.stdout.write(`${JSON.stringify(obj)}\n`, then);

for (const event of ['stream_opened', 'resync']) {
  es.addEventListener(event, (e) => print({ event, data: JSON.parse(e.data) }));
}

es.addEventListener('agent', (e) => {
  const data = JSON.parse(e.data);
  let then;
  if (data.run_finished) {
    waiting.delete(data.session_id);
    if (waiting.size === 0) {
      es.close();
      then = () => process.exit(0);
    }
  }
  print({ id: e.lastEventId, data }, then);
});

es.addEventListener('error', (e) => {
  const what = e.message ?? e.code ?? 'error';
  if (es.readyState === EventSource.CLOSED) {
    console.error(`follow.mjs: the stream failed for good: ${what}`);
    process.exit(1);
  }
  console.error(`follow.mjs: ${what}; the library reconnects`);
});
