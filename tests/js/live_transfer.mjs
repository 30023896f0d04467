// transfer_to_agent from the shipped JS SDK against a real gateway serving the demo agent,
// which hands bills to its billing desk and is handed them back.
//
// Usage: node --experimental-websocket live_transfer.mjs <ws url>
// Prints one JSON line `result {...}` for the test to check.
import { GatewayClient } from "../../client_sdk/js/gateway-client.js";

const conv = new GatewayClient(process.argv[2], { WebSocketImpl: globalThis.WebSocket });
const transfers = [];
conv.on("agent.transferred", (event) => {
  transfers.push({
    agent: event.agent,
    previous: event.previous_agent,
    reason: event.reason,
    tools: event.tools.map((tool) => tool.name),
  });
});

async function say(text) {
  let out = "";
  for await (const delta of conv.say(text)) out += delta;
  return out;
}

const idle = conv.agent; // null: no session yet
await conv.start();
const result = { idle, before: conv.agent, handedOver: await say("I have a question about my bill") };
result.during = conv.agent;
result.invoice = await say("show my last invoice");
result.handedBack = await say("back to the shop please");
result.after = conv.agent;
result.transfers = transfers;
await conv.close();
process.stdout.write(`result ${JSON.stringify(result)}\n`);
