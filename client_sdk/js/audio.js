/**
 * @file Voice on the gateway's socket, in the browser: the microphone sent as PCM16 binary
 * frames, the answer's audio (binary frames too) played, and barge-in. The wire protocol is
 * docs/protocol.md's "Audio" section: the session opts in with an `audio` object in
 * `session.start` or `session.update`, the client sends raw PCM16 LE mono at `input_rate`, and
 * the gateway sends each answer's audio as frames with a small header (`parseAudioFrame`),
 * PCM16 at `output_rate`.
 *
 * ```js
 * import { GatewayClient, MicrophoneCapture, AudioPlayer, attachAudio } from "./gateway-client.js";
 *
 * const conv = new GatewayClient(url, { audio: { turn_detection: "server_vad" } });
 * const player = new AudioPlayer({ outputRate: 24000 });
 * attachAudio(conv, player); // plays `audio`, flushes and truncates on `audio.flush`
 * const mic = new MicrophoneCapture(conv, { inputRate: 16000, onLevel: (rms) => meter.value = rms });
 * await mic.start(); // in a click handler: browsers start audio only after a user gesture
 * ```
 *
 * This module holds the pure pieces (`parseAudioFrame`, `floatTo16`, `int16ToFloat`,
 * `StreamResampler`, `rms`), which run anywhere. `MicrophoneCapture` (microphone.js) and
 * `AudioPlayer` with `attachAudio` (player.js) need a Web Audio `AudioContext` (the player
 * takes one as an option, which is how Node tests it with a fake one).
 * @module audio
 */

/** The `kind` byte of a binary frame holding answer audio (PCM16). */
export const AUDIO_FRAME_KIND = 0x01;
/** The fixed part of a binary frame's header, before the response id. */
const FIXED_HEADER = 13;

/**
 * A binary frame of the answer's audio, decoded.
 * @typedef {object} AudioFrame
 * @property {string} responseId The response whose audio it is (`response_id` of the JSON events).
 * @property {number} seq The `seq` of the `text.segment` event whose text this frame speaks.
 * @property {number} offsetMs Where the frame starts in the response's audio, ms.
 * @property {boolean} last The last frame of its segment.
 * @property {Int16Array} pcm PCM16 mono samples at the session's `output_rate`.
 */

/**
 * Decode a binary frame of the gateway (spec: kind, flags, header length H, seq, offset_ms,
 * the response id; the PCM from byte H on; integers big-endian, PCM little-endian).
 * @param {ArrayBuffer | ArrayBufferView} data
 * @returns {AudioFrame | null} null for a frame that is not answer audio (another kind) or is
 *   malformed (shorter than its header says); an odd last byte of PCM is ignored.
 */
export function parseAudioFrame(data) {
  const view = ArrayBuffer.isView(data)
    ? new DataView(data.buffer, data.byteOffset, data.byteLength)
    : data instanceof ArrayBuffer
      ? new DataView(data)
      : null;
  if (view === null || view.byteLength < FIXED_HEADER) return null;
  if (view.getUint8(0) !== AUDIO_FRAME_KIND) return null;
  const headerLength = view.getUint16(2);
  const idLength = view.getUint8(12);
  if (headerLength < FIXED_HEADER + idLength || headerLength > view.byteLength) return null;
  let responseId = "";
  for (let i = 0; i < idLength; i += 1) responseId += String.fromCharCode(view.getUint8(FIXED_HEADER + i));
  const samples = (view.byteLength - headerLength) >> 1;
  const pcm = new Int16Array(samples);
  // Read sample by sample: H may be odd (no aligned Int16Array view), and this is endian-safe.
  for (let i = 0; i < samples; i += 1) pcm[i] = view.getInt16(headerLength + 2 * i, true);
  return {
    responseId,
    seq: view.getUint32(4),
    offsetMs: view.getUint32(8),
    last: (view.getUint8(1) & 1) === 1,
    pcm,
  };
}

/**
 * Float samples (-1..1; beyond is clipped) as PCM16.
 * @param {Float32Array | number[]} samples
 * @returns {Int16Array}
 */
export function floatTo16(samples) {
  const out = new Int16Array(samples.length);
  for (let i = 0; i < samples.length; i += 1) {
    const s = Math.max(-1, Math.min(1, samples[i] || 0));
    out[i] = Math.round(s < 0 ? s * 0x8000 : s * 0x7fff);
  }
  return out;
}

/**
 * PCM16 as float samples (-1..1).
 * @param {Int16Array} pcm
 * @returns {Float32Array}
 */
export function int16ToFloat(pcm) {
  const out = new Float32Array(pcm.length);
  for (let i = 0; i < pcm.length; i += 1) out[i] = pcm[i] / 0x8000;
  return out;
}

/**
 * The root mean square of float samples: 0 (silence) to 1 (full scale), for a level meter.
 * @param {Float32Array | number[]} samples
 * @returns {number}
 */
export function rms(samples) {
  if (samples.length === 0) return 0;
  let sum = 0;
  for (let i = 0; i < samples.length; i += 1) sum += samples[i] * samples[i];
  return Math.min(1, Math.sqrt(sum / samples.length));
}

/**
 * A streaming resampler by linear interpolation: feed it chunks of any length, it returns the
 * samples at the new rate that those chunks determine so far. It keeps the last input sample
 * and the fractional position between chunks, so chunk boundaries leave no click or gap, and
 * N input samples give N * to / from output samples over time, whatever the chunking.
 * (Downsampling without a low-pass filter aliases a little: fine for speech to a recognizer.)
 */
export class StreamResampler {
  /**
   * @param {number} fromRate Hz of the input.
   * @param {number} toRate Hz of the output.
   */
  constructor(fromRate, toRate) {
    if (!(fromRate > 0 && toRate > 0)) throw new RangeError("sample rates must be positive");
    this.fromRate = fromRate;
    this.toRate = toRate;
    /** input samples per output sample */
    this._step = fromRate / toRate;
    /** the previous chunk's last sample: index 0 of the virtual buffer [last, ...chunk] */
    this._last = 0;
    /** where the next output sample is, in that virtual buffer (1: the chunk's first sample) */
    this._pos = 1;
  }

  /**
   * @param {Float32Array | number[]} input
   * @returns {Float32Array} the output samples this input completes (maybe none).
   */
  push(input) {
    const n = input.length;
    if (n === 0) return new Float32Array(0);
    const at = (/** @type {number} */ i) => (i === 0 ? this._last : input[i - 1]);
    const out = new Float32Array(Math.max(0, Math.ceil((n + 1 - this._pos) / this._step)) + 1);
    let count = 0;
    let pos = this._pos;
    while (pos <= n) {
      const i = Math.floor(pos);
      const frac = pos - i;
      if (frac > 0 && i >= n) break; // the next sample comes with the next chunk
      out[count] = frac === 0 ? at(i) : at(i) * (1 - frac) + at(i + 1) * frac;
      count += 1;
      pos += this._step;
    }
    this._last = input[n - 1];
    this._pos = pos - n;
    return out.subarray(0, count);
  }

  /** Forget the stream so far (a new utterance, a new response). */
  reset() {
    this._last = 0;
    this._pos = 1;
  }
}

/**
 * Load the worklets (audio-worklets.js: the microphone's capture, the player's playback) into
 * `context`, once per context: the microphone and the player may share one.
 * @param {BaseAudioContext} context
 * @returns {Promise<void>}
 */
export function loadWorklets(context) {
  let promise = loadedWorklets.get(context);
  if (!promise) {
    promise = context.audioWorklet.addModule(new URL("./audio-worklets.js", import.meta.url).href);
    loadedWorklets.set(context, promise);
  }
  return promise;
}

/** @type {WeakMap<BaseAudioContext, Promise<void>>} */
const loadedWorklets = new WeakMap();
