// The shipped JS SDK's tool options against a real gateway serving the demo agent.
//
// Usage: node --experimental-websocket live_tool_choice.mjs <ws url>
// Prints one JSON line `result {...}` for the test to check.
import { GatewayClient } from "../../client_sdk/js/gateway-client.js";

const conv = new GatewayClient(process.argv[2], {
  WebSocketImpl: globalThis.WebSocket,
  toolChoice: "auto",
  maxSteps: 4,
});
const called = [];
conv.clientFunction("get_battery_level", async () => {
  called.push("get_battery_level");
  return { level: 0.82, charging: false };
});
conv.clientFunction("get_nearest_store", async ({ zip_code }) => {
  called.push("get_nearest_store");
  return { name: "Downtown", address: `1 Main St, ${zip_code}` };
});

async function say(text, options) {
  let out = "";
  for await (const delta of conv.say(text, options)) out += delta;
  return out;
}

await conv.connect();
const result = {
  noTools: await say("what's my battery level?", { toolChoice: "none" }),
  narrowed: await say("battery and the nearest store to 92031", { tools: ["get_nearest_store"] }),
  plain: await say("what's my battery level?"),
};
await conv.update({ toolChoice: "none" });
result.afterUpdate = await say("what's my battery level?");
try {
  await say("hello", { tools: ["teleport"] });
  result.refused = null;
} catch (error) {
  result.refused = String(error.message ?? error);
}
result.called = called;
await conv.close();
process.stdout.write(`result ${JSON.stringify(result)}\n`);
