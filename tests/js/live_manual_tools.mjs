// Manual tool mode from the shipped JS SDK against a real gateway serving the demo agent.
//
// Usage: node --experimental-websocket live_manual_tools.mjs <ws url>
// Prints one JSON line `result {...}` for the test to check.
import { GatewayClient, RUN_ON_GATEWAY } from "../../client_sdk/js/gateway-client.js";

const conv = new GatewayClient(process.argv[2], {
  WebSocketImpl: globalThis.WebSocket,
  toolMode: "manual",
});
const offered = [];
let decide = () => ({ product: "headphones", in_stock: true, quantity: 99, price: 1.5 });
conv.onServerTool(async (call) => {
  offered.push([call.tool, call.kind, call.args]);
  return decide(call);
});

async function say(text, options) {
  let out = "";
  for await (const delta of conv.say(text, options)) out += delta;
  return out;
}

await conv.connect();
const result = { answeredByApp: await say("do you have headphones in stock?") };
decide = () => RUN_ON_GATEWAY;
result.ranOnGateway = await say("do you have headphones in stock?");
result.auto = await say("do you have headphones in stock?", { toolMode: "auto" });
result.offered = offered;
await conv.close();
process.stdout.write(`result ${JSON.stringify(result)}\n`);
