// Many conversations of one fixed script through the shipped JS SDK, against a real gateway
// behind a proxy that may cut each connection after a random number of frames (set by
// tests/test_js_sdk_drops.py): every transcript must come out as without drops.
//
// Usage: node [--experimental-websocket] live_drops_random.mjs <ws url> <ws | builtin> <count> <at once>
// Prints one line `result {...}`: each conversation's answers (or its error), how many times
// each client call ran, and how many resumes it took.
import { GatewayClient } from "../../client_sdk/js/gateway-client.js";

const [url, impl, count, atOnce] = process.argv.slice(2);
const WebSocketImpl = impl === "ws" ? (await import("ws")).WebSocket : globalThis.WebSocket;
const SCRIPT = ["echo alpha beta gamma", "one", "two", "echo the end"];

async function conversation() {
  const conv = new GatewayClient(url, { WebSocketImpl, maxReconnectDelay: 100, attemptTimeout: 2000 });
  const runs = {};
  for (const name of ["device_a", "device_b"]) {
    conv.clientFunction(name, async (_args, { call }) => {
      runs[call.call_id] = (runs[call.call_id] ?? 0) + 1;
      return { value: name.slice(-1) };
    });
  }
  const answers = [];
  try {
    for (const text of SCRIPT) {
      let out = "";
      for await (const delta of conv.say(text)) out += delta;
      answers.push(out);
    }
  } catch (err) {
    answers.push(`${err.name}: ${err.message}`);
  }
  await conv.close();
  return { answers, runs: Object.values(runs), reconnects: conv.reconnects };
}

const results = [];
let next = 0;
async function worker() {
  while (next < Number(count)) {
    const at = next++;
    results[at] = await conversation();
  }
}
await Promise.all(Array.from({ length: Number(atOnce) }, worker));
process.stdout.write(`result ${JSON.stringify(results)}\n`);
process.exit(0);
