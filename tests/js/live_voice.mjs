// Voice options of the shipped JS SDK against a real gateway serving the demo agent:
// text.segment events (segments: true) and truncate().
//
// Usage: node --experimental-websocket live_voice.mjs <ws url>
// Prints one JSON line `result {...}` for the test to check.
import { GatewayClient } from "../../client_sdk/js/gateway-client.js";

const conv = new GatewayClient(process.argv[2], { WebSocketImpl: globalThis.WebSocket, segments: true });
const segments = [];
const truncated = [];
conv.on("text.segment", (event) => segments.push(event.text));
conv.on("response.truncated", (event) => truncated.push([event.response_id, event.heard_chars, event.in_reply_to]));

let text = "";
for await (const delta of conv.say("hello")) text += delta;
const latest = conv.latestResponse;
const truncateId = await conv.truncate(6); // the user heard "Hello!" and spoke over the rest
while (truncated.length === 0) await new Promise((resolve) => conv.on("response.truncated", resolve));
await conv.close();
process.stdout.write(`result ${JSON.stringify({ text, segments, latest, truncateId, truncated })}\n`);
