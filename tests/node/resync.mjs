// Resync trials of @vak/client's StreamFollower (clients/web/src/stream.ts), driven by
// tests/it/resync.rs, which bundles the client's source with esbuild and passes the bundle.
//
//   node resync.mjs <client-bundle.mjs> <base-url> <token>
//
// The Rust test owns the server, the session and its run, and a proxy in front of
// the server (<base-url>) that can hold the server's bytes. For each line
// {"trial": N, "session": S} on stdin this starts two followers of S on GET /stream
// through the proxy, with cursor vectors older than the ring (S:1) and ahead of the
// session, and once both have seen the run end prints one line
//   {"trial": N, "followers": [{"start", "text", "resyncs", "reasons", "duplicates"}, ...]}
// with the assistant text each ends with (the transcript handed over with a resync,
// then the deltas that follow it). It prints {"ready": true} first.
import { createInterface } from 'node:readline';
import { pathToFileURL } from 'node:url';
import { EventSource } from 'eventsource';

const [bundle, base, token] = process.argv.slice(2);
if (!bundle || !base || !token) {
  console.error('usage: node resync.mjs <client-bundle.mjs> <base-url> <token>');
  process.exit(2);
}
// Enums are numbers in the messages; enumJsonName gives the name the JSON carries.
const { StreamFollower, enumJsonName, MessageRoleSchema, ResyncReasonSchema } = await import(pathToFileURL(bundle).href);

const STARTS = { too_old: 1n, ahead: 1000000000n };

const assistantText = (t) =>
  t.messages
    .filter((m) => enumJsonName(MessageRoleSchema, m.role) === 'assistant')
    .map((m) => m.text)
    .join('');
// The test's runs end cancelled, which the transcript records as a `run` entry.
const runOver = (t) => t.messages.some((m) => enumJsonName(MessageRoleSchema, m.role) === 'run');

function follow(session, start) {
  return new Promise((resolve) => {
    const tally = { start, text: '', resyncs: 0, reasons: [], duplicates: 0 };
    const f = new StreamFollower({
      baseUrl: base,
      sessions: [session],
      cursor: `${session}:${STARTS[start]}`,
      token,
      EventSource,
      retryMs: 20,
      maxRetryMs: 500,
    });
    const done = () => {
      tally.duplicates = f.duplicates;
      f.close();
      resolve(tally);
    };
    f.on('agent', (ev) => {
      if (ev.sessionId !== session) return;
      const k = ev.kind;
      if (k.case === 'textDelta') tally.text += k.value.text;
      if (k.case === 'runFinished') done();
    });
    f.on('resync', (ev, transcript) => {
      if (ev.sessionId !== session) return;
      tally.resyncs++;
      tally.reasons.push(ev.kind.case === 'resync' ? enumJsonName(ResyncReasonSchema, ev.kind.value.reason) : '?');
      tally.text = assistantText(transcript);
      if (runOver(transcript)) done();
    });
    f.start();
  });
}

console.log(JSON.stringify({ ready: true }));
const lines = createInterface({ input: process.stdin });
for await (const line of lines) {
  if (!line.trim()) continue;
  const { trial, session } = JSON.parse(line);
  const followers = await Promise.all(Object.keys(STARTS).map((start) => follow(session, start)));
  process.stdout.write(`${JSON.stringify({ trial, followers })}\n`);
}
