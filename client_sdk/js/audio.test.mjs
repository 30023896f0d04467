// The voice pieces of the browser SDK (audio.js and the client's audio hooks), in Node with a
// fake WebSocket and a fake AudioContext: run with `node --test client_sdk/js`.
import assert from "node:assert/strict";
import { test as nodeTest } from "node:test";

import {
  AudioPlayer,
  GatewayClient,
  MicrophoneCapture,
  StreamResampler,
  attachAudio,
  floatTo16,
  int16ToFloat,
  parseAudioFrame,
  rms,
} from "./gateway-client.js";
import { PLAYBACK_PROCESSOR, PlaybackQueue } from "./audio-worklets.js";

const test = (name, fn) => nodeTest(name, { timeout: 3000 }, fn);

/**
 * A binary frame as the spec lays it out (big-endian header, PCM16 LE); `extra` bytes of an
 * unknown header field go between the id and the PCM.
 */
function frame({ responseId = "resp_1", seq = 7, offsetMs = 0, last = false, pcm = [], extra = 0, kind = 1 }) {
  const header = 13 + responseId.length + extra;
  const bytes = new Uint8Array(header + 2 * pcm.length);
  const view = new DataView(bytes.buffer);
  view.setUint8(0, kind);
  view.setUint8(1, last ? 1 : 0);
  view.setUint16(2, header);
  view.setUint32(4, seq);
  view.setUint32(8, offsetMs);
  view.setUint8(12, responseId.length);
  for (let i = 0; i < responseId.length; i += 1) view.setUint8(13 + i, responseId.charCodeAt(i));
  for (let i = 0; i < extra; i += 1) view.setUint8(13 + responseId.length + i, 0xee);
  pcm.forEach((s, i) => view.setInt16(header + 2 * i, s, true));
  return bytes.buffer;
}

// ----------------------------------------------------------------------- frames and samples

test("parseAudioFrame reads the header big-endian and the PCM little-endian from byte H", () => {
  const parsed = parseAudioFrame(frame({ responseId: "resp_abc", seq: 70000, offsetMs: 1234, last: true, pcm: [1, -2, 32767, -32768] }));
  assert.equal(parsed.responseId, "resp_abc");
  assert.equal(parsed.seq, 70000);
  assert.equal(parsed.offsetMs, 1234);
  assert.equal(parsed.last, true);
  assert.deepEqual([...parsed.pcm], [1, -2, 32767, -32768]);
  assert.ok(parsed.pcm instanceof Int16Array);
});

test("parseAudioFrame skips header fields it does not know (H says where the PCM starts), odd H included", () => {
  const parsed = parseAudioFrame(frame({ responseId: "r", pcm: [5, -5], extra: 3 })); // H = 17
  assert.equal(parsed.last, false);
  assert.deepEqual([...parsed.pcm], [5, -5]);
});

test("parseAudioFrame takes a view into a larger buffer, and refuses other kinds and short frames", () => {
  const raw = new Uint8Array(frame({ pcm: [9] }));
  const padded = new Uint8Array(raw.length + 4);
  padded.set(raw, 3);
  assert.deepEqual([...parseAudioFrame(padded.subarray(3, 3 + raw.length)).pcm], [9]);
  assert.equal(parseAudioFrame(frame({ kind: 2, pcm: [1] })), null);
  assert.equal(parseAudioFrame(new ArrayBuffer(5)), null);
  const lying = new Uint8Array(frame({ pcm: [] }));
  new DataView(lying.buffer).setUint16(2, 200); // H beyond the frame
  assert.equal(parseAudioFrame(lying.buffer), null);
  assert.equal(parseAudioFrame("text"), null);
});

test("floatTo16 scales to the full range and clips; int16ToFloat goes back", () => {
  assert.deepEqual([...floatTo16(new Float32Array([0, 1, -1, 0.5, 2, -3]))], [0, 32767, -32768, 16384, 32767, -32768]);
  const back = int16ToFloat(new Int16Array([0, 16384, -32768]));
  assert.deepEqual([...back], [0, 0.5, -1]);
});

test("rms is 0 for silence, the amplitude for a square wave, and at most 1", () => {
  assert.equal(rms(new Float32Array(10)), 0);
  assert.equal(rms([]), 0);
  assert.ok(Math.abs(rms(Float32Array.from({ length: 100 }, (_, i) => (i % 2 ? 0.25 : -0.25))) - 0.25) < 1e-6);
  assert.equal(rms([4, -4]), 1);
});

test("StreamResampler: the same rate passes samples through", () => {
  const r = new StreamResampler(16000, 16000);
  assert.deepEqual([...r.push([0.1, 0.2, 0.3])], [0.1, 0.2, 0.3].map(Math.fround));
  assert.deepEqual([...r.push([0.4])], [Math.fround(0.4)]);
});

test("StreamResampler interpolates linearly when upsampling (24 kHz to 48 kHz)", () => {
  const r = new StreamResampler(24000, 48000);
  const out = [...r.push([0, 1, 0.5])];
  // previous sample 0 (start), then 0, 1, 0.5 with midpoints; the last midpoint needs the next chunk
  assert.deepEqual(out, [0, 0.5, 1, 0.75, 0.5]);
  assert.deepEqual([...r.push([0.5])], [0.5, 0.5]);
});

test("StreamResampler gives the same samples however the input is chunked (48 kHz to 16 kHz)", () => {
  const input = Float32Array.from({ length: 4800 }, (_, i) => Math.sin(i / 7));
  const whole = new StreamResampler(48000, 16000).push(input);
  assert.equal(whole.length, 1600);
  const chunked = new StreamResampler(48000, 16000);
  const parts = [];
  let at = 0;
  for (const size of [1, 127, 128, 333, 960, 7, 2000]) {
    parts.push(...chunked.push(input.subarray(at, at + size)));
    at += size;
  }
  parts.push(...chunked.push(input.subarray(at)));
  assert.equal(parts.length, whole.length);
  parts.forEach((s, i) => assert.ok(Math.abs(s - whole[i]) < 1e-6, `sample ${i}`));
  assert.ok(Math.abs(whole[100] - input[300]) < 1e-6); // every third sample
});

test("StreamResampler keeps the rate over a long stream at an uneven ratio (44.1 kHz to 16 kHz)", () => {
  const r = new StreamResampler(44100, 16000);
  let total = 0;
  for (let i = 0; i < 100; i += 1) total += r.push(new Float32Array(441)).length;
  assert.ok(Math.abs(total - 16000) <= 1, `${total} samples for one second`);
});

// ----------------------------------------------------------------------- the microphone

/**
 * The processors audio-worklets.js registers in a worklet's scope: a second instance of the
 * module, imported while fake `registerProcessor` and `AudioWorkletProcessor` globals exist.
 * The fake base gives each processor a port whose postMessage transfers as the browser's
 * does (the sender's buffer is detached) and records what it posted.
 */
let registered = null;
function workletProcessors() {
  registered ??= (async () => {
    const found = {};
    globalThis.AudioWorkletProcessor = class {
      constructor() {
        this.port = { posted: [], onmessage: null, postMessage: (m, transfer) => this.port.posted.push(structuredClone(m, { transfer })) };
      }
    };
    globalThis.registerProcessor = (name, cls) => (found[name] = cls);
    try {
      await import("./audio-worklets.js?as-a-worklet"); // a second instance, in "worklet scope"
    } finally {
      delete globalThis.AudioWorkletProcessor;
      delete globalThis.registerProcessor;
    }
    return found;
  })();
  return registered;
}

test("the capture worklet posts chunks of the size asked, each in a buffer of its own (transferred)", async () => {
  const Processor = (await workletProcessors())["gateway-capture"];
  const processor = new Processor({ processorOptions: { chunk: 200 } });
  for (let i = 0; i < 5; i += 1) assert.equal(processor.process([[new Float32Array(128).fill(i)]]), true);
  const posted = processor.port.posted;
  assert.equal(posted.length, 3, "640 samples: three chunks of 200");
  assert.ok(posted.every((chunk) => chunk.length === 200));
  assert.deepEqual([posted[0][127], posted[0][128], posted[2][199]], [0, 1, 4]);
  processor.port.onmessage({ data: "stop" });
  assert.equal(processor.process([[new Float32Array(128)]]), false);
});

/** A client that records what MicrophoneCapture sends. */
function recorder({ open = true } = {}) {
  return {
    frames: [],
    commits: 0,
    open,
    sendAudio(pcm) {
      if (!this.open) return false;
      this.frames.push(pcm);
      return true;
    },
    commitAudio() {
      this.commits += 1;
      return "cmt_1";
    },
  };
}

test("MicrophoneCapture sends PCM16 frames of frameMs at the input rate", () => {
  const client = recorder();
  const mic = new MicrophoneCapture(client, { inputRate: 16000, frameMs: 20 });
  assert.equal(mic.frameSamples, 320);
  mic.pushSamples(new Float32Array(700).fill(0.5));
  assert.equal(client.frames.length, 2);
  assert.ok(client.frames.every((f) => f instanceof Int16Array && f.length === 320 && f[0] === 16384));
  assert.equal(mic.framesSent, 2);
  const longer = new MicrophoneCapture(recorder(), { inputRate: 24000, frameMs: 100 });
  assert.equal(longer.frameSamples, 960, "40 ms at most");
});

test("push-to-talk: release sends what is queued (padded to 20 ms), then input_audio.commit in manual mode only", () => {
  const client = recorder();
  const mic = new MicrophoneCapture(client, { inputRate: 16000, turnDetection: "manual" });
  mic.pushSamples(new Float32Array(100).fill(0.25));
  assert.equal(client.frames.length, 0);
  assert.equal(mic.release(), true);
  assert.equal(client.frames.length, 1);
  assert.equal(client.frames[0].length, 320);
  assert.equal(client.frames[0][99], 8192);
  assert.equal(client.frames[0][100], 0);
  assert.equal(client.commits, 1);
  assert.equal(mic.sending, false);
  const vad = recorder();
  assert.equal(new MicrophoneCapture(vad, { turnDetection: "server_vad" }).release(), false);
  assert.equal(vad.commits, 0);
});

test("MicrophoneCapture does not count frames the client dropped (disconnected)", () => {
  const client = recorder({ open: false });
  const mic = new MicrophoneCapture(client, {});
  mic.pushSamples(new Float32Array(640));
  assert.equal(mic.framesSent, 0);
});

// ----------------------------------------------------------------------- the player

/** One fake render quantum (128 samples) through a queue: what it output. */
function renderQuantum(queue) {
  const out = new Float32Array(128).fill(NaN);
  queue.render(out);
  return out;
}

/** `n` samples valued from, from + 1, ... (exact in Float32): where each came from shows. */
const ramp = (n, from = 0) => Float32Array.from({ length: n }, (_, i) => from + i);
const samples = (id, values) => ({ type: "samples", id, samples: values });

test("PlaybackQueue plays the responses in the order their samples came, then silence", () => {
  const reports = [];
  const queue = new PlaybackQueue((r) => reports.push(r), { reportEvery: 100000 });
  queue.receive(samples("r1", ramp(100, 1)));
  queue.receive(samples("r2", ramp(50, 1001)));
  queue.receive(samples("r1", ramp(30, 101))); // r1's later samples come after r2's
  const a = renderQuantum(queue);
  const b = renderQuantum(queue);
  assert.deepEqual([...a], [...ramp(100, 1), ...ramp(28, 1001)]);
  assert.deepEqual([...b.subarray(0, 52)], [...ramp(22, 1029), ...ramp(30, 101)]);
  assert.ok(b.subarray(52).every((x) => x === 0), "silence after the queue");
  assert.ok(renderQuantum(queue).every((x) => x === 0), "silence when empty");
  assert.deepEqual(reports, [
    { played: { r1: 100, r2: 28 }, drained: [], flushed: [] }, // both started: at once
    { played: { r1: 130, r2: 50 }, drained: ["r2", "r1"], flushed: [] }, // both ran out: at once
  ]);
});

test("PlaybackQueue splits a chunk across quanta and reports every reportEvery samples while playing", () => {
  const reports = [];
  const queue = new PlaybackQueue((r) => reports.push(r), { reportEvery: 256 });
  queue.receive(samples("r1", ramp(700, 1)));
  const played = Array.from({ length: 7 }, () => [...renderQuantum(queue)]).flat();
  assert.deepEqual(played.slice(0, 700), [...ramp(700, 1)]);
  assert.ok(played.slice(700).every((x) => x === 0));
  assert.deepEqual(
    reports.map((r) => [r.played.r1, r.drained]),
    [[128, []], [384, []], [640, []], [700, ["r1"]]],
    "started, every 256 samples, ran out; nothing while silent",
  );
  assert.equal(queue.queued, 0);
});

test("PlaybackQueue flush drops only that response at once, reports where it stopped, and drops its late samples", () => {
  const reports = [];
  const queue = new PlaybackQueue((r) => reports.push(r), { reportEvery: 100000 });
  queue.receive(samples("r1", ramp(200, 1)));
  queue.receive(samples("r2", ramp(100, 1001)));
  queue.receive(samples("r1", ramp(100, 201)));
  renderQuantum(queue);
  queue.receive({ type: "flush", id: "r1" });
  assert.deepEqual(reports.at(-1), { played: { r1: 128 }, drained: [], flushed: ["r1"] });
  queue.receive(samples("r1", ramp(50, 9000))); // a late frame of the flushed response
  assert.equal(queue.queued, 100, "only r2 is left");
  const out = renderQuantum(queue);
  assert.deepEqual([...out.subarray(0, 100)], [...ramp(100, 1001)]);
  assert.ok(out.subarray(100).every((x) => x === 0));
  assert.deepEqual(reports.at(-1), { played: { r2: 100 }, drained: ["r2"], flushed: [] });
  queue.receive({ type: "flush", id: "r3" }); // nothing of it queued: still confirmed
  assert.deepEqual(reports.at(-1), { played: { r3: 0 }, drained: [], flushed: ["r3"] });
});

test("the playback processor renders the queue on every channel of its output and posts its reports", async () => {
  const Processor = (await workletProcessors())[PLAYBACK_PROCESSOR];
  const processor = new Processor({ processorOptions: { reportEvery: 128 } });
  processor.port.onmessage({ data: samples("r1", ramp(200, 1)) });
  const channels = [new Float32Array(128), new Float32Array(128)];
  assert.equal(processor.process([], [channels]), true);
  assert.deepEqual([...channels[0]], [...ramp(128, 1)]);
  assert.deepEqual([...channels[1]], [...ramp(128, 1)]);
  assert.deepEqual(processor.port.posted, [{ played: { r1: 128 }, drained: [], flushed: [] }]);
  processor.port.onmessage({ data: "stop" });
  assert.equal(processor.process([], [channels]), false);
});

const processors = await workletProcessors();

/** An AudioContext whose worklet renders when the test says so (`render`), 128 samples a quantum. */
class FakeContext {
  constructor(sampleRate = 48000) {
    this.sampleRate = sampleRate;
    this.currentTime = 0;
    this.state = "running";
    this.destination = {};
    this.nodes = [];
    this.modules = [];
    this.audioWorklet = { addModule: async (url) => void this.modules.push(url) };
  }

  async resume() {
    this.state = "running";
  }

  async close() {
    this.state = "closed";
  }

  /** Render `count` quanta through every node, then deliver what their processors posted. */
  render(count) {
    for (let i = 0; i < count; i += 1) {
      for (const node of this.nodes) node.process();
      this.currentTime += 128 / this.sampleRate;
    }
    for (const node of this.nodes) node.deliver();
  }
}

/**
 * An AudioWorkletNode stand-in that runs the real processor (registered in the fake worklet
 * scope); the page's messages reach it at once, its own reach the page when the context says.
 */
class FakeWorkletNode {
  constructor(context, name, options) {
    this.options = options;
    this.processor = new processors[name](options);
    this.output = [];
    this.connected = null;
    this.port = {
      onmessage: null,
      postMessage: (m, transfer) => this.processor.port.onmessage({ data: structuredClone(m, { transfer }) }),
    };
    context.nodes.push(this);
  }

  connect(destination) {
    this.connected = destination;
    return destination;
  }

  disconnect() {
    this.connected = null;
  }

  process() {
    const out = new Float32Array(128);
    this.running = this.processor.process([], [[out]]);
    this.output.push(out);
  }

  deliver() {
    for (const data of this.processor.port.posted.splice(0)) this.port.onmessage?.({ data });
  }

  /** The samples it played, every quantum joined. */
  played() {
    return this.output.flatMap((o) => [...o]);
  }

  /** Whether its last `count` quanta were silent. */
  silent(count) {
    return this.output.slice(-count).every((o) => o.every((x) => x === 0));
  }
}

const pcmMs = (ms, rate = 24000) => new Int16Array((rate * ms) / 1000).fill(1000);
const quanta = (ms, rate = 48000) => Math.round((ms * rate) / 1000 / 128);
const fakePlayer = (options = {}) => new AudioPlayer({ context: new FakeContext(), AudioWorkletNodeImpl: FakeWorkletNode, ...options });

test("AudioPlayer plays a response's frames through the worklet, back to back, and tracks what was heard", async () => {
  const starts = [];
  const player = fakePlayer({ outputRate: 24000, onStart: (e) => starts.push(e) });
  const context = player.context;
  player.enqueue({ responseId: "r1", pcm: pcmMs(100) }); // before the worklet loaded: kept for it
  player.enqueue({ responseId: "r1", pcm: pcmMs(100) });
  assert.equal(player.frames, 2);
  assert.equal(player.scheduledMs, 200);
  await player.resume();
  assert.equal(context.modules.length, 1, "the module is loaded once");
  assert.ok(context.modules[0].endsWith("/audio-worklets.js"));
  const [node] = context.nodes;
  assert.equal(node.connected, context.destination);
  assert.deepEqual(node.options.outputChannelCount, [1]);
  assert.equal(player.positionMs("r1"), 0, "nothing heard before it plays");
  assert.equal(starts.length, 0);
  context.render(quanta(150));
  const heard = player.positionMs("r1");
  assert.ok(heard > 125 && heard <= 150, `${heard} ms: as of the last report, at most 20 ms old`);
  assert.deepEqual(starts, [{ responseId: "r1", delayMs: 0 }]);
  context.render(quanta(100));
  // resampled to the context's 48 kHz (the last interpolated sample waits for a next frame)
  const played = node.played();
  assert.equal(played.findIndex((x) => x === 0), 9599, "no gap between the frames");
  assert.ok(played.slice(9599).every((x) => x === 0));
  assert.equal(player.positionMs("r1"), 200);
  assert.equal(player.playing, false);
  assert.equal(player.positionMs("unknown"), 0);
});

test("AudioPlayer.flush stops a response at once, keeps its position, drops its later frames, and the next moves up", async () => {
  const ends = [];
  const player = fakePlayer({ onEnd: (e) => ends.push(e) });
  await player.resume();
  const context = player.context;
  const [node] = context.nodes;
  for (let i = 0; i < 3; i += 1) player.enqueue({ responseId: "r1", pcm: pcmMs(100) });
  player.enqueue({ responseId: "r2", pcm: new Int16Array(2400).fill(-1000) });
  context.render(quanta(120));
  const heard = player.positionMs("r1");
  assert.ok(heard > 100 && heard <= 120, `${heard} ms`);
  assert.equal(player.flush("r1"), heard, "what was heard, as last reported");
  assert.deepEqual(ends, [], "onEnd waits for the processor's word");
  context.render(1);
  assert.ok(node.output.at(-1).every((x) => x < 0), "r2 plays at once, in the flushed audio's place");
  assert.deepEqual(ends, [{ responseId: "r1", playedMs: 120, interrupted: true }], "where it really stopped");
  context.render(quanta(500));
  assert.equal(player.positionMs("r1"), 120, "the position stays where it stopped");
  player.enqueue({ responseId: "r1", pcm: pcmMs(100) });
  assert.equal(player.frames, 4, "a flushed response's late frames are dropped");
  context.render(4);
  assert.ok(node.silent(4));
  assert.equal(player.flush("r1"), 120, "a second flush changes nothing");
  context.render(1);
  assert.equal(ends.length, 1);
});

test("AudioPlayer: a finished response ends once its audio played", async () => {
  const ends = [];
  const player = fakePlayer({ onEnd: (e) => ends.push(e) });
  await player.resume();
  player.enqueue({ responseId: "r1", pcm: pcmMs(100) });
  player.finish("r1");
  assert.equal(ends.length, 0);
  player.context.render(quanta(100));
  assert.deepEqual(ends, [{ responseId: "r1", playedMs: 100, interrupted: false }]);
  player.finish("r0"); // audio.done of a response with no audio
  assert.deepEqual(ends[1], { responseId: "r0", playedMs: 0, interrupted: false });
  player.enqueue({ responseId: "r2", pcm: pcmMs(40) });
  player.context.render(quanta(100)); // it ran out before audio.done came
  assert.equal(ends.length, 2);
  player.finish("r2");
  assert.deepEqual(ends[2], { responseId: "r2", playedMs: 40, interrupted: false });
});

test("AudioPlayer: one response's end comes before the next one's start, as they played", async () => {
  const events = [];
  const player = fakePlayer({
    onStart: (e) => events.push(["start", e.responseId]),
    onEnd: (e) => events.push(["end", e.responseId, e.playedMs]),
  });
  await player.resume();
  player.enqueue({ responseId: "r1", pcm: new Int16Array(1000).fill(1) }); // ends mid-quantum
  player.finish("r1");
  player.enqueue({ responseId: "r2", pcm: pcmMs(100) });
  player.context.render(quanta(50));
  assert.deepEqual(events, [["start", "r1"], ["end", "r1", 42], ["start", "r2"]]);
});

test("AudioPlayer.close ends what had not ended, stops the processor, and leaves a context it was given", async () => {
  const ends = [];
  const player = fakePlayer({ onEnd: (e) => ends.push(e) });
  await player.resume();
  const context = player.context;
  const [node] = context.nodes;
  player.enqueue({ responseId: "r1", pcm: pcmMs(100) });
  context.render(quanta(20));
  await player.close();
  assert.deepEqual(ends.map((e) => [e.responseId, e.interrupted]), [["r1", true]]);
  assert.equal(node.connected, null);
  context.render(1);
  assert.equal(node.running, false, "the processor returned false: it may be collected");
  assert.equal(context.state, "running");
});

test("AudioPlayer: when the worklet cannot load, resume rejects and responses end at once", async () => {
  const ends = [];
  const context = new FakeContext();
  context.audioWorklet.addModule = async () => {
    throw new Error("no worklet here");
  };
  const player = new AudioPlayer({ context, AudioWorkletNodeImpl: FakeWorkletNode, onEnd: (e) => ends.push(e) });
  player.enqueue({ responseId: "r1", pcm: pcmMs(100) });
  await assert.rejects(player.resume(), /no worklet here/);
  player.finish("r1");
  assert.deepEqual(ends, [{ responseId: "r1", playedMs: 0, interrupted: false }]);
  assert.equal(player.flush("r2"), 0);
  assert.equal(ends.length, 2);
});

// ----------------------------------------------------------------------- the client's hooks

/** A WebSocket that opens at once and records what the client sends, text and binary. */
function fakeGateway() {
  const sockets = [];
  class Socket {
    constructor(url, protocols) {
      this.url = url;
      this.protocols = protocols;
      this.readyState = 0;
      this.sent = [];
      this.binary = [];
      sockets.push(this);
      queueMicrotask(() => {
        this.readyState = 1;
        this.onopen?.({});
      });
    }

    send(data) {
      if (this.readyState !== 1) throw new Error("not open");
      if (typeof data === "string") this.sent.push(JSON.parse(data));
      else this.binary.push(data);
    }

    close(code) {
      this.readyState = 3;
      queueMicrotask(() => this.onclose?.({ code, reason: "" }));
    }

    push(data) {
      this.onmessage?.({ data: typeof data === "string" || data instanceof ArrayBuffer ? data : JSON.stringify(data) });
    }

    /** The next text message the client sent of `type` (waits for it). */
    async message(type) {
      for (;;) {
        const found = this.sent.find((m) => m.type === type);
        if (found) return found;
        await new Promise((resolve) => setImmediate(resolve));
      }
    }
  }
  return { sockets, WebSocket: Socket };
}

const CREATED = {
  type: "session.created",
  session_id: "sess_1",
  resume_token: "tok_1",
  agent: "test",
  protocol_version: 1,
  tools: [],
  limits: { max_message_chars: 100, max_queued_messages: 8, max_steps: 8, ws_max_size: 1 << 20, client_call_timeout: 30 },
  audio: { input_rate: 16000, output_rate: 24000, voice: "joe", turn_detection: "server_vad", silence_ms: 500, interrupt_min_ms: 200 },
  seq: 1,
};

async function startedClient(options = {}) {
  const gw = fakeGateway();
  const conv = new GatewayClient("ws://gw/v1/realtime", { WebSocketImpl: gw.WebSocket, timeZone: null, ...options });
  const starting = conv.start();
  await new Promise((resolve) => setImmediate(resolve));
  const sock = gw.sockets[0];
  const start = await sock.message("session.start");
  sock.push(CREATED);
  await starting;
  return { conv, sock, start };
}

test("the audio option goes in session.start, and the socket receives binary frames as ArrayBuffers", async () => {
  const { conv, sock, start } = await startedClient({ audio: { turn_detection: "manual" } });
  assert.deepEqual(start.audio, { turn_detection: "manual" });
  assert.equal(sock.binaryType, "arraybuffer");
  assert.equal(conv.session.audio.voice, "joe");
  await conv.close();
});

test("a binary frame becomes an audio event, outside the seq-checked events", async () => {
  const { conv, sock } = await startedClient();
  const frames = [];
  const all = [];
  conv.on("audio", (f) => frames.push(f));
  conv.on("*", (e) => all.push(e));
  sock.push(frame({ responseId: "resp_9", seq: 5, offsetMs: 40, last: true, pcm: [3, -3] }));
  sock.push(frame({ kind: 9, pcm: [1] })); // not audio: ignored
  assert.equal(frames.length, 1);
  assert.deepEqual({ ...frames[0], pcm: [...frames[0].pcm] }, { responseId: "resp_9", seq: 5, offsetMs: 40, last: true, pcm: [3, -3] });
  assert.equal(conv.lastSeq, 1, "audio frames do not move the cursor");
  assert.equal(all.length, 0, "nor reach the '*' listeners");
  sock.push({ type: "pong", seq: 2 });
  assert.equal(conv.lastSeq, 2, "JSON events still flow");
  await conv.close();
});

test("sendAudio sends a binary frame while open and drops it while disconnected", async () => {
  const { conv, sock } = await startedClient();
  const pcm = new Int16Array([1, 2, 3]);
  assert.equal(conv.sendAudio(pcm), true);
  assert.equal(sock.binary.length, 1);
  assert.equal(sock.binary[0], pcm);
  sock.readyState = 3; // the socket went; the client has not heard of it yet
  assert.equal(conv.sendAudio(pcm), false);
  sock.onclose?.({ code: 1006, reason: "" });
  assert.equal(conv.sendAudio(pcm), false, "not queued for the next socket");
  await conv.close();
  assert.equal(sock.binary.length, 1);
});

test("setAudio, commitAudio and clearAudio send their messages", async () => {
  const { conv, sock } = await startedClient();
  const id = conv.setAudio({ turn_detection: "manual" });
  const update = await sock.message("session.update");
  assert.equal(update.id, id);
  assert.deepEqual(update.audio, { turn_detection: "manual" });
  const commit = conv.commitAudio();
  assert.equal((await sock.message("input_audio.commit")).id, commit);
  const clear = conv.clearAudio();
  assert.equal((await sock.message("input_audio.clear")).id, clear);
  await conv.close();
  assert.equal(conv.commitAudio(), null, "nothing is sent once closed");
});

test("before the session starts, setAudio puts audio in session.start", async () => {
  const gw = fakeGateway();
  const conv = new GatewayClient("ws://gw/v1/realtime", { WebSocketImpl: gw.WebSocket });
  assert.equal(conv.setAudio({ input_rate: 24000 }), null);
  const starting = conv.start();
  await new Promise((resolve) => setImmediate(resolve));
  const start = await gw.sockets[0].message("session.start");
  assert.deepEqual(start.audio, { input_rate: 24000 });
  gw.sockets[0].push(CREATED);
  await starting;
  await conv.close();
});

test("attachAudio plays the frames, and on audio.flush flushes and truncates at the position heard", async () => {
  const { conv, sock } = await startedClient();
  const player = fakePlayer();
  const context = player.context;
  attachAudio(conv, player);
  await player.resume();
  sock.push({ type: "response.created", response_id: "resp_1", seq: 2 });
  for (let i = 0; i < 3; i += 1) {
    const pcm = Array.from(pcmMs(100));
    sock.push(frame({ responseId: "resp_1", offsetMs: 100 * i, pcm }));
  }
  assert.equal(player.frames, 3);
  context.render(quanta(240));
  const heard = player.positionMs("resp_1");
  assert.ok(heard > 215 && heard <= 240, `${heard} ms`);
  sock.push({ type: "audio.flush", response_id: "resp_1", seq: 3 });
  const truncate = await sock.message("response.truncate");
  assert.equal(truncate.response_id, "resp_1");
  assert.equal(truncate.audio_end_ms, heard);
  assert.equal(truncate.heard_chars, undefined);
  context.render(4);
  assert.ok(context.nodes[0].silent(4), "the flushed audio stopped at once");
  await conv.close();
});
