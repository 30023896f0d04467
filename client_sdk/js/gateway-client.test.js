// Tests of gateway-client.js, driven through a fake WebSocket: an in-memory gateway the
// test scripts. It records what the client sends, and lets the test push server frames and
// close sockets with a code. Run: node --test client_sdk/js
import assert from "node:assert/strict";
import { test as nodeTest } from "node:test";

import {
  ClientError,
  GatewayClient,
  RUN_ON_GATEWAY,
  ResumeGap,
  RunOnGateway,
  ServerError,
  SessionClosed,
  connect,
  resumeUrl,
} from "./gateway-client.js";
import { sessionUrl } from "./connection.js";

const URL = "ws://gw.test/v1/realtime";

/** Every test fails instead of hanging when the client never does what it awaits. */
const test = (name, fn) => nodeTest(name, { timeout: 3000 }, fn);

// ----------------------------------------------------------------------- the fake gateway

/** The client side of one socket (a browser-like WebSocket) plus the test's server controls. */
class FakeSocket {
  constructor(gateway, url, protocols) {
    this.gateway = gateway;
    this.url = url;
    this.protocols = protocols;
    this.readyState = 0;
    this.protocol = "";
    /** Every message the client sent on this socket, parsed. */
    this.sent = [];
    /** `{code, reason}` when the client closed it. */
    this.closedByClient = null;
    this.onopen = null;
    this.onmessage = null;
    this.onclose = null;
    this.onerror = null;
    this._read = 0;
    this._reader = null;
    gateway.attempts.push(this);
    queueMicrotask(() => gateway._arrive(this));
  }

  // -- the WebSocket API the client uses

  send(data) {
    if (this.readyState !== 1) throw new Error("InvalidStateError: the socket is not open");
    assert.equal(typeof data, "string", "the client sends text frames");
    this.sent.push(JSON.parse(data));
    const reader = this._reader;
    this._reader = null;
    reader?.();
  }

  close(code, reason = "") {
    if (this.readyState >= 2) return;
    const wasOpen = this.readyState === 1;
    this.readyState = 3;
    this.closedByClient = { code, reason };
    queueMicrotask(() =>
      this.onclose?.({ code: wasOpen ? code ?? 1005 : 1006, reason, wasClean: wasOpen }),
    );
  }

  // -- the server side, for the test

  /** Send server frames (objects are JSON-encoded, strings go as they are). */
  push(...frames) {
    for (const frame of frames) {
      this.onmessage?.({ data: typeof frame === "string" ? frame : JSON.stringify(frame) });
    }
  }

  pushRaw(data) {
    this.onmessage?.({ data });
  }

  /** Close from the server side (1006: the connection just dropped). */
  drop(code = 1006, reason = "") {
    if (this.readyState === 3) return;
    this.readyState = 3;
    this.onclose?.({ code, reason, wasClean: code !== 1006 });
  }

  /** The next message the client sent, in order (waits for it); checks its type. */
  async next(type) {
    while (this._read >= this.sent.length) {
      await new Promise((resolve) => (this._reader = resolve));
    }
    const msg = this.sent[this._read++];
    if (type) assert.equal(msg.type, type, `expected ${type}, the client sent ${JSON.stringify(msg)}`);
    return msg;
  }

  /** What the client sent that the test has not read yet. */
  get unread() {
    return this.sent.slice(this._read);
  }
}

class FakeGateway {
  constructor() {
    /** Every socket the client tried to open. */
    this.attempts = [];
    /** The sockets that opened. */
    this.accepted = [];
    /** Refuse this many of the next attempts (they close with 1006 before opening). */
    this.refuse = 0;
    /**
     * What the next attempts get, in order (before `refuse`): "open"; "refuse" (a close with
     * 1006 before the open); "error" (only an error event, as Node 20's WebSocket does when
     * the upgrade fails); "error+close" (an error, then a close with 1006); "hang" (no answer
     * ever: the socket stays connecting until the client closes it).
     * @type {Array<"open" | "refuse" | "error" | "error+close" | "hang">}
     */
    this.plan = [];
    this._waiters = [];
    const gateway = this;
    this.WebSocket = class extends FakeSocket {
      constructor(url, protocols) {
        super(gateway, url, protocols);
      }
    };
  }

  _arrive(sock) {
    let mode = "open";
    if (this.plan.length > 0) {
      mode = this.plan.shift();
    } else if (this.refuse > 0) {
      this.refuse -= 1;
      mode = "refuse";
    }
    if (sock.readyState === 3) {
      // the client gave up on it while connecting
    } else if (mode === "refuse" || mode === "error+close") {
      sock.readyState = 3;
      if (mode === "error+close") sock.onerror?.({ type: "error" });
      sock.onclose?.({ code: 1006, reason: "", wasClean: false });
    } else if (mode === "error") {
      sock.onerror?.({ type: "error" }); // and nothing else: readyState stays 0
    } else if (mode === "open") {
      sock.readyState = 1;
      sock.protocol = sock.protocols?.includes("gateway.v1") ? "gateway.v1" : "";
      this.accepted.push(sock);
      sock.onopen?.({});
    }
    this._notify();
  }

  _notify() {
    for (const waiter of [...this._waiters]) {
      if (waiter.ready()) {
        this._waiters.splice(this._waiters.indexOf(waiter), 1);
        waiter.resolve();
      }
    }
  }

  /** Resolves once `ready()` holds. */
  until(ready) {
    if (ready()) return Promise.resolve();
    return new Promise((resolve) => this._waiters.push({ ready, resolve }));
  }

  /** The `n`th socket that opened (0-based), once it has. */
  async socket(n) {
    await this.until(() => this.accepted.length > n);
    return this.accepted[n];
  }
}

// ----------------------------------------------------------------------- helpers

const created = (seq) => ({
  type: "session.created",
  session_id: "sess_1",
  resume_token: "tok_1",
  agent: "test",
  protocol_version: 1,
  tools: [{ name: "device_a", kind: "client", display_name: "Device a" }],
  limits: {
    max_message_chars: 32000,
    max_queued_messages: 8,
    max_steps: 8,
    ws_max_size: 1048576,
    client_call_timeout: 30.0,
  },
  seq,
});

const pong = (seq) => ({ type: "pong", seq });

const call = (call_id, tool, args = {}, timeout = 10) => ({
  call_id,
  tool,
  display_name: tool,
  args,
  deadline: Date.now() / 1000 + timeout,
  timeout,
});

/** Every microtask queued so far has run (a macrotask boundary). */
const flush = () => new Promise((resolve) => setImmediate(resolve));

async function collect(iterable) {
  const items = [];
  for await (const item of iterable) items.push(item);
  return items;
}

/** A client with a started session (session.created is seq 1). */
async function started(options = {}, setup = () => {}) {
  const gw = new FakeGateway();
  const conv = new GatewayClient(URL, { WebSocketImpl: gw.WebSocket, ...options });
  setup(conv);
  await conv.connect();
  const sock = await gw.socket(0);
  const starting = conv.start();
  const start = await sock.next("session.start");
  sock.push(created(1));
  assert.equal((await starting).session_id, "sess_1");
  return { gw, conv, sock, start };
}

/** Drop the socket, accept the resume, answer it with session.resumed; returns the new socket. */
async function dropAndResume(gw, sock, n, resumed = {}) {
  sock.drop(1006);
  const next = await gw.socket(n);
  await next.next("session.resume");
  next.push({ type: "session.resumed", session_id: "sess_1", replayed_from: 1, last_seq: 1, ...resumed });
  return next;
}

// ----------------------------------------------------------------------- session start

test("connect offers gateway.v1 and the token; session.start declares the client functions", async () => {
  const { conv, sock, start } = await started(
    { token: "eyJ0.eyJ1.c2ln", agent: "demo", instructions: "Be brief.", metadata: { app: "3.2" } },
    (c) =>
      c.clientFunction("get_battery_level", () => ({ level: 1 }), {
        description: "Read the battery.",
        outputSchema: { type: "object" },
        timeout: 15,
        displayName: "Battery level",
      }),
  );
  // The token goes as a subprotocol, never in the URL (URLs end up in access logs).
  assert.deepEqual(sock.protocols, ["gateway.v1", "gateway.token.eyJ0.eyJ1.c2ln"]);
  assert.equal(sock.url, URL);
  assert.equal(sock.protocol, "gateway.v1");
  assert.deepEqual(start, {
    type: "session.start",
    agent: "demo",
    instructions: "Be brief.",
    metadata: { app: "3.2" },
    // The runtime's own time zone, for tools that tell the time (timeZone: null sends none).
    time_zone: Intl.DateTimeFormat().resolvedOptions().timeZone,
    client_functions: [
      {
        name: "get_battery_level",
        description: "Read the battery.",
        input_schema: { type: "object", properties: {} },
        output_schema: { type: "object" },
        display_name: "Battery level",
        timeout: 15,
      },
    ],
  });
  assert.equal(conv.state, "open");
  assert.equal(conv.lastSeq, 1);
  assert.equal(conv.session.resume_token, "tok_1");
  // omitted defaults are filled in
  assert.deepEqual(conv.session.tools[0], {
    name: "device_a",
    kind: "client",
    display_name: "Device a",
    execution: "sync",
    delivery: null,
    description: "",
  });

  // registered after the start: declared again with session.update
  conv.clientFunction("open_settings", () => null);
  const update = await sock.next("session.update");
  assert.deepEqual(
    update.client_functions.map((f) => [f.name, f.description]),
    [
      ["get_battery_level", "Read the battery."],
      ["open_settings", "open settings"],
    ],
  );
  assert.throws(() => conv.clientFunction("Bad-Name", () => 1), ClientError);
  await conv.close();
});

test("a token function is asked for a fresh token before the connect and every resume", async () => {
  let minted = 0;
  const fetchToken = async () => `tok.${++minted}.sig`;
  const { gw, sock } = await started({ token: fetchToken });
  assert.deepEqual(sock.protocols, ["gateway.v1", "gateway.token.tok.1.sig"]);
  const next = await dropAndResume(gw, sock, 1);
  assert.deepEqual(next.protocols, ["gateway.v1", "gateway.token.tok.2.sig"]);
  assert.equal(next.url, `${URL}?session=sess_1`); // the session, for the balancer; never the token
});

test("a token function that fails ends connect() with SessionClosed", async () => {
  const gw = new FakeGateway();
  const conv = new GatewayClient(URL, {
    WebSocketImpl: gw.WebSocket,
    token: async () => {
      throw new Error("backend down");
    },
  });
  await assert.rejects(conv.connect(), (err) => err instanceof SessionClosed && err.reason === "could not get a client token: backend down");
  assert.equal(gw.attempts.length, 0);
});

test("without a token only gateway.v1 is offered", async () => {
  const { sock } = await started();
  assert.deepEqual(sock.protocols, ["gateway.v1"]);
});

test("start() rejects with ServerError when the gateway refuses session.start", async () => {
  const gw = new FakeGateway();
  const conv = new GatewayClient(URL, { WebSocketImpl: gw.WebSocket, agent: "nope" });
  await conv.connect();
  const sock = await gw.socket(0);
  const starting = conv.start();
  await sock.next("session.start");
  sock.push({ type: "error", code: "invalid_message", message: "unknown agent 'nope'", seq: 1 });
  await assert.rejects(starting, (err) => {
    assert.ok(err instanceof ServerError);
    assert.ok(err instanceof ClientError);
    assert.equal(err.code, "invalid_message");
    assert.equal(err.retryable, false);
    assert.equal(err.event.in_reply_to, null);
    return true;
  });
  await conv.close();
});

test("the connect() helper gives a connected client; without reconnect an unreachable gateway rejects it", async () => {
  const gw = new FakeGateway();
  const conv = await connect(URL, { WebSocketImpl: gw.WebSocket });
  assert.equal(conv.state, "open");
  assert.ok(conv instanceof GatewayClient);
  await conv.close();

  const down = new FakeGateway();
  down.refuse = 1;
  const lost = new GatewayClient(URL, { WebSocketImpl: down.WebSocket, reconnect: false });
  await assert.rejects(lost.connect(), (err) => err instanceof SessionClosed && err.closedWith === 1006);
  assert.equal(lost.state, "closed");
  assert.equal(down.attempts.length, 1);
});

test("a first dial that fails with only an error event, or never opens, is tried again until one opens", async () => {
  const gw = new FakeGateway();
  gw.plan = ["error", "error+close", "hang", "refuse"];
  const conv = new GatewayClient(URL, { WebSocketImpl: gw.WebSocket, attemptTimeout: 50, maxReconnectDelay: 5 });
  const states = [];
  conv.on("connection", (e) => states.push(e.state));
  await conv.connect();
  assert.equal(gw.attempts.length, 5);
  assert.equal(conv.state, "open");
  assert.deepEqual(states, ["connecting", "open"]);
  // the one that hung was dropped at attemptTimeout, never closed with 1000
  assert.equal(gw.attempts[2].closedByClient.code, 4000);
  const sock = await gw.socket(0);
  assert.equal(sock, gw.attempts[4]);
  const starting = conv.start();
  await sock.next("session.start");
  sock.push(created(1));
  assert.equal((await starting).session_id, "sess_1");
  await conv.close();
});

// ----------------------------------------------------------------------- talking

test("say() starts the session lazily and streams the deltas of the response to its message", async () => {
  const gw = new FakeGateway();
  const conv = new GatewayClient(URL, { WebSocketImpl: gw.WebSocket });
  const states = [];
  conv.on("connection", (e) => states.push(e.state));
  assert.equal(conv.state, "idle");
  const reply = collect(conv.say("hello"));
  const sock = await gw.socket(0);
  await sock.next("session.start");
  sock.push(created(1));
  const msg = await sock.next("user.message");
  assert.equal(msg.text, "hello");
  assert.match(msg.id, /^msg_[A-Za-z0-9_-]{12}$/);
  const created2 = [];
  conv.on("response.created", (e) => created2.push(e));
  sock.push(
    { type: "response.created", response_id: "resp_other", call_id: "call_async", seq: 2 },
    { type: "text.delta", response_id: "resp_other", delta: "not mine", seq: 3 },
    { type: "response.created", response_id: "resp_1", in_reply_to: msg.id, seq: 4 },
    { type: "text.delta", response_id: "resp_1", delta: "Hi ", seq: 5 },
    { type: "text.delta", response_id: "resp_other", delta: "still not mine", seq: 6 },
    { type: "text.delta", response_id: "resp_1", delta: "there.", seq: 7 },
    { type: "text.done", response_id: "resp_1", text: "Hi there.", seq: 8 },
    { type: "response.done", response_id: "resp_1", status: "completed", turn_completed: true, seq: 9 },
    { type: "text.delta", response_id: "resp_1", delta: "after the end", seq: 10 },
  );
  assert.deepEqual(await reply, ["Hi ", "there."]);
  assert.deepEqual(states, ["connecting", "open"]);
  assert.equal(created2[0].in_reply_to, null); // omitted default
  assert.equal(created2[1].call_id, null);
  await conv.close();
});

test("say() throws ServerError when the gateway refuses its message", async () => {
  const { conv, sock } = await started();
  const reply = collect(conv.say("one too many"));
  const msg = await sock.next("user.message");
  sock.push({
    type: "error",
    code: "busy",
    message: "too many queued messages",
    in_reply_to: msg.id,
    retryable: true,
    seq: 2,
  });
  await assert.rejects(reply, (err) => {
    assert.ok(err instanceof ServerError);
    assert.equal(err.code, "busy");
    assert.equal(err.retryable, true);
    assert.equal(err.event.seq, 2);
    return true;
  });
  // so does a provider error that ends the response
  const second = collect(conv.say("again"));
  const msg2 = await sock.next("user.message");
  sock.push(
    { type: "response.created", response_id: "resp_2", in_reply_to: msg2.id, seq: 3 },
    { type: "error", code: "provider_error", message: "upstream broke", response_id: "resp_2", seq: 4 },
  );
  await assert.rejects(second, (err) => err instanceof ServerError && err.code === "provider_error");
  // and a usage limit's refusal, with when to try again
  const third = collect(conv.say("once more"));
  const msg3 = await sock.next("user.message");
  sock.push(
    { type: "response.created", response_id: "resp_3", in_reply_to: msg3.id, seq: 5 },
    {
      type: "error",
      code: "rate_limited",
      message: "this user is over its tokens per minute (100); try again in 42 s",
      response_id: "resp_3",
      retryable: true,
      retry_after: 41.5,
      limit: { scope: "end_user", name: "tokens_per_minute", value: 100 },
      seq: 6,
    },
  );
  await assert.rejects(third, (err) => {
    assert.equal(err.code, "rate_limited");
    assert.equal(err.retryAfter, 41.5);
    assert.equal(err.event.limit.scope, "end_user");
    return true;
  });
  await conv.close();
});

test("post() and cancel() send without waiting; listeners can unsubscribe", async () => {
  const { conv, sock } = await started();
  const seen = [];
  const off = conv.on("pong", (e) => seen.push(e.seq));
  const id = await conv.post("hi");
  assert.deepEqual(await sock.next("user.message"), { type: "user.message", id, text: "hi" });
  await conv.cancel("resp_9");
  assert.deepEqual(await sock.next("response.cancel"), { type: "response.cancel", response_id: "resp_9" });
  await conv.cancel();
  assert.deepEqual(await sock.next("response.cancel"), { type: "response.cancel" });
  sock.push(pong(2));
  off();
  sock.push(pong(3));
  assert.deepEqual(seen, [2]);
  await conv.close();
});

test("response options: session defaults in session.start, per-message ones in user.message", async () => {
  const gw = new FakeGateway();
  const conv = new GatewayClient(URL, { WebSocketImpl: gw.WebSocket, toolChoice: "required", maxSteps: 3, timeZone: null });
  // before the start, update() changes what session.start will carry
  assert.equal(await conv.update({ maxSteps: 4 }), null);
  const starting = conv.start();
  const sock = await gw.socket(0);
  assert.deepEqual(await sock.next("session.start"), {
    type: "session.start",
    tool_choice: "required",
    max_steps: 4,
    client_functions: [],
  });
  sock.push(created(1));
  await starting;

  const reply = collect(conv.say("weather?", { toolChoice: "get_weather", tools: ["get_weather"], maxSteps: 2 }));
  const msg = await sock.next("user.message");
  assert.deepEqual(msg, {
    type: "user.message",
    id: msg.id,
    text: "weather?",
    tool_choice: "get_weather",
    tools: ["get_weather"],
    max_steps: 2,
  });
  sock.push(
    { type: "response.created", response_id: "resp_1", in_reply_to: msg.id, seq: 2 },
    { type: "response.done", response_id: "resp_1", status: "completed", seq: 3 },
  );
  assert.deepEqual(await reply, []);
  // absent (or undefined) options are absent from the frame; an empty tools list is sent
  const plain = await conv.post("hi", { toolChoice: undefined });
  assert.deepEqual(await sock.next("user.message"), { type: "user.message", id: plain, text: "hi" });
  const none = await conv.post("no tools", { tools: [] });
  assert.deepEqual(await sock.next("user.message"), { type: "user.message", id: none, text: "no tools", tools: [] });
  await assert.rejects(conv.post("x", { tools: "get_weather" }), TypeError);

  // after the start, update() sends a session.update with only what it changes
  const upd = await conv.update({ toolChoice: "none" });
  assert.deepEqual(await sock.next("session.update"), { type: "session.update", id: upd, tool_choice: "none" });
  assert.match(upd, /^upd_/);
  await conv.close();
  await assert.rejects(conv.update({ maxSteps: 1 }), SessionClosed);
});

test("the session starts without tool_choice and max_steps unless asked", async () => {
  const { conv, start } = await started({ agent: "demo", timeZone: null });
  assert.deepEqual(start, { type: "session.start", agent: "demo", client_functions: [] });
  await conv.close();
});

// ----------------------------------------------------------------------- events and seq

test("events with a seq already seen are dropped; unknown and malformed frames are skipped", async (t) => {
  const { conv, sock } = await started();
  const all = [];
  const pongs = [];
  const future = [];
  conv.on("*", (e) => all.push(`${e.type}:${e.seq}`));
  conv.on("pong", (e) => pongs.push(e.seq));
  conv.on("future.event", (e) => future.push(e.seq));
  const throwing = t.mock.method(console, "error", () => {});
  conv.on("pong", () => {
    throw new Error("a listener's bug");
  });
  sock.push(pong(2), pong(3), pong(2), pong(3), created(1), pong(4));
  sock.push({ type: "future.event", seq: 5 }, pong(5), "not json", { no: "type" }, [1, 2]);
  sock.pushRaw(new Uint8Array([1, 2, 3]));
  sock.push(pong(6));
  assert.deepEqual(all, ["pong:2", "pong:3", "pong:4", "pong:6"]);
  assert.deepEqual(pongs, [2, 3, 4, 6]);
  assert.deepEqual(future, [5]); // asked for by name: delivered, and it moves the cursor
  assert.equal(conv.lastSeq, 6);
  assert.equal(conv.session.seq, 1);
  assert.equal(throwing.mock.callCount(), 4); // reported, not thrown into the SDK
  await conv.close();
});

test("an ack goes out every ackEvery events", async () => {
  const { conv, sock } = await started({ ackEvery: 3 }); // session.created is the first event
  sock.push(pong(2));
  assert.deepEqual(sock.unread, []);
  sock.push(pong(3));
  assert.deepEqual(await sock.next("ack"), { type: "ack", seq: 3 });
  sock.push(pong(3), pong(2), pong(4), pong(5));
  assert.deepEqual(sock.unread, []); // duplicates do not count
  sock.push(pong(7));
  assert.deepEqual(await sock.next("ack"), { type: "ack", seq: 7 });
  await conv.close();
});

// ----------------------------------------------------------------------- client functions

test("client functions: concurrent calls, a throwing handler, an overrun, an unknown function", async () => {
  let openGate;
  const gate = new Promise((resolve) => (openGate = resolve));
  const runs = {};
  const count = (name) => (runs[name] = (runs[name] ?? 0) + 1);
  let stuckSignal = null;
  const { conv, sock } = await started({}, (c) => {
    // waits for the second function: only works if both run at once
    c.clientFunction("wait_for_gate", async () => {
      count("wait_for_gate");
      await gate;
      return { waited: true };
    });
    c.clientFunction("open_gate", (args) => {
      count("open_gate");
      openGate();
      return { n: args.n };
    });
    c.clientFunction("broken", () => {
      count("broken");
      throw new TypeError("bad zip code");
    });
    c.clientFunction("rejects", async () => {
      count("rejects");
      throw new RangeError("out of range");
    });
    c.clientFunction("stuck", (args, { signal }) => {
      count("stuck");
      stuckSignal = signal;
      return new Promise(() => {});
    });
    c.clientFunction("nothing", () => {});
  });
  const calls = [];
  conv.on("tool.calls", (e) => calls.push(...e.calls.map((c) => c.call_id)));
  sock.push({
    type: "tool.calls",
    response_id: "resp_1",
    calls: [
      call("c_wait", "wait_for_gate"),
      call("c_gate", "open_gate", { n: 2 }),
      call("c_broken", "broken"),
      call("c_rejects", "rejects"),
      call("c_stuck", "stuck", {}, 0.05),
      call("c_unknown", "no_such_function"),
      call("c_nothing", "nothing"),
    ],
    seq: 2,
  });
  assert.equal(calls.length, 7);
  assert.deepEqual(runs, {}); // listeners hear of the calls before any handler runs
  const results = new Map();
  for (let i = 0; i < 7; i += 1) {
    const msg = await sock.next("tool.results");
    assert.equal(msg.results.length, 1);
    results.set(msg.results[0].call_id, msg.results[0]);
  }
  assert.deepEqual(results.get("c_wait"), { call_id: "c_wait", tool: "wait_for_gate", output: { waited: true } });
  assert.deepEqual(results.get("c_gate"), { call_id: "c_gate", tool: "open_gate", output: { n: 2 } });
  assert.deepEqual(results.get("c_broken"), { call_id: "c_broken", tool: "broken", error: "TypeError: bad zip code" });
  assert.deepEqual(results.get("c_rejects"), { call_id: "c_rejects", tool: "rejects", error: "RangeError: out of range" });
  assert.deepEqual(results.get("c_stuck"), {
    call_id: "c_stuck",
    tool: "stuck",
    error: "the client function overran its deadline",
  });
  assert.equal(stuckSignal.aborted, true);
  assert.deepEqual(results.get("c_unknown"), {
    call_id: "c_unknown",
    tool: "no_such_function",
    error: "LookupError: this client has no function 'no_such_function'",
  });
  assert.deepEqual(results.get("c_nothing"), { call_id: "c_nothing", tool: "nothing", output: null });

  // the same call ids again, in a later batch: nothing runs twice
  sock.push({ type: "tool.calls", response_id: "resp_1", calls: [call("c_gate", "open_gate", { n: 3 }), call("c_broken", "broken")], seq: 3 });
  await flush();
  assert.deepEqual(sock.unread, []);
  assert.deepEqual(runs, { wait_for_gate: 1, open_gate: 1, broken: 1, rejects: 1, stuck: 1 });
  await conv.close();
});

test("a handler still running at close() is aborted and sends nothing", async () => {
  let signal = null;
  let entered;
  const running = new Promise((resolve) => (entered = resolve));
  const { conv, sock } = await started({}, (c) =>
    c.clientFunction("slow", (args, context) => {
      signal = context.signal;
      entered();
      return new Promise(() => {});
    }),
  );
  sock.push({ type: "tool.calls", response_id: "resp_1", calls: [call("c_slow", "slow")], seq: 2 });
  await running;
  await conv.close();
  assert.equal(signal.aborted, true);
  assert.ok(signal.reason instanceof SessionClosed);
  assert.deepEqual(sock.unread, []);
});

// ----------------------------------------------------------------------- manual tool mode

/** A server tool offered to the client in manual tool mode. */
const serverCall = (call_id, tool, args = {}, timeout = 10) => ({ ...call(call_id, tool, args, timeout), kind: "server" });

test("tool_mode: the session default in session.start and update(), per message in user.message", async () => {
  const gw = new FakeGateway();
  const conv = new GatewayClient(URL, { WebSocketImpl: gw.WebSocket, toolMode: "manual", timeZone: null });
  assert.equal(await conv.update({ toolChoice: "required" }), null); // the mode stays
  const starting = conv.start();
  const sock = await gw.socket(0);
  assert.deepEqual(await sock.next("session.start"), {
    type: "session.start",
    tool_choice: "required",
    tool_mode: "manual",
    client_functions: [],
  });
  sock.push(created(1));
  await starting;

  const reply = collect(conv.say("stock?", { toolMode: "auto" }));
  const msg = await sock.next("user.message");
  assert.deepEqual(msg, { type: "user.message", id: msg.id, text: "stock?", tool_mode: "auto" });
  sock.push(
    { type: "response.created", response_id: "resp_1", in_reply_to: msg.id, seq: 2 },
    { type: "response.done", response_id: "resp_1", status: "completed", seq: 3 },
  );
  assert.deepEqual(await reply, []);
  const posted = await conv.post("again", { toolMode: "manual", maxSteps: 2 });
  assert.deepEqual(await sock.next("user.message"), {
    type: "user.message",
    id: posted,
    text: "again",
    max_steps: 2,
    tool_mode: "manual",
  });
  const upd = await conv.update({ toolMode: "auto" });
  assert.deepEqual(await sock.next("session.update"), { type: "session.update", id: upd, tool_mode: "auto" });
  await conv.close();
});

test("a server-kind call without a handler runs on the gateway; a client-kind one is unchanged", async () => {
  const runs = [];
  const { conv, sock } = await started({ toolMode: "manual" }, (c) => {
    c.clientFunction("device_a", (args) => {
      runs.push(["device_a", args]);
      return { value: "a" };
    });
    // a client function named like the server tool: a server-kind call never goes to it
    c.clientFunction("check_stock", () => {
      runs.push(["check_stock"]);
      return { mine: true };
    });
  });
  const seen = [];
  conv.on("tool.calls", (e) => seen.push(...e.calls.map((c) => `${c.call_id}:${c.kind}`)));
  sock.push({
    type: "tool.calls",
    response_id: "resp_1",
    calls: [serverCall("c_srv", "check_stock", { product: "headphones" }), call("c_dev", "device_a", { n: 1 })],
    seq: 2,
  });
  assert.deepEqual(seen, ["c_srv:server", "c_dev:client"]); // kind defaults to "client"
  const sent = [await sock.next(), await sock.next()];
  const run = sent.find((m) => m.type === "tool.run");
  assert.match(run.id, /^run_/);
  assert.deepEqual(run, { type: "tool.run", id: run.id, call_id: "c_srv" }); // the model's args: none sent
  assert.deepEqual(sent.find((m) => m.type === "tool.results").results, [
    { call_id: "c_dev", tool: "device_a", output: { value: "a" } },
  ]);
  assert.deepEqual(runs, [["device_a", { n: 1 }]]);
  // the gateway runs it: the status confirms the run; the same call again is not run twice
  sock.push(
    { type: "tool.status", call_id: "c_srv", tool: "check_stock", status: "running", response_id: "resp_1", seq: 3 },
    { type: "tool.calls", response_id: "resp_1", calls: [serverCall("c_srv", "check_stock")], seq: 4 },
  );
  await flush();
  assert.deepEqual(sock.unread, []);
  await conv.close();
});

test("a server-tool handler answers with an output, an error, or has the gateway run the call", async () => {
  const handled = [];
  const { conv, sock } = await started({ toolMode: "manual" });
  conv.onServerTool(async (call, { signal }) => {
    handled.push(call.call_id);
    assert.ok(signal instanceof AbortSignal);
    switch (call.args.what) {
      case "answer":
        return { product: call.args.product, in_stock: true, quantity: 5 };
      case "run":
        return GatewayClient.RUN_ON_GATEWAY;
      case "edit":
        return new RunOnGateway({ product: "charger" });
      case "throw":
        throw new RangeError("no such shelf");
      case "stuck":
        return new Promise(() => {});
    }
    return undefined;
  });
  assert.equal(GatewayClient.RUN_ON_GATEWAY, RUN_ON_GATEWAY);
  assert.throws(() => new RunOnGateway(["not", "an", "object"]), TypeError);
  assert.throws(() => conv.onServerTool("nope"), TypeError);
  sock.push({
    type: "tool.calls",
    response_id: "resp_1",
    calls: [
      serverCall("c_answer", "check_stock", { what: "answer", product: "earbuds" }),
      serverCall("c_run", "check_stock", { what: "run" }),
      serverCall("c_edit", "check_stock", { what: "edit" }),
      serverCall("c_throw", "check_stock", { what: "throw" }),
      serverCall("c_stuck", "check_stock", { what: "stuck" }, 0.05),
      serverCall("c_nothing", "check_stock", { what: "nothing" }),
    ],
    seq: 2,
  });
  const byCall = new Map();
  for (let i = 0; i < 6; i += 1) {
    const msg = await sock.next();
    if (msg.type === "tool.results") byCall.set(msg.results[0].call_id, msg.results[0]);
    else byCall.set(msg.call_id, msg);
  }
  assert.deepEqual(byCall.get("c_answer"), {
    call_id: "c_answer",
    tool: "check_stock",
    output: { product: "earbuds", in_stock: true, quantity: 5 },
  });
  const run = byCall.get("c_run");
  assert.deepEqual(run, { type: "tool.run", id: run.id, call_id: "c_run" });
  const edit = byCall.get("c_edit");
  assert.deepEqual(edit, { type: "tool.run", id: edit.id, call_id: "c_edit", args: { product: "charger" } });
  assert.notEqual(edit.id, run.id);
  assert.deepEqual(byCall.get("c_throw"), { call_id: "c_throw", tool: "check_stock", error: "RangeError: no such shelf" });
  assert.deepEqual(byCall.get("c_stuck"), {
    call_id: "c_stuck",
    tool: "check_stock",
    error: "the server-tool handler overran its deadline",
  });
  assert.deepEqual(byCall.get("c_nothing"), { call_id: "c_nothing", tool: "check_stock", output: null });
  assert.equal(handled.length, 6);

  // onServerTool(null): back to the default, run on the gateway
  conv.onServerTool(null);
  sock.push({ type: "tool.calls", response_id: "resp_1", calls: [serverCall("c_late", "check_stock")], seq: 3 });
  assert.deepEqual((await sock.next("tool.run")).call_id, "c_late");
  assert.equal(handled.length, 6);
  await conv.close();
});

test("a tool.run refused for its arguments becomes the call's error result; an unknown call does not", async () => {
  const { conv, sock } = await started({ toolMode: "manual" });
  conv.onServerTool((call) => new RunOnGateway(call.args.edit));
  sock.push({
    type: "tool.calls",
    response_id: "resp_1",
    calls: [serverCall("c_bad", "check_stock", { edit: { nope: 1 } }), serverCall("c_gone", "check_stock", { edit: null })],
    seq: 2,
  });
  const runs = new Map();
  for (let i = 0; i < 2; i += 1) {
    const run = await sock.next("tool.run");
    runs.set(run.call_id, run);
  }
  assert.deepEqual(runs.get("c_bad").args, { nope: 1 });
  assert.equal("args" in runs.get("c_gone"), false);
  const refusal = "invalid arguments: value: 'product' is a required property";
  sock.push(
    { type: "error", code: "invalid_message", message: refusal, in_reply_to: runs.get("c_bad").id, call_id: "c_bad", seq: 3 },
    { type: "error", code: "unknown_call", message: "no such call", in_reply_to: runs.get("c_gone").id, call_id: "c_gone", seq: 4 },
  );
  assert.deepEqual((await sock.next("tool.results")).results, [{ call_id: "c_bad", tool: "check_stock", error: refusal }]);
  await flush();
  assert.deepEqual(sock.unread, []);
  await conv.close();
});

test("an unconfirmed tool.run is sent again after a resume, a confirmed one is not", async () => {
  const handled = [];
  const { gw, conv, sock } = await started({ toolMode: "manual" });
  conv.onServerTool((call) => {
    handled.push(call.call_id);
    return call.call_id === "c_edit" ? new RunOnGateway({ product: "charger" }) : RUN_ON_GATEWAY;
  });
  sock.push({
    type: "tool.calls",
    response_id: "resp_1",
    calls: [serverCall("c_done", "check_stock"), serverCall("c_edit", "check_stock")],
    seq: 2,
  });
  const first = new Map();
  for (let i = 0; i < 2; i += 1) {
    const run = await sock.next("tool.run");
    first.set(run.call_id, run);
  }
  sock.push({ type: "tool.status", call_id: "c_done", tool: "check_stock", status: "running", seq: 3 });

  // c_edit's run may have been lost with the socket: the same frame goes again
  const sock2 = await dropAndResume(gw, sock, 1, {
    replayed_from: 4,
    last_seq: 3,
    open_calls: [serverCall("c_edit", "check_stock", {}, 9.5), serverCall("c_open", "check_stock", {}, 9.5)],
  });
  assert.deepEqual(await sock2.next("tool.run"), first.get("c_edit"));
  const opened = await sock2.next("tool.run"); // a call offered while away: handled now, once
  assert.equal(opened.call_id, "c_open");
  await flush();
  assert.deepEqual(sock2.unread, []);
  assert.deepEqual(handled, ["c_done", "c_edit", "c_open"]);

  // confirmed now (a repeated run gets a duplicate status): nothing goes again
  sock2.push(
    { type: "tool.status", call_id: "c_edit", tool: "check_stock", status: "running", duplicate: true, seq: 4 },
    { type: "tool.status", call_id: "c_open", tool: "check_stock", status: "pending", seq: 5 },
  );
  const sock3 = await dropAndResume(gw, sock2, 2, { replayed_from: 6, last_seq: 5 });
  await flush();
  assert.deepEqual(sock3.unread, []);
  await conv.close();
});

// ----------------------------------------------------------------------- confirmation

const confirmItem = (call_id, tool, args = {}, { timeout = 10, kind } = {}) => ({
  call_id,
  tool,
  display_name: tool,
  args,
  prompt: `Run ${tool}?`,
  deadline: Date.now() / 1000 + timeout,
  timeout,
  ...(kind ? { kind } : {}),
});

const askFor = (seq, ...items) => ({ type: "tool.confirm", response_id: "resp_1", calls: items, seq });

/** The tool.confirmation answers the client sends next, by call id. */
async function answers(sock, n) {
  const byCall = new Map();
  for (let i = 0; i < n; i += 1) {
    const msg = await sock.next("tool.confirmation");
    assert.match(msg.id, /^cnf_/);
    byCall.set(msg.call_id, msg);
  }
  return byCall;
}

test("onConfirm approves, declines with a reason, or approves edited args; listeners see the item first", async () => {
  const { conv, sock } = await started();
  const order = [];
  conv.on("tool.confirm", (e) => order.push(`event:${e.calls.length}`));
  conv.onConfirm(async (item, { signal }) => {
    order.push(`ask:${item.call_id}`);
    assert.ok(signal instanceof AbortSignal);
    assert.equal(item.prompt, `Run ${item.tool}?`);
    switch (item.args.how) {
      case "yes":
        return true;
      case "no":
        return false;
      case "reason":
        return { approved: false, reason: "I changed my mind" };
      case "edit":
        return { approved: true, args: { order_id: "5678" } };
      case "long":
        return { approved: false, reason: "x".repeat(2000) };
    }
    return undefined;
  });
  assert.throws(() => conv.onConfirm("nope"), TypeError);
  sock.push(
    askFor(
      2,
      confirmItem("c_yes", "cancel_order", { how: "yes" }, { kind: "server" }),
      confirmItem("c_no", "cancel_order", { how: "no" }),
      confirmItem("c_reason", "cancel_order", { how: "reason" }),
      confirmItem("c_edit", "cancel_order", { how: "edit" }),
      confirmItem("c_long", "cancel_order", { how: "long" }),
    ),
  );
  const byCall = await answers(sock, 5);
  assert.deepEqual(order.slice(0, 2), ["event:5", "ask:c_yes"]);
  const strip = ({ id, ...rest }) => rest;
  assert.deepEqual(strip(byCall.get("c_yes")), { type: "tool.confirmation", call_id: "c_yes", approved: true });
  assert.deepEqual(strip(byCall.get("c_no")), { type: "tool.confirmation", call_id: "c_no", approved: false });
  assert.deepEqual(strip(byCall.get("c_reason")), {
    type: "tool.confirmation",
    call_id: "c_reason",
    approved: false,
    reason: "I changed my mind",
  });
  assert.deepEqual(strip(byCall.get("c_edit")), {
    type: "tool.confirmation",
    call_id: "c_edit",
    approved: true,
    args: { order_id: "5678" },
  });
  assert.equal(byCall.get("c_long").reason.length, 1000); // the protocol's limit
  // the kind defaults to "client" when the server omits it
  const seen = [];
  conv.on("tool.confirm", (e) => seen.push(...e.calls.map((c) => c.kind)));
  sock.push(askFor(3, confirmItem("c_kind", "cancel_order", { how: "yes" })));
  await sock.next("tool.confirmation");
  assert.deepEqual(seen, ["client"]);
  await conv.close();
});

test("without a handler a call is declined; a throw, an overrun or a stray value declines it too", async () => {
  const { conv, sock } = await started();
  sock.push(askFor(2, confirmItem("c_none", "cancel_order")));
  const declined = await sock.next("tool.confirmation");
  assert.deepEqual(declined, {
    type: "tool.confirmation",
    id: declined.id,
    call_id: "c_none",
    approved: false,
    reason: "this client cannot ask the user",
  });

  let aborted = null;
  conv.onConfirm((item, { signal }) => {
    switch (item.args.how) {
      case "throw":
        throw new RangeError("no dialog");
      case "stuck":
        signal.addEventListener("abort", () => (aborted = signal.reason));
        return new Promise(() => {});
      case "string":
        return "yes"; // truthy, but not an answer: never approve by accident
      case "approved-string":
        return { approved: "true" };
      case "bad-args":
        return { approved: true, args: ["not", "an", "object"] };
    }
    return undefined;
  });
  sock.push(
    askFor(
      3,
      confirmItem("c_throw", "cancel_order", { how: "throw" }),
      confirmItem("c_stuck", "cancel_order", { how: "stuck" }, { timeout: 0.05 }),
      confirmItem("c_string", "cancel_order", { how: "string" }),
      confirmItem("c_approved_string", "cancel_order", { how: "approved-string" }),
      confirmItem("c_bad_args", "cancel_order", { how: "bad-args" }),
      confirmItem("c_undefined", "cancel_order", { how: "nothing" }),
    ),
  );
  const byCall = await answers(sock, 6);
  for (const msg of byCall.values()) assert.equal(msg.approved, false, msg.call_id);
  assert.equal(byCall.get("c_throw").reason, "the confirmation handler failed (RangeError: no dialog)");
  assert.equal(byCall.get("c_stuck").reason, "the confirmation handler overran its deadline");
  assert.ok(aborted instanceof ClientError);
  assert.equal(byCall.get("c_string").reason, "the confirmation handler returned string, not an answer");
  assert.equal(byCall.get("c_approved_string").reason, "the confirmation handler returned object, not an answer");
  assert.match(byCall.get("c_bad_args").reason, /args that are not an object/);
  assert.equal(byCall.get("c_undefined").reason, "the confirmation handler returned undefined, not an answer");
  await conv.close();
});

test("an approved client function's call runs when tool.calls brings it; a repeated tool.confirm is not asked again", async () => {
  const runs = [];
  const { conv, sock } = await started({}, (c) =>
    c.clientFunction("device_a", (args) => {
      runs.push(args);
      return { done: true };
    }),
  );
  let asked = 0;
  conv.onConfirm(() => {
    asked += 1;
    return true;
  });
  sock.push(askFor(2, confirmItem("c_dev", "device_a", { n: 1 })));
  assert.equal((await sock.next("tool.confirmation")).approved, true);
  // the same call id, now as a call to run: the confirmation does not stop it
  sock.push({ type: "tool.calls", response_id: "resp_1", calls: [call("c_dev", "device_a", { n: 2 })], seq: 3 });
  assert.deepEqual((await sock.next("tool.results")).results, [{ call_id: "c_dev", tool: "device_a", output: { done: true } }]);
  assert.deepEqual(runs, [{ n: 2 }]);
  sock.push(askFor(4, confirmItem("c_dev", "device_a", { n: 1 })));
  await flush();
  assert.deepEqual(sock.unread, []);
  assert.equal(asked, 1);
  await conv.close();
});

test("edited args the gateway refuses become a decline that says why; an unknown call is left at that", async () => {
  const { gw, conv, sock } = await started();
  conv.onConfirm((item) => ({ approved: true, args: item.args.edit }));
  sock.push(askFor(2, confirmItem("c_bad", "cancel_order", { edit: { nope: 1 } }), confirmItem("c_gone", "cancel_order", { edit: { order_id: "1" } })));
  const first = await answers(sock, 2);
  const refusal = "invalid arguments: value: 'order_id' is a required property";
  sock.push(
    { type: "error", code: "invalid_message", message: refusal, in_reply_to: first.get("c_bad").id, call_id: "c_bad", seq: 3 },
    { type: "error", code: "unknown_call", message: "no such call", in_reply_to: first.get("c_gone").id, call_id: "c_gone", seq: 4 },
  );
  const decline = await sock.next("tool.confirmation");
  assert.notEqual(decline.id, first.get("c_bad").id);
  assert.deepEqual(decline, {
    type: "tool.confirmation",
    id: decline.id,
    call_id: "c_bad",
    approved: false,
    reason: `the edited arguments were refused (${refusal})`,
  });
  await flush();
  assert.deepEqual(sock.unread, []);
  // after a resume only the decline goes again (c_gone is gone)
  const sock2 = await dropAndResume(gw, sock, 1, { replayed_from: 5, last_seq: 4 });
  assert.deepEqual(await sock2.next("tool.confirmation"), decline);
  await flush();
  assert.deepEqual(sock2.unread, []);
  await conv.close();
});

test("an unconfirmed answer is sent again after a resume until a tool.status or tool.calls confirms it", async () => {
  const { gw, conv, sock } = await started();
  conv.onConfirm((item) => item.args.answer);
  sock.push(
    askFor(
      2,
      confirmItem("c_srv", "cancel_order", { answer: true }, { kind: "server" }),
      confirmItem("c_dev", "device_a", { answer: true }),
      confirmItem("c_no", "cancel_order", { answer: { approved: false, reason: "not now" } }),
    ),
  );
  const first = await answers(sock, 3);

  // lost with the socket, maybe: all three go again, the same frames
  const sock2 = await dropAndResume(gw, sock, 1, { replayed_from: 3, last_seq: 2 });
  const again = await answers(sock2, 3);
  assert.deepEqual(again, first);
  await flush();
  assert.deepEqual(sock2.unread, []);

  // a running server tool, the client function's call, a declined call's failure: confirmed
  sock2.push(
    { type: "tool.status", call_id: "c_srv", tool: "cancel_order", status: "running", response_id: "resp_1", seq: 3 },
    { type: "tool.calls", response_id: "resp_1", calls: [call("c_dev", "device_a")], seq: 4 },
  );
  await sock2.next("tool.results"); // device_a is no function here: an error result
  const sock3 = await dropAndResume(gw, sock2, 2, { replayed_from: 5, last_seq: 4 });
  assert.equal((await sock3.next("tool.results")).results[0].call_id, "c_dev"); // results go first
  assert.deepEqual(await sock3.next("tool.confirmation"), first.get("c_no"));
  await flush();
  assert.deepEqual(sock3.unread, []);
  sock3.push({
    type: "tool.status",
    call_id: "c_no",
    tool: "cancel_order",
    status: "failed",
    code: "declined",
    error: "declined by the user: not now",
    response_id: "resp_1",
    seq: 5,
  });
  const sock4 = await dropAndResume(gw, sock3, 3, { replayed_from: 6, last_seq: 5 });
  assert.equal((await sock4.next("tool.results")).results[0].call_id, "c_dev"); // unconfirmed still
  await flush();
  assert.deepEqual(sock4.unread, []);
  await conv.close();
});

test("open_confirmations after a resume are asked once each; those answered already are not", async () => {
  const { gw, conv, sock } = await started();
  const asked = [];
  let release = null;
  conv.onConfirm((item) => {
    asked.push(item.call_id);
    if (item.call_id === "c_slow") return new Promise((resolve) => (release = resolve));
    return true;
  });
  sock.push(askFor(2, confirmItem("c_done", "cancel_order"), confirmItem("c_slow", "cancel_order")));
  await sock.next("tool.confirmation"); // c_done; c_slow waits for the user
  sock.push({ type: "tool.status", call_id: "c_done", tool: "cancel_order", status: "running", seq: 3 });

  // the gateway offers every open one again, and one asked while the client was away
  const items = [confirmItem("c_done", "cancel_order"), confirmItem("c_slow", "cancel_order"), confirmItem("c_new", "cancel_order", {}, { timeout: 9.5 })];
  const opened = [];
  conv.on("session.resumed", (e) => opened.push(...e.open_confirmations.map((i) => `${i.call_id}:${i.kind}`)));
  const sock2 = await dropAndResume(gw, sock, 1, { replayed_from: 4, last_seq: 4, open_confirmations: items });
  // the replay holds the tool.confirm that asked c_new: still asked once
  sock2.push(askFor(4, confirmItem("c_new", "cancel_order")));
  const answered = await sock2.next("tool.confirmation");
  assert.equal(answered.call_id, "c_new");
  assert.deepEqual(opened, ["c_done:client", "c_slow:client", "c_new:client"]);
  release(false); // the user answers c_slow now, on the new socket
  assert.equal((await sock2.next("tool.confirmation")).call_id, "c_slow");
  await flush();
  assert.deepEqual(sock2.unread, []);
  assert.deepEqual(asked, ["c_done", "c_slow", "c_new"]);

  // after resume_gap, the snapshot's open_confirmations are asked too (once)
  sock2.drop(1013);
  const sock3 = await gw.socket(2);
  await sock3.next("session.resume");
  sock3.push({ type: "error", code: "resume_gap", message: "gone" });
  sock3.push({
    type: "session.snapshot",
    session_id: "sess_1",
    last_seq: 9,
    open_confirmations: [confirmItem("c_slow", "cancel_order"), confirmItem("c_snap", "cancel_order")],
  });
  const resent = await answers(sock3, 3); // c_new and c_slow unconfirmed, c_snap asked
  assert.deepEqual([...resent.keys()].sort(), ["c_new", "c_slow", "c_snap"]);
  assert.deepEqual(asked, ["c_done", "c_slow", "c_new", "c_snap"]);
  await conv.close();
});

test("a confirmation handler still waiting at close() is aborted and sends nothing", async () => {
  const { conv, sock } = await started();
  let aborted = null;
  conv.onConfirm((item, { signal }) => new Promise((_, reject) => signal.addEventListener("abort", () => reject((aborted = signal.reason)))));
  sock.push(askFor(2, confirmItem("c_wait", "cancel_order")));
  await flush();
  await conv.close();
  await flush();
  assert.ok(aborted instanceof SessionClosed);
  assert.deepEqual(sock.unread, []);
});

// ----------------------------------------------------------------------- widgets

/** A widget tool's call: the user answers it. */
const widgetCall = (call_id, tool, widget, args = {}, timeout = 10) => ({ ...call(call_id, tool, args, timeout), widget });
const STORES = { type: "choice", prompt: "Which store should I pick up from?", options: ["Main St", "Harbor"] };

/** The next `n` tool.results, one result each, by call id. */
async function resultsOf(sock, n) {
  const byCall = new Map();
  for (let i = 0; i < n; i += 1) {
    const msg = await sock.next("tool.results");
    assert.equal(msg.results.length, 1);
    byCall.set(msg.results[0].call_id, msg.results[0]);
  }
  return byCall;
}

test("onWidget answers widget calls with the user's answer; a throw is an error result", async () => {
  const { conv, sock } = await started();
  const order = [];
  conv.on("tool.calls", (e) => order.push(`event:${e.calls.length}`));
  conv.onWidget(async (c, { signal }) => {
    order.push(`show:${c.call_id}`);
    assert.ok(signal instanceof AbortSignal);
    switch (c.widget.type) {
      case "choice":
        return { choice: c.widget.options[1] };
      case "confirm":
        return { confirmed: false };
      case "form":
        return { name: "Ada", count: 3 };
      default:
        throw new RangeError(`cannot show ${c.widget.type}`);
    }
  });
  assert.throws(() => conv.onWidget("nope"), TypeError);
  const form = { type: "form", prompt: "Details?", fields: [{ name: "name", label: "Name" }, { name: "count", label: "Count", type: "number" }] };
  sock.push({
    type: "tool.calls",
    response_id: "resp_1",
    calls: [
      widgetCall("w_choice", "choose_pickup_store", STORES, { stores: STORES.options }),
      widgetCall("w_confirm", "ask_yes_no", { type: "confirm", prompt: "Sure?" }),
      widgetCall("w_form", "fill_form", form),
      widgetCall("w_odd", "odd_widget", { type: "slider", prompt: "How much?" }),
    ],
    seq: 2,
  });
  const results = await resultsOf(sock, 4);
  assert.equal(order[0], "event:4"); // listeners see the calls before the handler runs
  assert.deepEqual(results.get("w_choice"), { call_id: "w_choice", tool: "choose_pickup_store", output: { choice: "Harbor" } });
  assert.deepEqual(results.get("w_confirm"), { call_id: "w_confirm", tool: "ask_yes_no", output: { confirmed: false } });
  assert.deepEqual(results.get("w_form"), { call_id: "w_form", tool: "fill_form", output: { name: "Ada", count: 3 } });
  assert.deepEqual(results.get("w_odd"), { call_id: "w_odd", tool: "odd_widget", error: "RangeError: cannot show slider" });

  // the same call id again (a replay): not shown twice
  sock.push({ type: "tool.calls", response_id: "resp_1", calls: [widgetCall("w_choice", "choose_pickup_store", STORES)], seq: 3 });
  await flush();
  assert.deepEqual(sock.unread, []);
  assert.equal(order.filter((o) => o === "show:w_choice").length, 1);
  await conv.close();
});

test("a client function of the widget's name wins over onWidget; without either the call fails", async () => {
  const { conv, sock } = await started({}, (c) =>
    c.clientFunction("choose_pickup_store", (args, { call: cl }) => ({ choice: args.stores[0], widget: cl.widget.type })),
  );
  const shown = [];
  conv.onWidget((c) => {
    shown.push(c.call_id);
    return { choice: "never" };
  });
  sock.push({ type: "tool.calls", response_id: "resp_1", calls: [widgetCall("w_fn", "choose_pickup_store", STORES, { stores: ["Main St"] })], seq: 2 });
  const [fnResult] = (await sock.next("tool.results")).results;
  assert.deepEqual(fnResult, { call_id: "w_fn", tool: "choose_pickup_store", output: { choice: "Main St", widget: "choice" } });
  assert.deepEqual(shown, []);

  conv.onWidget(null);
  sock.push({ type: "tool.calls", response_id: "resp_1", calls: [widgetCall("w_none", "pick_colour", STORES)], seq: 3 });
  const [noHandler] = (await sock.next("tool.results")).results;
  assert.deepEqual(noHandler, { call_id: "w_none", tool: "pick_colour", error: "LookupError: this client has no function 'pick_colour'" });
  await conv.close();
});

test("a widget unanswered at its deadline fails; one a tool.status ends, or close(), stops asking and sends nothing", async () => {
  const { conv, sock } = await started();
  const signals = new Map();
  conv.onWidget((c, { signal }) => {
    signals.set(c.call_id, signal);
    return new Promise(() => {}); // the user never answers
  });
  sock.push({
    type: "tool.calls",
    response_id: "resp_1",
    calls: [widgetCall("w_late", "choose_pickup_store", STORES, {}, 0.05), widgetCall("w_gone", "choose_pickup_store", STORES), widgetCall("w_open", "choose_pickup_store", STORES)],
    seq: 2,
  });
  const [late] = (await sock.next("tool.results")).results;
  assert.deepEqual(late, { call_id: "w_late", tool: "choose_pickup_store", error: "the user did not answer in time" });
  assert.equal(signals.get("w_late").aborted, true);

  sock.push({ type: "tool.status", call_id: "w_gone", tool: "choose_pickup_store", status: "cancelled", seq: 3 });
  await flush();
  assert.equal(signals.get("w_gone").aborted, true);
  assert.match(signals.get("w_gone").reason.message, /cancelled/);
  assert.equal(signals.get("w_open").aborted, false);
  assert.deepEqual(sock.unread, []);

  await conv.close();
  assert.ok(signals.get("w_open").reason instanceof SessionClosed);
  assert.deepEqual(sock.unread, []);
});

// ----------------------------------------------------------------------- reconnects

test("a plain Error's message goes alone; a named error keeps its name; an empty message keeps the name", async () => {
  class Unnamed extends Error {} // its name is still "Error": the prefix would say nothing
  const { conv, sock } = await started({}, (c) => {
    c.clientFunction("get_battery_level", () => {
      throw new Error("The user has turned off battery access.");
    });
    c.clientFunction("rejects_plain", async () => {
      throw new Error("no signal");
    });
    c.clientFunction("throws_string", () => {
      throw "the page is hidden"; // a string, not an Error
    });
    c.clientFunction("unnamed", () => {
      throw new Unnamed("from a subclass");
    });
    c.clientFunction("named", () => {
      throw new TypeError("bad zip code");
    });
    c.clientFunction("dom", () => {
      throw new DOMException("the user said no", "NotAllowedError");
    });
    c.clientFunction("empty", () => {
      throw new Error("");
    });
    c.clientFunction("empty_named", () => {
      throw new RangeError();
    });
  });
  conv.onServerTool(() => {
    throw new Error("the shelf is out of reach");
  });
  conv.onWidget(() => {
    throw new Error("the screen is off");
  });
  conv.onConfirm(() => {
    throw new Error("no dialog");
  });
  const tools = ["get_battery_level", "rejects_plain", "throws_string", "unnamed", "named", "dom", "empty", "empty_named"];
  sock.push({
    type: "tool.calls",
    response_id: "resp_1",
    calls: [
      ...tools.map((tool) => call(`c_${tool}`, tool)),
      serverCall("c_server", "check_stock"),
      widgetCall("c_widget", "choose_pickup_store", STORES),
    ],
    seq: 2,
  });
  const results = await resultsOf(sock, tools.length + 2);
  const errors = Object.fromEntries([...results].map(([id, result]) => [id, result.error]));
  assert.deepEqual(errors, {
    c_get_battery_level: "The user has turned off battery access.",
    c_rejects_plain: "no signal",
    c_throws_string: "the page is hidden",
    c_unnamed: "from a subclass",
    c_named: "TypeError: bad zip code",
    c_dom: "NotAllowedError: the user said no",
    c_empty: "Error",
    c_empty_named: "RangeError",
    c_server: "the shelf is out of reach",
    c_widget: "the screen is off",
  });
  sock.push(askFor(3, confirmItem("c_confirm", "cancel_order")));
  const declined = await sock.next("tool.confirmation");
  assert.equal(declined.reason, "the confirmation handler failed (no dialog)");
  await conv.close();
});

test("agent: session.created's, each agent.transferred's, and a resume's when it names one", async () => {
  const { gw, conv, sock } = await started();
  assert.equal(conv.agent, "test");
  const seen = [];
  conv.on("agent.transferred", (e) => seen.push([e.agent, e.previous_agent, e.reason, e.tools.length]));
  sock.push({ type: "agent.transferred", agent: "billing", previous_agent: "test", seq: 2 });
  await flush();
  assert.equal(conv.agent, "billing");
  assert.deepEqual(seen, [["billing", "test", null, 0]]); // omitted fields filled in
  const sock2 = await dropAndResume(gw, sock, 1, { replayed_from: 3, last_seq: 2 }); // an older gateway
  await flush();
  assert.equal(conv.agent, "billing");
  await dropAndResume(gw, sock2, 2, { replayed_from: 3, last_seq: 5, agent: "front" });
  await flush();
  assert.equal(conv.agent, "front"); // handed over while away, its event acked and gone
  await conv.close();
});

test("after an abnormal close: session.resume with last_seq, resends, open_calls run once", async () => {
  const runs = { device_a: 0, device_b: 0, device_c: 0 };
  const { gw, conv, sock } = await started({}, (c) => {
    for (const name of Object.keys(runs)) {
      c.clientFunction(name, () => {
        runs[name] += 1;
        return { value: name };
      });
    }
  });
  const states = [];
  conv.on("connection", (e) => states.push(`${e.state}/${e.reconnects}`));
  const star = [];
  conv.on("*", (e) => star.push(e.seq ? `${e.type}:${e.seq}` : e.type));
  const resumedEvents = [];
  conv.on("session.resumed", (e) => resumedEvents.push(e));

  const answered = await conv.post("echo a");
  const unanswered = await conv.post("one");
  await sock.next("user.message");
  await sock.next("user.message");
  sock.push({ type: "response.created", response_id: "resp_1", in_reply_to: answered, seq: 2 });
  // a result the gateway confirms, and one it never confirms
  sock.push({ type: "tool.calls", response_id: "resp_1", calls: [call("call_c", "device_c")], seq: 3 });
  await sock.next("tool.results");
  sock.push({ type: "tool.status", call_id: "call_c", tool: "device_c", status: "completed", response_id: "resp_1", seq: 4 });
  sock.push({ type: "tool.calls", response_id: "resp_1", calls: [call("call_a", "device_a")], seq: 5 });
  const resultA = await sock.next("tool.results");

  sock.drop(1006);
  assert.equal(conv.state, "reconnecting");
  // sent while disconnected: user messages are not lost, a cancel may be
  const away = await conv.post("while away");
  await conv.cancel("resp_1");

  const sock2 = await gw.socket(1);
  assert.deepEqual(sock2.protocols, ["gateway.v1"]);
  assert.deepEqual(await sock2.next("session.resume"), {
    type: "session.resume",
    session_id: "sess_1",
    resume_token: "tok_1",
    last_seq: 5,
  });
  assert.deepEqual(sock2.unread, []); // nothing else before the gateway answers
  assert.equal(conv.state, "reconnecting");

  sock2.push({
    type: "session.resumed",
    session_id: "sess_1",
    replayed_from: 6,
    last_seq: 6,
    open_calls: [call("call_a", "device_a", {}, 9.5), call("call_b", "device_b", {}, 9.5)],
  });
  assert.equal(conv.state, "open");
  assert.equal(conv.reconnects, 1);
  // the replay: an event already seen, then a batch with a call already running
  sock2.push(
    { type: "tool.calls", response_id: "resp_1", calls: [call("call_a", "device_a")], seq: 5 },
    { type: "tool.calls", response_id: "resp_1", calls: [call("call_b", "device_b")], seq: 6 },
  );

  const resent = await sock2.next("tool.results");
  assert.deepEqual(resent.results, resultA.results); // the same result, not a new run
  assert.equal((await sock2.next("user.message")).id, unanswered);
  assert.equal((await sock2.next("user.message")).id, away);
  const resultB = await sock2.next("tool.results");
  assert.deepEqual(resultB.results, [{ call_id: "call_b", tool: "device_b", output: { value: "device_b" } }]);
  await flush();
  assert.deepEqual(sock2.unread, []);
  assert.deepEqual(runs, { device_a: 1, device_b: 1, device_c: 1 });

  assert.deepEqual(states, ["reconnecting/0", "open/1"]);
  assert.equal(resumedEvents.length, 1);
  assert.equal(resumedEvents[0].open_calls.length, 2);
  assert.deepEqual(star.slice(-2), ["session.resumed", "tool.calls:6"]);
  assert.equal(conv.lastSeq, 6); // session.resumed does not move the cursor

  // confirmed and answered now: a second drop resends nothing but call_b's result
  sock2.push(
    { type: "tool.status", call_id: "call_a", tool: "device_a", status: "completed", duplicate: true, seq: 7 },
    { type: "response.created", response_id: "resp_2", in_reply_to: unanswered, seq: 8 },
    { type: "error", code: "busy", message: "queue full", in_reply_to: away, retryable: true, seq: 9 },
  );
  const sock3 = await dropAndResume(gw, sock2, 2, { replayed_from: 10, last_seq: 9 });
  assert.deepEqual((await sock3.next("tool.results")).results, resultB.results);
  await flush();
  assert.deepEqual(sock3.unread, []);
  assert.equal(conv.reconnects, 2);
  await conv.close();
  assert.deepEqual(sock3.closedByClient, { code: 1000, reason: "" });
});

test("an unreachable gateway is retried with backoff until it answers", async () => {
  const { gw, conv, sock } = await started({ maxReconnectDelay: 20 });
  gw.refuse = 3;
  sock.drop(1011, "keepalive ping timeout");
  const sock2 = await gw.socket(1);
  assert.equal(gw.attempts.length, 5); // the first socket, 3 refused, this one
  assert.equal((await sock2.next("session.resume")).last_seq, 1);
  sock2.push({ type: "session.resumed", session_id: "sess_1", replayed_from: 2, last_seq: 1 });
  assert.equal(conv.state, "open");
  assert.equal(conv.reconnects, 1);
  await conv.close();
});

test("the backoff starts at 50 ms, doubles, is capped, and is fully jittered", async (t) => {
  const { gw, conv, sock } = await started({ maxReconnectDelay: 300 });
  const realSetTimeout = globalThis.setTimeout;
  const waits = [];
  t.mock.method(globalThis, "setTimeout", (fn, ms, ...args) => {
    waits.push(ms);
    return realSetTimeout(fn, 0, ...args); // no real waiting
  });
  // full jitter: anywhere from 0 up to the ceiling
  const randoms = [0.999, 0.999, 0.999, 0.999, 0, 0];
  t.mock.method(Math, "random", () => randoms.shift());
  gw.refuse = 6;
  sock.drop(1006);
  const sock2 = await gw.socket(1);
  assert.equal(gw.attempts.length, 8); // the first socket, 6 refused, this one
  await sock2.next("session.resume");
  assert.deepEqual(
    waits.filter((ms) => ms !== 10_000).map((ms) => Math.round(ms / 0.999)),
    [50, 100, 200, 300, 0, 0],
  );
  await conv.close();
});

/**
 * Make every backoff wait (the ones under a second: not `attemptTimeout`, not close()'s) last a
 * minute, so that within a test only `retryNow()` ends one; jitter at its top (0.999).
 * @returns {number[]} the backoff waits the loop asked for, ms, in order.
 */
function stretchBackoff(t) {
  const realSetTimeout = globalThis.setTimeout;
  const waits = [];
  t.mock.method(globalThis, "setTimeout", (fn, ms, ...args) => {
    if (ms >= 1_000) return realSetTimeout(fn, ms, ...args);
    waits.push(Math.round(ms / 0.999));
    return realSetTimeout(fn, 60_000, ...args).unref(); // never keeps a failed test's process alive
  });
  t.mock.method(Math, "random", () => 0.999);
  return waits;
}

test("retryNow() cuts the wait between reconnect attempts short; the backoff keeps growing; nothing is lost", async (t) => {
  const { gw, conv, sock } = await started({ maxReconnectDelay: 60_000 });
  const waits = stretchBackoff(t);
  const states = [];
  conv.on("connection", (e) => states.push(e.state));
  assert.equal(conv.retryNow(), false); // connected: nothing to cut short

  gw.refuse = Infinity;
  sock.drop(1006);
  await gw.until(() => gw.attempts.length === 2); // the first attempt goes at once: refused
  await flush(); // the loop waits now
  assert.deepEqual(waits, [50]);
  const away = await conv.post("while away");
  assert.equal(conv.retryNow(), true);
  assert.equal(conv.retryNow(), false); // cut short already: the attempt is on its way
  await gw.until(() => gw.attempts.length === 3); // at once, and refused again
  await flush();
  assert.deepEqual(waits, [50, 100]); // the backoff grew as without retryNow()
  assert.equal(conv.state, "reconnecting");

  gw.refuse = 0; // the network is back
  assert.equal(conv.retryNow(), true);
  const sock2 = await gw.socket(1);
  assert.equal(conv.retryNow(), false); // an attempt in flight
  assert.equal((await sock2.next("session.resume")).last_seq, 1);
  assert.equal(conv.retryNow(), false); // still in flight: the answer has not come
  sock2.push({ type: "session.resumed", session_id: "sess_1", replayed_from: 2, last_seq: 1 });
  assert.equal((await sock2.next("user.message")).id, away); // sent again on the new socket
  assert.equal(conv.state, "open");
  assert.equal(conv.reconnects, 1);
  assert.equal(conv.retryNow(), false); // connected
  await flush();
  assert.equal(gw.attempts.length, 4); // one attempt per retryNow(): never a second loop
  assert.deepEqual(waits, [50, 100]);
  assert.deepEqual(states, ["reconnecting", "open"]);
  await conv.close();
  assert.equal(conv.retryNow(), false); // closed
});

test("retryNow(): false before connect(); between a first connect's attempts it dials at once; giveUpAfter counts on", async (t) => {
  const waits = stretchBackoff(t);
  const gw = new FakeGateway();
  const conv = new GatewayClient(URL, { WebSocketImpl: gw.WebSocket, maxReconnectDelay: 60_000 });
  assert.equal(conv.retryNow(), false); // nothing started
  assert.equal(gw.attempts.length, 0);
  gw.refuse = 1;
  const connecting = conv.connect();
  await gw.until(() => gw.attempts.length === 1);
  await flush();
  assert.equal(conv.state, "connecting");
  assert.equal(conv.retryNow(), true);
  await connecting;
  assert.equal(gw.attempts.length, 2);
  assert.deepEqual(waits, [50]);
  await conv.close();

  // retryNow() does not restart the give-up count: the attempt it makes fails like any other
  let clock = 1000;
  t.mock.method(performance, "now", () => clock);
  const { gw: gw2, conv: conv2, sock } = await started({ giveUpAfter: 100, maxReconnectDelay: 60_000 });
  gw2.refuse = Infinity;
  sock.drop(1006);
  await gw2.until(() => gw2.attempts.length === 2); // failing since 1000
  await flush();
  clock = 1150;
  assert.equal(conv2.retryNow(), true);
  await assert.rejects(conv2.events().next(), (err) => err instanceof SessionClosed && err.reason === "could not reach the gateway for 0.1 s");
  assert.equal(gw2.attempts.length, 3);
  assert.equal(conv2.state, "closed");
  assert.equal(conv2.retryNow(), false);
});

test("close() while reconnecting stops the retries", async () => {
  const { gw, conv, sock } = await started({ maxReconnectDelay: 5 });
  gw.refuse = Infinity;
  sock.drop(1006);
  await gw.until(() => gw.attempts.length >= 4);
  await conv.close();
  assert.equal(conv.state, "closed");
  const attempts = gw.attempts.length;
  await flush();
  assert.equal(gw.attempts.length, attempts);
  await assert.rejects(conv.post("hello?"), (err) => err instanceof SessionClosed && err.closedWith === 1000);
});

test("a session.update not yet answered is sent again after a resume", async () => {
  const { gw, conv, sock } = await started();
  conv.clientFunction("late", () => 1);
  const update = await sock.next("session.update");
  assert.match(update.id, /^upd_/);
  const sock2 = await dropAndResume(gw, sock, 1);
  assert.deepEqual(await sock2.next("session.update"), update);
  sock2.push({ type: "session.updated", tools: [], in_reply_to: update.id, seq: 2 });
  const sock3 = await dropAndResume(gw, sock2, 2);
  await flush();
  assert.deepEqual(sock3.unread, []);
  await conv.close();
});

test("after a resume, messages keep their options and updates go again in the order sent", async () => {
  const { gw, conv, sock } = await started();
  const first = await conv.update({ toolChoice: "required" });
  const firstFrame = await sock.next("session.update");
  const msg = await conv.post("one", { toolChoice: "none", tools: ["device_a"], maxSteps: 2 });
  const msgFrame = await sock.next("user.message");
  assert.deepEqual(msgFrame, { type: "user.message", id: msg, text: "one", tool_choice: "none", tools: ["device_a"], max_steps: 2 });
  // these two go unanswered; the second overrides the first in full: only it is kept
  await conv.update({ maxSteps: 5 });
  await sock.next("session.update");
  const last = await conv.update({ toolChoice: "auto", maxSteps: 6 });
  const lastFrame = await sock.next("session.update");
  // registered later: a session.update of its own (it does not override the one before it)
  conv.clientFunction("late", () => 1);
  const declared = await sock.next("session.update");

  const sock2 = await dropAndResume(gw, sock, 1);
  assert.deepEqual(await sock2.next("session.update"), firstFrame);
  assert.deepEqual(await sock2.next("user.message"), msgFrame);
  assert.deepEqual(await sock2.next("session.update"), lastFrame);
  assert.deepEqual(await sock2.next("session.update"), declared);
  await flush();
  assert.deepEqual(sock2.unread, []);

  // answered now: only the message waiting for its response goes again
  sock2.push(
    { type: "session.updated", in_reply_to: first, seq: 2 },
    { type: "error", code: "invalid_message", message: "max_steps 6 is over", in_reply_to: last, seq: 3 },
    { type: "session.updated", in_reply_to: declared.id, seq: 4 },
  );
  const sock3 = await dropAndResume(gw, sock2, 2);
  assert.deepEqual(await sock3.next("user.message"), msgFrame);
  await flush();
  assert.deepEqual(sock3.unread, []);
  await conv.close();
});

test("resume_gap then session.snapshot: say() throws ResumeGap, the cursor jumps, open calls run", async () => {
  const runs = [];
  const { gw, conv, sock } = await started({}, (c) =>
    c.clientFunction("device_a", (args) => {
      runs.push(args);
      return { value: "a" };
    }),
  );
  const star = [];
  conv.on("*", (e) => star.push(e.type === "error" ? `error:${e.code}` : e.seq ? `${e.type}:${e.seq}` : e.type));
  const gaps = [];
  conv.on("error", (e) => gaps.push(e));
  const snapshots = [];
  conv.on("session.snapshot", (e) => snapshots.push(e));

  const reply = collect(conv.say("echo a b c"));
  const msg = await sock.next("user.message");
  sock.push(
    { type: "response.created", response_id: "resp_1", in_reply_to: msg.id, seq: 2 },
    { type: "text.delta", response_id: "resp_1", delta: "a ", seq: 3 },
  );
  sock.drop(1013, "client too slow: resume to get the rest");
  const sock2 = await gw.socket(1);
  assert.equal((await sock2.next("session.resume")).last_seq, 3);
  sock2.push({ type: "error", code: "resume_gap", message: "events after seq 3 are gone; rebuild from the snapshot" });
  assert.equal(conv.state, "reconnecting"); // the snapshot is still to come
  sock2.push({
    type: "session.snapshot",
    session_id: "sess_1",
    last_seq: 19,
    transcript: [
      { role: "user", text: "echo a b c" },
      { role: "assistant", text: "a b c" },
    ],
    open_calls: [call("call_x", "device_a", { k: 1 }, 9.4)],
  });
  await assert.rejects(reply, (err) => {
    assert.ok(err instanceof ResumeGap);
    assert.equal(err.snapshot.last_seq, 19);
    assert.equal(err.snapshot.transcript.length, 2);
    return true;
  });
  assert.equal(conv.state, "open");
  assert.equal(conv.reconnects, 1);
  assert.equal(conv.lastSeq, 19);
  assert.equal(gaps.length, 1);
  assert.equal(gaps[0].seq, 0);
  assert.equal(snapshots.length, 1);
  assert.deepEqual((await sock2.next("tool.results")).results, [{ call_id: "call_x", tool: "device_a", output: { value: "a" } }]);
  assert.deepEqual(runs, [{ k: 1 }]);

  // live events go on from the snapshot's last_seq + 1
  sock2.push(pong(19), pong(20));
  assert.deepEqual(star.slice(-3), ["error:resume_gap", "session.snapshot", "pong:20"]);
  await conv.close();
});

// ----------------------------------------------------------------------- attempts that fail

/** A text reply to user message `msg` (response.created, one delta, response.done) from `seq`. */
const reply = (msg, text, seq) => [
  { type: "response.created", response_id: "resp_1", in_reply_to: msg.id, seq },
  { type: "text.delta", response_id: "resp_1", delta: text, seq: seq + 1 },
  { type: "response.done", response_id: "resp_1", status: "completed", turn_completed: true, seq: seq + 2 },
];

test("a drop before session.created sends session.start again on a new socket, functions and options included", async () => {
  const gw = new FakeGateway();
  const conv = new GatewayClient(URL, { WebSocketImpl: gw.WebSocket, agent: "demo", toolChoice: "required" });
  conv.clientFunction("device_a", () => ({ value: "a" }));
  const states = [];
  conv.on("connection", (e) => states.push(e.state));
  const answer = collect(conv.say("echo hi"));
  const sock = await gw.socket(0);
  const first = await sock.next("session.start");
  assert.equal(first.agent, "demo");
  assert.equal(first.tool_choice, "required");
  conv.clientFunction("device_b", () => ({ value: "b" })); // after session.start went: an update
  const update = await sock.next("session.update");
  sock.drop(1006); // the gateway may never have seen session.start, or its answer was lost

  const sock2 = await gw.socket(1);
  assert.deepEqual(await sock2.next("session.start"), {
    ...first,
    client_functions: update.client_functions, // every function registered by now
  });
  assert.deepEqual(await sock2.next("session.update"), update); // not answered yet: sent again
  sock2.push(created(1));
  const msg = await sock2.next("user.message");
  sock2.push(...reply(msg, "hi", 2));
  assert.deepEqual(await answer, ["hi"]);
  assert.deepEqual(states, ["connecting", "open", "reconnecting", "open"]);
  assert.equal(conv.reconnects, 0); // not a resume
  assert.equal(gw.attempts.length, 2);
  await conv.close();
  assert.deepEqual(sock2.closedByClient, { code: 1000, reason: "" });
});

test("a session.start unanswered within attemptTimeout is dropped with 4000 and sent again with backoff", async () => {
  const gw = new FakeGateway();
  const conv = new GatewayClient(URL, { WebSocketImpl: gw.WebSocket, attemptTimeout: 50, maxReconnectDelay: 5 });
  await conv.connect();
  const starting = conv.start();
  const sock = await gw.socket(0);
  await sock.next("session.start"); // and no answer
  gw.refuse = 2; // then the gateway is down for a while
  const sock2 = await gw.socket(1);
  assert.deepEqual(sock.closedByClient, { code: 4000, reason: "no answer to session.start" });
  assert.equal(gw.attempts.length, 4);
  await sock2.next("session.start");
  sock2.push(created(1));
  assert.equal((await starting).session_id, "sess_1");
  await conv.close();
});

test("before session.created a final close ends the conversation and a refused start is not sent again", async () => {
  const gw = new FakeGateway();
  const conv = new GatewayClient(URL, { WebSocketImpl: gw.WebSocket });
  const starting = conv.start();
  const sock = await gw.socket(0);
  await sock.next("session.start");
  sock.drop(1011); // not final: sent again
  const sock2 = await gw.socket(1);
  await sock2.next("session.start");
  sock2.drop(4001, "token expired");
  await assert.rejects(starting, (err) => err instanceof SessionClosed && err.closedWith === 4001);
  assert.equal(gw.attempts.length, 2);
  assert.equal(conv.state, "closed");

  const gw2 = new FakeGateway();
  const refused = new GatewayClient(URL, { WebSocketImpl: gw2.WebSocket, agent: "nope" });
  const starting2 = refused.start();
  const sock3 = await gw2.socket(0);
  await sock3.next("session.start");
  sock3.push({ type: "error", code: "invalid_message", message: "unknown agent 'nope'", seq: 1 });
  await assert.rejects(starting2, ServerError);
  sock3.drop(1006);
  await flush();
  assert.equal(gw2.attempts.length, 1);
  assert.equal(refused.state, "closed");
});

test("a resume attempt that fails with only an error event, or never opens, or is not answered, is retried", async () => {
  const { gw, conv, sock } = await started({ attemptTimeout: 50, maxReconnectDelay: 5 });
  gw.plan = ["error", "hang", "error+close", "open"];
  sock.drop(1006);
  const unanswered = await gw.socket(1);
  await unanswered.next("session.resume"); // and no answer
  const sock2 = await gw.socket(2);
  assert.equal(gw.attempts.length, 6);
  assert.equal(gw.attempts[2].closedByClient.code, 4000); // hung: dropped, never with 1000
  assert.deepEqual(unanswered.closedByClient, { code: 4000, reason: "no answer to session.resume" });
  await sock2.next("session.resume");
  sock2.push({ type: "session.resumed", session_id: "sess_1", replayed_from: 2, last_seq: 1 });
  assert.equal(conv.state, "open");
  assert.equal(conv.reconnects, 1);
  await conv.close();
});

test("after giveUpAfter of failed attempts the conversation ends, saying so", async () => {
  const down = new FakeGateway();
  down.refuse = Infinity;
  const never = new GatewayClient(URL, { WebSocketImpl: down.WebSocket, giveUpAfter: 100, maxReconnectDelay: 5 });
  const began = performance.now();
  const gaveUp = (err) =>
    err instanceof SessionClosed && err.closedWith === 1006 && err.reason === "could not reach the gateway for 0.1 s";
  await assert.rejects(never.connect(), gaveUp);
  assert.ok(performance.now() - began >= 100);
  assert.ok(down.attempts.length > 2);
  assert.equal(never.state, "closed");
  await assert.rejects(never.start(), gaveUp);
  await assert.rejects(never.events().next(), gaveUp);

  const { gw, conv, sock } = await started({ giveUpAfter: 1500, maxReconnectDelay: 5 });
  const states = [];
  conv.on("connection", (e) => states.push(e));
  sock.drop(1006);
  gw.refuse = Infinity;
  const answer = collect(conv.say("echo hi"));
  await assert.rejects(answer, (err) => err instanceof SessionClosed && err.reason === "could not reach the gateway for 1.5 s");
  assert.deepEqual(states.map((e) => e.state), ["reconnecting", "closed"]);
  assert.equal(states[1].error.closedWith, 1006);
  await assert.rejects(collect(conv.say("again")), SessionClosed);
  await assert.rejects(conv.start(), SessionClosed);
  await assert.rejects(conv.connect(), SessionClosed);
  const attempts = gw.attempts.length;
  await conv.close(); // the gateway was unreachable: no socket to end the session with
  assert.equal(gw.attempts.length, attempts);
});

test("an attempt whose upgrade is answered starts the give-up count anew", async (t) => {
  let clock = 1000;
  t.mock.method(performance, "now", () => clock);
  const { gw, conv, sock } = await started({ giveUpAfter: 100, maxReconnectDelay: 1 });
  gw.refuse = Infinity;
  sock.drop(1006);
  await gw.until(() => gw.attempts.length >= 3); // failing since 1000
  clock = 1090;
  await gw.until(() => gw.attempts.length >= 5);
  gw.refuse = 0; // one reaches the gateway, then drops before the answer
  const reached = await gw.socket(1);
  await reached.next("session.resume");
  clock = 1150; // 150 after the first failure, 0 after the gateway answered an upgrade
  gw.refuse = Infinity;
  reached.drop(1006);
  let attempts = gw.attempts.length;
  await gw.until(() => gw.attempts.length >= attempts + 2);
  clock = 1240;
  attempts = gw.attempts.length;
  await gw.until(() => gw.attempts.length >= attempts + 2);
  assert.equal(conv.state, "reconnecting");
  clock = 1260; // 110 since the attempts began failing again
  await assert.rejects(conv.events().next(), (err) => err instanceof SessionClosed && err.reason === "could not reach the gateway for 0.1 s");
});

/**
 * Stand in for fetch (the DELETE that ends a session without a socket): record each request;
 * `answer` gives its status, or "hang" (no answer until the client aborts it).
 */
function fakeFetch(t, answer = () => 204) {
  const requests = [];
  t.mock.method(globalThis, "fetch", (url, init) => {
    requests.push({ url, method: init.method, headers: init.headers });
    const status = answer();
    if (status !== "hang") return Promise.resolve({ status });
    return new Promise((_, reject) => init.signal.addEventListener("abort", () => reject(init.signal.reason)));
  });
  return requests;
}

test("close() between attempts ends the session with DELETE /v1/sessions/{id}, its resume token as credential", async (t) => {
  const requests = fakeFetch(t);
  const { gw, conv, sock } = await started({ maxReconnectDelay: 10_000 });
  t.mock.method(Math, "random", () => 0.999);
  const seen = [];
  conv.on("*", (e) => seen.push(e.type));
  const states = [];
  conv.on("connection", (e) => states.push(e.state));
  gw.refuse = 1;
  sock.drop(1006);
  await gw.until(() => gw.attempts.length === 2); // refused: the loop waits ~50 ms
  await flush();
  await conv.close();
  assert.deepEqual(requests, [
    { url: "http://gw.test/v1/sessions/sess_1", method: "DELETE", headers: { Authorization: "Bearer tok_1" } },
  ]);
  assert.deepEqual(seen, []); // nothing of it reached the listeners
  assert.deepEqual(states, ["reconnecting", "closed"]);
  assert.equal(gw.attempts.length, 2); // no socket to end it
  assert.equal(conv.reconnects, 0);
});

test("close() during a resume attempt drops it with 4000, then ends the session with the DELETE", async (t) => {
  const requests = fakeFetch(t);
  const { gw, conv, sock } = await started();
  gw.plan = ["hang"];
  sock.drop(1006);
  await gw.until(() => gw.attempts.length === 2);
  const closing = conv.close();
  assert.equal(gw.attempts[1].closedByClient.code, 4000);
  await closing;
  assert.equal(requests.length, 1);
  assert.equal(gw.attempts.length, 2);

  // an attempt that opened and waits for its answer is dropped the same way
  const two = await started();
  two.sock.drop(1006);
  const resuming = await two.gw.socket(1);
  await resuming.next("session.resume");
  const closing2 = two.conv.close();
  assert.equal(resuming.closedByClient.code, 4000);
  await closing2;
  assert.equal(requests.length, 2);
  assert.equal(two.gw.attempts.length, 2);
});

test("sessionUrl: the session's HTTP URL next to the socket's, without its query", () => {
  assert.equal(sessionUrl(`${URL}?token=t&session=s`, "sess_1"), "http://gw.test/v1/sessions/sess_1");
  assert.equal(sessionUrl("wss://h.test:8443/gw/v1/realtime#x", "a/b c"), "https://h.test:8443/gw/v1/sessions/a%2Fb%20c");
});

test("resumeUrl adds session= to the query, keeps the rest as written, never repeats it", () => {
  assert.equal(resumeUrl(URL, "sess_1"), `${URL}?session=sess_1`);
  assert.equal(resumeUrl(`${URL}?token=a%2Bb.c`, "sess_1"), `${URL}?token=a%2Bb.c&session=sess_1`);
  assert.equal(resumeUrl(`${URL}?session=old&x=1&session=older`, "sess_2"), `${URL}?x=1&session=sess_2`);
  assert.equal(resumeUrl(`${URL}?sess%69on=old&sessions=2`, "sess_3"), `${URL}?sessions=2&session=sess_3`);
  assert.equal(resumeUrl(`${URL}?`, "a b/&c"), `${URL}?session=a%20b%2F%26c`);
  assert.equal(resumeUrl("/v1/realtime?token=t#frag", "sess_1"), "/v1/realtime?token=t&session=sess_1#frag");
});

test("every socket that resumes names the session in its URL; those that start one do not", async (t) => {
  const requests = fakeFetch(t);
  const url = `${URL}?token=t1&session=stale`;
  const gw = new FakeGateway();
  const conv = new GatewayClient(url, { WebSocketImpl: gw.WebSocket, maxReconnectDelay: 10_000 });
  const starting = conv.start();
  const sock = await gw.socket(0);
  await sock.next("session.start");
  sock.drop(1006); // before session.created: a new start, not a resume
  const restart = await gw.socket(1);
  await restart.next("session.start");
  restart.push(created(1));
  await starting;
  const resumed = await dropAndResume(gw, restart, 2);
  // close() between attempts: the DELETE that ends the session names it in its path
  t.mock.method(Math, "random", () => 0.999);
  gw.refuse = 1;
  resumed.drop(1006);
  await gw.until(() => gw.attempts.length === 4); // refused: the loop waits ~50 ms
  await flush();
  await conv.close();
  const resuming = `${URL}?token=t1&session=sess_1`;
  assert.deepEqual(
    gw.attempts.map((s) => s.url),
    [url, url, resuming, resuming],
  );
  assert.deepEqual(
    requests.map((r) => r.url),
    ["http://gw.test/v1/sessions/sess_1"],
  );

  // resume(): attaching to a saved session is a resume like any other
  const gw2 = new FakeGateway();
  const later = new GatewayClient(URL, { WebSocketImpl: gw2.WebSocket });
  const attaching = later.resume({ session_id: "sess_9", resume_token: "tok_9" }, 4);
  const sock2 = await gw2.socket(0);
  assert.equal(sock2.url, `${URL}?session=sess_9`);
  assert.equal((await sock2.next("session.resume")).session_id, "sess_9");
  sock2.push({ type: "session.resumed", session_id: "sess_9", replayed_from: 5, last_seq: 4 });
  await attaching;
  await later.close();
});

test("close() ending a session without a socket returns within a second whatever the network does", async (t) => {
  const requests = fakeFetch(t, () => "hang");
  const { gw, conv, sock } = await started({ maxReconnectDelay: 10_000 });
  gw.plan = ["hang"];
  sock.drop(1006);
  await gw.until(() => gw.attempts.length === 2);
  const began = performance.now();
  await conv.close();
  const took = performance.now() - began;
  assert.ok(took >= 700 && took < 1000, `close() took ${took} ms`);
  assert.equal(requests.length, 1); // sent, and abandoned
  assert.equal(gw.attempts[1].closedByClient.code, 4000); // never 1000
});

// ----------------------------------------------------------------------- the end

test("a final close code ends the conversation: say() throws SessionClosed, no resume", async () => {
  const { gw, conv, sock } = await started();
  const states = [];
  conv.on("connection", (e) => states.push(e));
  const events = collect(conv.events());
  const reply = collect(conv.say("hi"));
  await sock.next("user.message");
  sock.drop(4009, "session taken over by a new socket");
  await assert.rejects(reply, (err) => {
    assert.ok(err instanceof SessionClosed);
    assert.equal(err.closedWith, 4009);
    assert.equal(err.reason, "session taken over by a new socket");
    return true;
  });
  await assert.rejects(events, SessionClosed);
  assert.equal(gw.attempts.length, 1);
  assert.equal(conv.state, "closed");
  assert.equal(states.length, 1);
  assert.equal(states[0].state, "closed");
  assert.equal(states[0].error.closedWith, 4009);
  await assert.rejects(conv.post("again"), SessionClosed);
  await assert.rejects(conv.cancel(), SessionClosed);
  await assert.rejects(collect(conv.say("again")), SessionClosed);
  await conv.close(); // harmless
});

test("a resume refused with 4004 ends the conversation", async () => {
  const { gw, conv, sock } = await started();
  const reply = collect(conv.say("hi"));
  await sock.next("user.message");
  sock.drop(1012, "service restart");
  const sock2 = await gw.socket(1);
  await sock2.next("session.resume");
  sock2.drop(4004, "unknown session");
  await assert.rejects(reply, (err) => err instanceof SessionClosed && err.closedWith === 4004);
  assert.equal(conv.state, "closed");
  assert.equal(gw.attempts.length, 2);
});

test("without reconnect any close ends the conversation, before session.created too", async () => {
  const { gw, conv, sock } = await started({ reconnect: false });
  sock.drop(1006);
  assert.equal(conv.state, "closed");
  await assert.rejects(conv.post("x"), (err) => err instanceof SessionClosed && err.closedWith === 1006);
  assert.equal(gw.attempts.length, 1);

  const gw2 = new FakeGateway();
  const early = new GatewayClient(URL, { WebSocketImpl: gw2.WebSocket, reconnect: false });
  await early.connect();
  const starting = early.start();
  const sock2 = await gw2.socket(0);
  await sock2.next("session.start");
  sock2.drop(1011);
  await assert.rejects(starting, (err) => err instanceof SessionClosed && err.closedWith === 1011);
  assert.equal(gw2.attempts.length, 1);
});

test("close() sends code 1000 and ends pending say() iterators", async () => {
  const { conv, sock } = await started();
  const states = [];
  conv.on("connection", (e) => states.push(e.state));
  const reply = collect(conv.say("hi"));
  await sock.next("user.message");
  await conv.close();
  assert.deepEqual(sock.closedByClient, { code: 1000, reason: "" });
  await assert.rejects(reply, (err) => err instanceof SessionClosed && err.closedWith === 1000);
  assert.deepEqual(states, ["closed"]);
  assert.equal(conv.state, "closed");
  await conv.close(); // twice is fine
});

test("close() while the first socket is still connecting", async () => {
  const gw = new FakeGateway();
  const conv = new GatewayClient(URL, { WebSocketImpl: gw.WebSocket });
  const connecting = conv.connect();
  await conv.close();
  await assert.rejects(connecting, SessionClosed);
  assert.equal(gw.attempts[0].closedByClient.code, 1000);
  assert.equal(gw.accepted.length, 0);
});

// ----------------------------------------------------------------------- devices, going away

/** A client whose session.created names its device `dev_1`; one client function, `device_a`. */
async function startedAsDevice(options = {}) {
  const gw = new FakeGateway();
  const conv = new GatewayClient(URL, { WebSocketImpl: gw.WebSocket, ...options });
  conv.clientFunction("device_a", () => ({ value: "a" }), { description: "Device a." });
  await conv.connect();
  const sock = await gw.socket(0);
  const starting = conv.start();
  await sock.next("session.start");
  sock.push({ ...created(1), device_id: "dev_1" });
  await starting;
  return { gw, conv, sock };
}

const goingAway = (time_left = 1) => ({ type: "session.going_away", reason: "max_socket_age", time_left });
const resumed = (fields = {}) => ({ type: "session.resumed", session_id: "sess_1", replayed_from: 1, last_seq: 1, ...fields });
const FUNCTIONS_A = [{ name: "device_a", description: "Device a.", input_schema: { type: "object", properties: {} } }];

test("a reconnect resumes as this device: device_id and the functions registered now", async () => {
  const { gw, conv, sock } = await startedAsDevice();
  assert.equal(conv.deviceId, "dev_1");
  conv.clientFunction("device_b", () => null, { description: "Device b." });
  await sock.next("session.update");
  sock.drop(1006);
  const sock2 = await gw.socket(1);
  assert.deepEqual(await sock2.next("session.resume"), {
    type: "session.resume",
    session_id: "sess_1",
    resume_token: "tok_1",
    last_seq: 1,
    device_id: "dev_1",
    client_functions: [...FUNCTIONS_A, { name: "device_b", description: "Device b.", input_schema: { type: "object", properties: {} } }],
  });
  // a session.resumed naming another id: that one from now on
  sock2.push(resumed({ device_id: "dev_9" }));
  assert.equal(conv.deviceId, "dev_9");
  sock2.drop(1006);
  const sock3 = await gw.socket(2);
  assert.equal((await sock3.next("session.resume")).device_id, "dev_9");
  await conv.close();
});

test("going_away: an early resume on a second socket, then the switch; every event once, none lost", async () => {
  const { gw, conv, sock } = await startedAsDevice();
  const seen = [];
  conv.on("*", (e) => seen.push(e.seq ? e.seq : e.type));
  const states = [];
  conv.on("connection", (e) => states.push(e.state));
  sock.push({ type: "pong", seq: 2 }, { type: "pong", seq: 3 }, { type: "pong", seq: 4 }, { type: "pong", seq: 5 });
  const unanswered = await conv.post("still unanswered");
  await sock.next("user.message");

  sock.push(goingAway(1.0));
  const sock2 = await gw.socket(1);
  assert.equal(sock2.url, `${URL}?session=sess_1`);
  assert.deepEqual(await sock2.next("session.resume"), {
    type: "session.resume",
    session_id: "sess_1",
    resume_token: "tok_1",
    last_seq: 5,
    device_id: "dev_1",
    client_functions: FUNCTIONS_A,
  });
  // Until the gateway answers, the first socket serves: its events, and what the app sends.
  sock.push({ type: "pong", seq: 6 });
  await conv.cancel("resp_x");
  assert.equal((await sock.next("response.cancel")).response_id, "resp_x");
  assert.equal(sock.closedByClient, null);

  sock2.push(resumed({ replayed_from: 6, last_seq: 7, device_id: "dev_1" }), { type: "pong", seq: 6 }, { type: "pong", seq: 7 });
  // The switch: the first socket is closed with 4000 (never 1000: that ends the session).
  assert.deepEqual(sock.closedByClient, { code: 4000, reason: "moved" });
  sock.push({ type: "pong", seq: 8 }); // late frames of the old socket are ignored...
  sock.drop(4009, "taken_over"); // ...and so is its close, "final" code or not
  await flush();
  assert.deepEqual(seen, [2, 3, 4, 5, "session.going_away", 6, "session.resumed", 7]);
  assert.equal(conv.lastSeq, 7);
  assert.equal(conv.state, "open");
  assert.equal(conv.reconnects, 1);
  assert.deepEqual(states, []); // the conversation never lost its socket
  // the outbox goes again on the new socket, as after any resume
  assert.equal((await sock2.next("user.message")).id, unanswered);
  // and the new socket is the conversation's now
  await conv.cancel("resp_y");
  assert.equal((await sock2.next("response.cancel")).response_id, "resp_y");
  assert.deepEqual(sock.unread, []);
  await conv.close();
  assert.deepEqual(sock2.closedByClient, { code: 1000, reason: "" });
});

test("going_away: the old socket's close before the early resume's answer is not final", async () => {
  const { gw, conv, sock } = await startedAsDevice();
  sock.push(goingAway(0));
  const sock2 = await gw.socket(1);
  await sock2.next("session.resume");
  sock.drop(4009, "taken_over"); // the gateway replaced it; the answer is still on its way
  await flush();
  assert.equal(conv.state, "open");
  assert.equal(gw.attempts.length, 2); // no reconnect loop besides the early resume
  sock2.push(resumed({ device_id: "dev_1" }), { type: "pong", seq: 2 });
  assert.equal(conv.lastSeq, 2);
  await conv.cancel();
  await sock2.next("response.cancel");
  await conv.close();
});

test("going_away: an early resume refused, even with 4004, keeps the old socket; its close then reconnects", async () => {
  const { gw, conv, sock } = await startedAsDevice();
  sock.push(goingAway(0), goingAway(0)); // at most one early resume at a time; time_left 0: one attempt
  const sock2 = await gw.socket(1);
  await sock2.next("session.resume");
  await flush();
  assert.equal(gw.attempts.length, 2);
  sock2.drop(4004, "unknown_session");
  await flush();
  assert.equal(conv.state, "open");
  sock.push({ type: "pong", seq: 2 });
  assert.equal(conv.lastSeq, 2);
  await conv.cancel("resp_1");
  assert.equal((await sock.next("response.cancel")).response_id, "resp_1");

  // then the old socket closes: the normal reconnect loop resumes, as this device
  sock.drop(1001, "going away");
  const sock3 = await gw.socket(2);
  const resume = await sock3.next("session.resume");
  assert.equal(resume.device_id, "dev_1");
  assert.equal(resume.last_seq, 2);
  sock3.push(resumed({ last_seq: 2 }));
  assert.equal(conv.state, "open");
  assert.equal(conv.reconnects, 1);
  await conv.close();
});

test("going_away: an early resume with no answer in attemptTimeout is dropped with 4000; the old socket serves on", async () => {
  const { gw, conv, sock } = await startedAsDevice({ attemptTimeout: 30 });
  sock.push(goingAway(0));
  const sock2 = await gw.socket(1);
  await sock2.next("session.resume"); // never answered
  await waitFor(() => sock2.closedByClient !== null);
  assert.equal(sock2.closedByClient.code, 4000);
  await flush();
  assert.equal(conv.state, "open");
  assert.equal(sock.closedByClient, null);
  // a later going_away tries again
  sock.push(goingAway());
  const sock3 = await gw.socket(2);
  await sock3.next("session.resume");
  sock3.push(resumed());
  assert.equal(sock.closedByClient.code, 4000);
  await conv.close();
});

test("going_away: an early resume refused twice (1012) tries again with backoff and switches within time_left", async () => {
  const { gw, conv, sock } = await startedAsDevice();
  const states = [];
  conv.on("connection", (e) => states.push(e.state));
  const noticeAt = performance.now();
  sock.push(goingAway(2));
  // A node going away accepts the socket, then closes it with 1012 (a load balancer sent it there).
  for (const n of [1, 2]) {
    const refused = await gw.socket(n);
    assert.equal((await refused.next("session.resume")).device_id, "dev_1");
    refused.drop(1012, "service restart");
    await flush();
    assert.equal(conv.state, "open");
    assert.equal(sock.closedByClient, null); // the old socket serves on meanwhile
  }
  const sock4 = await gw.socket(3);
  assert.equal(sock4.url, `${URL}?session=sess_1`);
  await sock4.next("session.resume");
  sock4.push(resumed({ device_id: "dev_1" }), { type: "pong", seq: 2 });
  assert.ok(performance.now() - noticeAt < 2000, "switched within time_left");
  assert.deepEqual(sock.closedByClient, { code: 4000, reason: "moved" });
  assert.equal(conv.lastSeq, 2);
  assert.equal(conv.reconnects, 1);
  assert.deepEqual(states, []); // never without a socket
  assert.equal(gw.attempts.length, 4);
  await conv.close();
});

test("going_away: a user message sent during the early resume goes out only on the new socket; tool results at once on the old", async () => {
  const { gw, conv, sock } = await startedAsDevice();
  sock.push(goingAway(1));
  const sock2 = await gw.socket(1);
  await sock2.next("session.resume");
  const held = await conv.post("during the move");
  // a tool result is not held: it goes on the old socket at once
  sock.push({ type: "tool.calls", response_id: "r", calls: [call("call_1", "device_a")], seq: 2 });
  assert.deepEqual((await sock.next("tool.results")).results, [{ call_id: "call_1", tool: "device_a", output: { value: "a" } }]);
  await flush();
  assert.deepEqual(sock.unread, []); // the user message is not on the old socket
  sock2.push(resumed({ last_seq: 2, device_id: "dev_1" }));
  assert.deepEqual(sock.closedByClient, { code: 4000, reason: "moved" });
  // the outbox goes out on the new socket: the unconfirmed result, then the held message
  assert.equal((await sock2.next("tool.results")).results[0].call_id, "call_1");
  assert.equal((await sock2.next("user.message")).id, held);
  // after the switch a user message goes at once, on the new socket
  const after = await conv.post("after the move");
  assert.equal((await sock2.next("user.message")).id, after);
  assert.equal(sock.sent.filter((m) => m.type === "user.message").length, 0);
  await conv.close();
});

test("going_away: time_left 0 makes one attempt; when it fails the held user message goes on the old socket", async (t) => {
  const { gw, conv, sock } = await startedAsDevice();
  t.mock.method(Math, "random", () => 0); // a wait of 0 still may not pass time_left
  sock.push(goingAway(0));
  const sock2 = await gw.socket(1);
  await sock2.next("session.resume");
  const held = await conv.post("during the move");
  await flush();
  assert.deepEqual(sock.unread, []);
  sock2.drop(1012, "service restart");
  // the early resume is over (its last act is this re-send): one attempt only
  assert.equal((await sock.next("user.message")).id, held);
  assert.equal(gw.attempts.length, 2);
  assert.equal(conv.state, "open");
  assert.equal(sock.closedByClient, null);
  // not held any more: the next goes at once
  const next = await conv.post("after the failed move");
  assert.equal((await sock.next("user.message")).id, next);
  assert.deepEqual(sock2.unread, []);
  await conv.close();
});

test("going_away: close() during the wait between early attempts ends it there: no further attempt", async (t) => {
  const requests = fakeFetch(t);
  const { gw, conv, sock } = await startedAsDevice();
  t.mock.method(Math, "random", () => 0.999); // the wait before the second attempt: ~50 ms
  sock.push(goingAway(5));
  const sock2 = await gw.socket(1);
  await sock2.next("session.resume");
  sock2.drop(1012, "service restart");
  await flush();
  await conv.close();
  assert.deepEqual(sock.closedByClient, { code: 1000, reason: "" }); // still the session's socket
  assert.deepEqual(requests, []);
  // Past the end of that wait (a timer of ~50 ms), no socket was dialed.
  await new Promise((resolve) => setTimeout(resolve, 150));
  assert.equal(gw.attempts.length, 2);
});

test("join: session.attach instead of session.start; session.attached starts it, the replay follows", async () => {
  const gw = new FakeGateway();
  const conv = new GatewayClient(URL, { WebSocketImpl: gw.WebSocket, join: { sessionId: "sess_1", resumeToken: "tok_1" }, agent: "ignored" });
  const runs = [];
  conv.clientFunction("device_a", (args, { call: c }) => {
    runs.push(c.call_id);
    return { value: "a" };
  }, { description: "Device a." });
  const seen = [];
  conv.on("*", (e) => seen.push(e.seq ? `${e.type}:${e.seq}` : e.type));
  const starting = conv.start();
  const sock = await gw.socket(0);
  assert.equal(sock.url, `${URL}?session=sess_1`); // named, as a resume's: routed to its node
  assert.deepEqual(await sock.next("session.attach"), {
    type: "session.attach",
    session_id: "sess_1",
    resume_token: "tok_1",
    last_seq: 0,
    client_functions: FUNCTIONS_A,
  });
  sock.push({
    type: "session.attached",
    session_id: "sess_1",
    device_id: "dev_2",
    replayed_from: 1,
    last_seq: 3,
    agent: "demo",
    open_calls: [call("call_1", "device_a")],
    devices: 2,
  });
  const session = await starting;
  assert.deepEqual(session, { session_id: "sess_1", resume_token: "tok_1", device_id: "dev_2", agent: "demo" });
  assert.equal(conv.deviceId, "dev_2");
  assert.equal(conv.agent, "demo");
  sock.push({ ...created(1), device_id: "dev_1" }, { type: "pong", seq: 2 }, { type: "tool.calls", response_id: "r", calls: [call("call_1", "device_a")], seq: 3 });
  assert.deepEqual((await sock.next("tool.results")).results, [{ call_id: "call_1", tool: "device_a", output: { value: "a" } }]);
  assert.deepEqual(seen, ["session.attached", "session.created:1", "pong:2", "tool.calls:3"]);
  assert.deepEqual(runs, ["call_1"]); // once, though open_calls and the replay both had it
  assert.equal(conv.session.device_id, "dev_2"); // the replayed session.created is the starter's
  assert.equal(conv.deviceId, "dev_2");

  // a drop: the resume is this device's, with its functions
  sock.drop(1006);
  const sock2 = await gw.socket(1);
  assert.deepEqual(await sock2.next("session.resume"), {
    type: "session.resume",
    session_id: "sess_1",
    resume_token: "tok_1",
    last_seq: 3,
    device_id: "dev_2",
    client_functions: FUNCTIONS_A,
  });
  await conv.close();
});

test("join: a gap answers with resume_gap and session.snapshot; a refusal rejects start()", async () => {
  const gw = new FakeGateway();
  const conv = new GatewayClient(URL, { WebSocketImpl: gw.WebSocket, join: { sessionId: "sess_1", resumeToken: "tok_1" } });
  const starting = conv.start();
  const sock = await gw.socket(0);
  await sock.next("session.attach");
  sock.push(
    { type: "error", code: "resume_gap", message: "events after seq 0 are gone" },
    { type: "session.snapshot", session_id: "sess_1", last_seq: 40, agent: "demo", transcript: [{ role: "user", text: "hi" }] },
  );
  const session = await starting;
  assert.equal(session.session_id, "sess_1");
  assert.equal(conv.lastSeq, 40);
  sock.push({ type: "pong", seq: 40 }, { type: "pong", seq: 41 });
  assert.equal(conv.lastSeq, 41);
  await conv.close();

  const gw2 = new FakeGateway();
  const refused = new GatewayClient(URL, { WebSocketImpl: gw2.WebSocket, join: { sessionId: "sess_x", resumeToken: "nope" } });
  const joining = refused.start();
  const sock2 = await gw2.socket(0);
  await sock2.next("session.attach");
  sock2.drop(4004, "unknown_session");
  await assert.rejects(joining, (err) => err instanceof SessionClosed && err.closedWith === 4004);
  assert.equal(gw2.attempts.length, 1);

  assert.throws(() => new GatewayClient(URL, { WebSocketImpl: gw.WebSocket, join: { sessionId: "s" } }), ClientError);
});

test("join: close() with no socket attached sends no DELETE (it would end the session for every device)", async (t) => {
  const requests = fakeFetch(t);
  t.mock.method(Math, "random", () => 0.999);
  const joined = async () => {
    const gw = new FakeGateway();
    const conv = new GatewayClient(URL, { WebSocketImpl: gw.WebSocket, join: { sessionId: "sess_1", resumeToken: "tok_1" }, maxReconnectDelay: 10_000 });
    const starting = conv.start();
    const sock = await gw.socket(0);
    await sock.next("session.attach");
    sock.push({ type: "session.attached", session_id: "sess_1", device_id: "dev_2", replayed_from: 1, last_seq: 0, agent: "demo", open_calls: [], devices: 2 });
    await starting;
    return { gw, conv, sock };
  };
  // between attempts
  const one = await joined();
  const states = [];
  one.conv.on("connection", (e) => states.push(e.state));
  one.gw.refuse = 1;
  one.sock.drop(1006);
  await one.gw.until(() => one.gw.attempts.length === 2); // refused: the loop waits ~50 ms
  await flush();
  await one.conv.close();
  assert.deepEqual(states, ["reconnecting", "closed"]);
  assert.equal(one.gw.attempts.length, 2);

  // during an attempt: dropped with 4000, and still no DELETE
  const two = await joined();
  two.gw.plan = ["hang"];
  two.sock.drop(1006);
  await two.gw.until(() => two.gw.attempts.length === 2);
  await two.conv.close();
  assert.equal(two.gw.attempts[1].closedByClient.code, 4000);
  assert.deepEqual(requests, []);

  // with its socket attached it closes it with 1000 (the gateway: this device leaves)
  const three = await joined();
  await three.conv.close();
  assert.deepEqual(three.sock.closedByClient, { code: 1000, reason: "" });
  assert.deepEqual(requests, []);
});

test("a tool.status ending a call this device still runs stops it and sends nothing", async () => {
  const { conv, sock } = await startedAsDevice();
  const signals = new Map();
  const release = new Map();
  conv.clientFunction("slow", (args, { signal, call: c }) => {
    signals.set(c.call_id, signal);
    return new Promise((resolve) => release.set(c.call_id, resolve));
  });
  await sock.next("session.update");
  sock.push({ type: "tool.calls", response_id: "r", calls: [call("c_other", "slow"), call("c_mine", "slow"), call("c_gone", "slow")], seq: 2 });
  await waitFor(() => signals.size === 3);
  // another device answered first; one was cancelled; a progress status ends nothing
  sock.push(
    { type: "tool.status", call_id: "c_other", tool: "slow", status: "completed", seq: 3 },
    { type: "tool.status", call_id: "c_gone", tool: "slow", status: "cancelled", seq: 4 },
    { type: "tool.status", call_id: "c_mine", tool: "slow", status: "progress", progress: 0.5, seq: 5 },
  );
  await flush();
  assert.equal(signals.get("c_other").aborted, true);
  assert.match(signals.get("c_other").reason.message, /completed/);
  assert.equal(signals.get("c_gone").aborted, true);
  assert.equal(signals.get("c_mine").aborted, false);
  release.get("c_other")({ late: true }); // a handler that ignores its signal: still nothing sent
  release.get("c_mine")({ mine: true });
  assert.deepEqual((await sock.next("tool.results")).results, [{ call_id: "c_mine", tool: "slow", output: { mine: true } }]);
  await flush();
  assert.deepEqual(sock.unread, []);
  await conv.close();
});

/** Resolves once `ready()` holds (polled on each macrotask). */
async function waitFor(ready) {
  while (!ready()) await flush();
}
