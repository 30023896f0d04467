// The shipped JS SDK against a real gateway, through a proxy the pytest side controls.
//
// Usage: node --experimental-websocket live_resume.mjs <ws url>
// Asks for a drop by printing `drop` and waits for the line `dropped` on stdin; prints one
// JSON line `result {...}` at the end for the test to check.
import { createInterface } from "node:readline";
import { GatewayClient } from "../../client_sdk/js/gateway-client.js";

const url = process.argv[2];
const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();

/** Have the proxy cut every connection (no close frame) and wait until it did. */
async function drop() {
  process.stdout.write("drop\n");
  const { value } = await lines.next();
  if (value !== "dropped") throw new Error(`expected "dropped", got ${value}`);
}

const conv = new GatewayClient(url, { WebSocketImpl: globalThis.WebSocket });
const seqs = [];
const states = [];
const retrying = [];
const deltas = new Map(); // response_id -> deltas, to compare with text.done
const done = []; // text.done texts
let runs = 0;
conv.on("*", (event) => {
  if (event.seq > 0) seqs.push(event.seq);
  if (event.type === "response.retrying") retrying.push(event.reason);
  if (event.type === "text.delta") {
    deltas.set(event.response_id, [...(deltas.get(event.response_id) ?? []), event.delta]);
  }
  if (event.type === "text.done") {
    done.push([deltas.get(event.response_id)?.join("") ?? "", event.text]);
    deltas.delete(event.response_id);
  }
});
conv.on("connection", ({ state }) => states.push(state));
conv.clientFunction("device_a", async () => {
  runs += 1;
  await drop(); // the call is open and unanswered when the socket goes
  return { value: "after the cut" };
}, { description: "Client function A." });

async function say(text, dropAfterDeltas = 0) {
  let count = 0;
  let out = "";
  for await (const delta of conv.say(text)) {
    out += delta;
    count += 1;
    if (count === dropAfterDeltas) await drop(); // mid-stream
  }
  return out;
}

await conv.connect();
const streamed = await say("slowtext", 5);
const called = await say("one");
const retried = await say("echo flaky but fine");
await conv.close();
const result = {
  streamed,
  called,
  retried,
  runs,
  reconnects: conv.reconnects,
  retrying,
  // Every event with a seq came once, in order, with none missing.
  seqsInOrder: seqs.every((seq, i) => seq === i + 1),
  stepsWhole: done.every(([joined, text]) => joined === text),
  states,
};
process.stdout.write(`result ${JSON.stringify(result)}\n`);
process.exit(0);
