// The shipped JS SDK against a real gateway, through a proxy that fails connections where
// the pytest side (tests/test_js_sdk_drops.py) sets it to: one conversation per run.
//
// Usage: node [--experimental-websocket] live_drops.mjs <ws url> <ws | builtin> <scenario>
// `ws`: the ws npm package (tests/js/node_modules, `make test` installs it); `builtin`:
// Node's own WebSocket. Scenarios:
//   start          say("one") at once (the proxy fails the first connect or the start).
//   resume         say("echo before"), print `ready`, wait for `go` on stdin (the test has
//                  dropped the socket meanwhile and set how the resume fails), say("one").
//   close_held     say("echo before"), print `ready`, wait for `go` (a resume attempt is in
//                  flight, its upgrade held by the proxy), close().
//   close_between  say("echo before"), print `ready`; on the first attempt that fails after
//                  that (the test resets its upgrade), close() while the SDK waits to retry.
// Prints one line `result {...}` for the test to check (`dials`: the sockets the SDK opened).
import { createInterface } from "node:readline";
import { GatewayClient } from "../../client_sdk/js/gateway-client.js";

const [url, impl, scenario] = process.argv.slice(2);
const Base = impl === "ws" ? (await import("ws")).WebSocket : globalThis.WebSocket;
const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();

/** Wait for the test's `go` line. */
async function go() {
  const { value } = await lines.next();
  if (value !== "go") throw new Error(`expected "go", got ${value}`);
}

/**
 * The WebSocket class, counting the sockets the SDK dials; once `failed` is set, calls it
 * after a socket failed before it opened, once the SDK handled that.
 */
let dials = 0;
let failed = null;
class Watched extends Base {
  constructor(address, protocols) {
    super(address, protocols);
    dials += 1;
    let opened = false;
    const fail = () => {
      if (opened || !failed) return;
      const call = failed;
      failed = null;
      // After the SDK's own handlers and the microtasks they queued: it is waiting to retry.
      setImmediate(call);
    };
    this.addEventListener("open", () => (opened = true));
    this.addEventListener("error", fail);
    this.addEventListener("close", fail);
  }
}

const conv = new GatewayClient(url, { WebSocketImpl: Watched, attemptTimeout: 300, maxReconnectDelay: 200 });
const states = [];
conv.on("connection", ({ state }) => states.push(state));
const runs = {};
for (const name of ["device_a", "device_b"]) {
  conv.clientFunction(name, async (_args, { call }) => {
    runs[call.call_id] = (runs[call.call_id] ?? 0) + 1;
    return { value: name.slice(-1) };
  });
}

async function say(text) {
  let out = "";
  for await (const delta of conv.say(text)) out += delta;
  return out;
}

const answers = [];
let error = null;
let closedWhile = null;
try {
  if (scenario === "start") {
    answers.push(await say("one"));
  } else {
    answers.push(await say("echo before"));
    if (scenario === "close_between") {
      const closed = new Promise((resolve) => {
        failed = () => {
          closedWhile = conv.state;
          resolve(conv.close());
        };
      });
      process.stdout.write("ready\n");
      await closed;
    } else {
      process.stdout.write("ready\n");
      await go();
      if (scenario === "resume") {
        answers.push(await say("one"));
      } else {
        closedWhile = conv.state;
      }
    }
  }
} catch (err) {
  error = `${err.name}: ${err.message}`;
}
await conv.close();
const result = { answers, runs: Object.values(runs), states, reconnects: conv.reconnects, dials, error, closedWhile };
process.stdout.write(`result ${JSON.stringify(result)}\n`);
process.exit(0);
