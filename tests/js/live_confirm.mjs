// Confirmations from the shipped JS SDK against a real gateway serving the demo agent.
//
// Usage: node --experimental-websocket live_confirm.mjs <ws url>
// Prints one JSON line `result {...}` for the test to check.
import { GatewayClient } from "../../client_sdk/js/gateway-client.js";

const conv = new GatewayClient(process.argv[2], { WebSocketImpl: globalThis.WebSocket });
const asked = [];
let answer = true;
conv.onConfirm(async (item) => {
  asked.push([item.tool, item.prompt, item.kind]);
  return answer;
});

async function say(text) {
  let out = "";
  for await (const delta of conv.say(text)) out += delta;
  return out;
}

await conv.connect();
const result = { approved: await say("cancel my order 1234") };
answer = { approved: false, reason: "I still want it" };
result.declined = await say("cancel my order 1234");
result.asked = asked;
await conv.close();
process.stdout.write(`result ${JSON.stringify(result)}\n`);
