// close() of the shipped JS SDK while no socket is attached, against a real gateway through a
// proxy the pytest side (tests/test_session_delete.py) sets to hold connections.
//
// Usage: node [--experimental-websocket] live_close.mjs <ws url> <ws | builtin>
// Starts a session, prints `ready`, waits for `go` on stdin (the test has dropped the socket
// and holds the resume's upgrade), then close(); prints `result {"took": ms, "state": ...}`.
import { createInterface } from "node:readline";
import { GatewayClient } from "../../client_sdk/js/gateway-client.js";

const [url, impl] = process.argv.slice(2);
const WebSocketImpl = impl === "ws" ? (await import("ws")).WebSocket : globalThis.WebSocket;
const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();

const conv = new GatewayClient(url, { WebSocketImpl, maxReconnectDelay: 100 });
await conv.start();
console.log("ready");
const { value } = await lines.next();
if (value !== "go") throw new Error(`expected "go", got ${value}`);
const state = conv.state;
const began = performance.now();
await conv.close();
const took = performance.now() - began;
console.log(`result ${JSON.stringify({ took, state })}`);
process.exit(0); // a held connection the SDK gave up on must not keep Node alive
