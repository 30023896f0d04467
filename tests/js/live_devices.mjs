// Several devices on one session, and session.going_away, with the shipped JS SDK against a
// real gateway (tests/test_js_sdk_devices.py starts it).
//
// Usage: node --experimental-websocket live_devices.mjs <ws url> <two-devices | going-away>
// Prints one JSON line `result {...}` at the end for the test to check.
//
// two-devices (the demo agent): a phone starts the session, a tablet joins it (`join`) and is
//   the only one to declare get_battery_level; the phone asks for the battery level.
// going-away (the test agent, a gateway with a short max_socket_age): a slow stream and a
//   client call across several sockets, each replaced ahead of its close.
import { GatewayClient } from "../../client_sdk/js/gateway-client.js";

const [url, scenario] = process.argv.slice(2);
const WebSocketImpl = globalThis.WebSocket;

/** What one client saw: every seq, and the events the checks need. */
function watch(conv) {
  const seen = { seqs: [], toolCalls: [], statuses: [], texts: [], goingAway: [], states: [] };
  conv.on("*", (event) => {
    if (event.seq > 0) seen.seqs.push(event.seq);
    if (event.type === "tool.calls") seen.toolCalls.push(event.calls.map((c) => c.tool));
    if (event.type === "tool.status") seen.statuses.push(`${event.tool}:${event.status}`);
    if (event.type === "text.done") seen.texts.push(event.text);
    if (event.type === "session.going_away") seen.goingAway.push(event.reason);
  });
  conv.on("connection", ({ state }) => seen.states.push(state));
  return seen;
}

/** Every event with a seq came once, in order, none missing (from `first`). */
function inOrder(seqs, first = 1) {
  return seqs.length > 0 && seqs.every((seq, i) => seq === first + i);
}

/** Resolves with the first event of `type` that `matches`, on `conv`. */
function next(conv, type, matches = () => true) {
  return new Promise((resolve) => {
    const stop = conv.on(type, (event) => {
      if (!matches(event)) return;
      stop();
      resolve(event);
    });
  });
}

async function say(conv, text) {
  let out = "";
  for await (const delta of conv.say(text)) out += delta;
  return out;
}

async function twoDevices() {
  const phone = new GatewayClient(url, { WebSocketImpl });
  const phoneSaw = watch(phone);
  const session = await phone.start();

  const tablet = new GatewayClient(url, {
    WebSocketImpl,
    join: { sessionId: session.session_id, resumeToken: session.resume_token },
  });
  const tabletSaw = watch(tablet);
  let tabletRuns = 0;
  tablet.clientFunction(
    "get_battery_level",
    () => {
      tabletRuns += 1;
      return { level: 0.42, charging: false };
    },
    { description: "Read the device's battery level (0 to 1) and whether it is charging." },
  );
  const joined = await tablet.start();

  const tabletAnswer = next(tablet, "response.done", (event) => event.turn_completed);
  const phoneAnswer = await say(phone, "what's my battery level?");
  await tabletAnswer;

  // The tablet leaves with 1000: only it goes; the phone's session goes on.
  await tablet.close();
  const after = await say(phone, "hello");
  await phone.close();
  return {
    phoneDevice: phone.deviceId,
    tabletDevice: tablet.deviceId,
    joinedSession: joined.session_id === session.session_id,
    phoneAnswer,
    tabletTexts: tabletSaw.texts,
    phoneTexts: phoneSaw.texts,
    tabletRuns,
    phoneCalls: phoneSaw.toolCalls,
    tabletCalls: tabletSaw.toolCalls,
    phoneStatuses: phoneSaw.statuses,
    tabletStatuses: tabletSaw.statuses,
    phoneSeqsInOrder: inOrder(phoneSaw.seqs),
    // The tablet's replay starts at the session's first event: the same seqs as the phone's.
    tabletSeqsInOrder: inOrder(tabletSaw.seqs),
    tabletLastSeq: tabletSaw.seqs.at(-1),
    after,
    phoneStates: phoneSaw.states,
  };
}

async function goingAway() {
  const conv = new GatewayClient(url, { WebSocketImpl });
  const saw = watch(conv);
  let runs = 0;
  conv.clientFunction(
    "device_a",
    async () => {
      runs += 1;
      // Long enough for a socket switch while the call is open.
      await new Promise((resolve) => setTimeout(resolve, 800));
      return { value: "after a switch" };
    },
    { description: "Client function A." },
  );
  await conv.start();
  const streamed = await say(conv, "slowtext");
  const called = await say(conv, "one");
  await conv.close();
  return {
    streamed,
    called,
    runs,
    goingAway: saw.goingAway,
    reconnects: conv.reconnects,
    seqsInOrder: inOrder(saw.seqs),
    seqs: saw.seqs.length,
    states: saw.states,
  };
}

const run = { "two-devices": twoDevices, "going-away": goingAway }[scenario];
if (!run) throw new Error(`unknown scenario ${scenario}`);
const result = await run();
process.stdout.write(`result ${JSON.stringify(result)}\n`);
process.exit(0);
