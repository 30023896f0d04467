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

test("the capture worklet posts chunks of the size asked, each in a buffer of its own (transferred)", async () => {
  let Processor = null;
  globalThis.AudioWorkletProcessor = class {
    constructor() {
      // a port whose postMessage transfers as the browser's does: the sender's buffer is detached
      this.port = { posted: [], postMessage: (m, transfer) => this.port.posted.push(structuredClone(m, { transfer })) };
    }
  };
  globalThis.registerProcessor = (name, cls) => (Processor = name === "gateway-capture" ? cls : null);
  try {
    await import("./audio-worklets.js?as-a-worklet"); // a second instance, in "worklet scope"
  } finally {
    delete globalThis.AudioWorkletProcessor;
    delete globalThis.registerProcessor;
  }
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

/** An AudioContext with a clock the test moves, and sources that record start and stop. */
class FakeContext {
  constructor(sampleRate = 48000) {
    this.sampleRate = sampleRate;
    this.currentTime = 0;
    this.state = "running";
    this.destination = {};
    this.sources = [];
  }

  createBuffer(channels, length, sampleRate) {
    const data = new Float32Array(length);
    return { length, sampleRate, duration: length / sampleRate, getChannelData: () => data };
  }

  createBufferSource() {
    const source = {
      buffer: null,
      startedAt: null,
      stopped: false,
      onended: null,
      connect() {},
      disconnect() {},
      start(at) {
        this.startedAt = at;
      },
      stop() {
        this.stopped = true;
      },
    };
    this.sources.push(source);
    return source;
  }

  /** Move the clock; fire `onended` of the sources that finished. */
  advance(seconds) {
    this.currentTime += seconds;
    for (const s of this.sources) {
      if (!s.stopped && !s.ended && s.startedAt + s.buffer.duration <= this.currentTime + 1e-9) {
        s.ended = true;
        s.onended?.();
      }
    }
  }
}

const pcmMs = (ms, rate = 24000) => new Int16Array((rate * ms) / 1000).fill(1000);

test("AudioPlayer schedules a response's frames back to back and tracks what was heard", () => {
  const context = new FakeContext();
  const starts = [];
  const player = new AudioPlayer({ outputRate: 24000, context, onStart: (e) => starts.push(e) });
  player.enqueue({ responseId: "r1", pcm: pcmMs(100) });
  player.enqueue({ responseId: "r1", pcm: pcmMs(100) });
  assert.equal(context.sources.length, 2);
  const [a, b] = context.sources;
  // resampled to the context's 48 kHz (the last interpolated sample comes with the next frame)
  assert.equal(a.buffer.length + b.buffer.length, 9599);
  assert.ok(Math.abs(b.startedAt - (a.startedAt + a.buffer.duration)) < 1e-9, "no gap between frames");
  assert.equal(starts.length, 1);
  assert.equal(starts[0].responseId, "r1");
  assert.equal(player.positionMs("r1"), 0, "nothing heard before the first frame starts");
  context.advance(a.startedAt + 0.15);
  assert.equal(player.positionMs("r1"), 150);
  assert.equal(player.scheduledMs, 200);
  assert.equal(player.frames, 2);
  assert.equal(player.positionMs("unknown"), 0);
});

test("AudioPlayer.flush stops a response at once, keeps its position, and drops its later frames", () => {
  const context = new FakeContext();
  const ends = [];
  const player = new AudioPlayer({ context, onEnd: (e) => ends.push(e) });
  for (let i = 0; i < 3; i += 1) player.enqueue({ responseId: "r1", pcm: pcmMs(100) });
  context.advance(context.sources[0].startedAt + 0.12);
  assert.equal(player.flush("r1"), 120);
  assert.ok(context.sources.every((s) => s.stopped));
  assert.deepEqual(ends, [{ responseId: "r1", playedMs: 120, interrupted: true }]);
  context.advance(1);
  assert.equal(player.positionMs("r1"), 120, "the position stays where it stopped");
  player.enqueue({ responseId: "r1", pcm: pcmMs(100) });
  assert.equal(context.sources.length, 3, "a flushed response's late frames are dropped");
  assert.equal(player.flush("r1"), 120, "a second flush changes nothing");
  assert.equal(ends.length, 1);
  // the next response starts at once, not after the flushed audio would have ended
  player.enqueue({ responseId: "r2", pcm: pcmMs(100) });
  assert.ok(context.sources[3].startedAt < context.currentTime + 0.1);
});

test("AudioPlayer: a finished response ends once its audio played", () => {
  const context = new FakeContext();
  const ends = [];
  const player = new AudioPlayer({ context, onEnd: (e) => ends.push(e) });
  player.enqueue({ responseId: "r1", pcm: pcmMs(100) });
  player.finish("r1");
  assert.equal(ends.length, 0);
  context.advance(1);
  assert.deepEqual(ends, [{ responseId: "r1", playedMs: 100, interrupted: false }]);
  player.finish("r0"); // audio.done of a response with no audio
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
  const context = new FakeContext();
  const player = new AudioPlayer({ context });
  attachAudio(conv, player);
  sock.push({ type: "response.created", response_id: "resp_1", seq: 2 });
  for (let i = 0; i < 3; i += 1) {
    const pcm = Array.from(pcmMs(100));
    sock.push(frame({ responseId: "resp_1", offsetMs: 100 * i, pcm }));
  }
  assert.equal(player.frames, 3);
  context.advance(context.sources[0].startedAt + 0.25);
  sock.push({ type: "audio.flush", response_id: "resp_1", seq: 3 });
  const truncate = await sock.message("response.truncate");
  assert.equal(truncate.response_id, "resp_1");
  assert.equal(truncate.audio_end_ms, 250);
  assert.equal(truncate.heard_chars, undefined);
  assert.ok(context.sources.every((s) => s.stopped));
  await conv.close();
});
