/**
 * @file The answers' audio played, and barge-in (audio.js has the protocol and an example).
 * @module player
 */

import { StreamResampler, int16ToFloat, parseAudioFrame } from "./audio.js";

// ------------------------------------------------------------------------- the answer's audio

/**
 * @typedef {object} PlayerOptions
 * @property {number} [outputRate] The session's `output_rate` (default 24000).
 * @property {AudioContext} [context] Where to play (default: a new one, at the first frame;
 *   create the player, or call `resume()`, in a user gesture so that the browser lets it play).
 * @property {(event: {responseId: string, delayMs: number}) => void} [onStart] A response's
 *   first audio is scheduled, to be heard in `delayMs`.
 * @property {(event: {responseId: string, playedMs: number, interrupted: boolean}) => void} [onEnd]
 *   A response's audio ended: all played (after `finish()`), or flushed (`interrupted`).
 */

/** How far ahead of the clock the first frame of a burst is scheduled, s (absorbs jitter). */
const LEAD_S = 0.05;

/**
 * Plays the answers' PCM16 at `outputRate`, each frame resampled to the context's rate and
 * scheduled right after the one before (AudioBufferSourceNodes): the responses play one after
 * the other, in the order their audio came. `flush(id)` silences a response at once (barge-in)
 * and `positionMs(id)` says how much of it was heard (for `response.truncate`).
 */
export class AudioPlayer {
  /** @param {PlayerOptions} [options] */
  constructor(options = {}) {
    this.outputRate = options.outputRate ?? 24000;
    this._context = options.context ?? null;
    this._ownContext = !options.context;
    this.onStart = options.onStart ?? (() => {});
    this.onEnd = options.onEnd ?? (() => {});
    /**
     * @type {Map<string, {chunks: {node: any, at: number, ms: number}[], resampler: StreamResampler | null,
     *   finished: boolean, flushed: boolean, stoppedMs: number, live: number}>}
     */
    this._responses = new Map();
    /** context time at which the queue runs out */
    this._tail = 0;
    /** ms of audio scheduled so far, every response (for meters and tests) */
    this.scheduledMs = 0;
    /** frames scheduled so far */
    this.frames = 0;
  }

  /** The AudioContext, created at first need. @type {AudioContext} */
  get context() {
    this._context ??= new AudioContext();
    return this._context;
  }

  /** Let the context play (call it from a user gesture). */
  async resume() {
    if (this.context.state === "suspended") await this.context.resume();
  }

  /**
   * Queue one frame of a response's audio (what `parseAudioFrame` gives, or the client's
   * `audio` event). Frames of a response flushed already are dropped.
   * @param {{responseId: string, pcm: Int16Array}} frame
   */
  enqueue({ responseId, pcm }) {
    const r = this._response(responseId);
    if (r.flushed || pcm.length === 0) return;
    const context = this.context;
    r.resampler ??= new StreamResampler(this.outputRate, context.sampleRate);
    const samples = r.resampler.push(int16ToFloat(pcm));
    if (samples.length === 0) return;
    const buffer = context.createBuffer(1, samples.length, context.sampleRate);
    buffer.getChannelData(0).set(samples);
    const node = context.createBufferSource();
    node.buffer = buffer;
    node.connect(context.destination);
    const now = context.currentTime;
    const at = Math.max(this._tail, now + (this._tail > now ? 0 : LEAD_S));
    const ms = (pcm.length * 1000) / this.outputRate; // of the response's own audio
    node.onended = () => this._ended(responseId, r);
    node.start(at);
    this._tail = at + samples.length / context.sampleRate;
    if (r.chunks.length === 0) this.onStart({ responseId, delayMs: Math.max(0, (at - now) * 1000) });
    r.chunks.push({ node, at, ms });
    r.live += 1;
    this.scheduledMs += ms;
    this.frames += 1;
  }

  /**
   * No more audio comes for this response (`audio.done`): `onEnd` follows once it played.
   * @param {string} responseId
   */
  finish(responseId) {
    const r = this._response(responseId);
    r.finished = true;
    if (r.live === 0 && !r.flushed) this._end(responseId, r, false);
  }

  /**
   * Barge-in: stop the response's audio at once and drop what is queued of it; its position
   * stays where it stopped. Other responses' audio moves up into the gap.
   * @param {string} responseId
   * @returns {number} ms of it that were heard (`positionMs`).
   */
  flush(responseId) {
    const r = this._response(responseId);
    if (r.flushed) return r.stoppedMs;
    r.stoppedMs = this.positionMs(responseId);
    r.flushed = true;
    for (const { node } of r.chunks) {
      node.onended = null;
      try {
        node.stop();
        node.disconnect();
      } catch {
        // never started or already stopped
      }
    }
    r.chunks = [];
    r.live = 0;
    this._tail = this._latestEnd();
    this._end(responseId, r, true);
    return r.stoppedMs;
  }

  /** Flush every response (the user stopped, the page leaves). */
  flushAll() {
    for (const id of this._responses.keys()) this.flush(id);
  }

  /**
   * How much of the response has actually played, ms from its first sample (what
   * `response.truncate` calls `audio_end_ms`); after a flush, where it stopped.
   * @param {string} responseId
   * @returns {number}
   */
  positionMs(responseId) {
    const r = this._responses.get(responseId);
    if (!r) return 0;
    if (r.flushed) return r.stoppedMs;
    const now = this.context.currentTime;
    let played = 0;
    for (const { at, ms } of r.chunks) played += Math.min(ms, Math.max(0, (now - at) * 1000));
    return Math.round(played);
  }

  /** Whether some audio is scheduled and not yet played. */
  get playing() {
    return this._tail > (this._context?.currentTime ?? 0);
  }

  /** Stop everything; close the context if the player made it. */
  async close() {
    this.flushAll();
    if (this._context && this._ownContext) await this._context.close().catch(() => {});
    this._context = null;
  }

  _response(/** @type {string} */ responseId) {
    let r = this._responses.get(responseId);
    if (!r) {
      r = { chunks: [], resampler: null, finished: false, flushed: false, stoppedMs: 0, live: 0 };
      this._responses.set(responseId, r);
    }
    return r;
  }

  _ended(responseId, r) {
    r.live -= 1;
    if (r.live === 0 && r.finished && !r.flushed) this._end(responseId, r, false);
  }

  _end(responseId, r, interrupted) {
    const playedMs = interrupted ? r.stoppedMs : r.chunks.reduce((sum, c) => sum + c.ms, 0);
    this.onEnd({ responseId, playedMs: Math.round(playedMs), interrupted });
  }

  /** When the audio still scheduled (every response not flushed) runs out, context time. */
  _latestEnd() {
    let end = 0;
    for (const r of this._responses.values()) {
      for (const { node, at } of r.chunks) end = Math.max(end, at + (node.buffer?.duration ?? 0));
    }
    return end;
  }
}

/**
 * What `attachAudio` needs of the client (a `GatewayClient` has it all).
 * @typedef {object} AudioClient
 * @property {(type: string, listener: (event: any) => void) => () => void} on
 * @property {(audioEndMs: number, options?: {responseId?: string}) => Promise<string> | string} truncateAudio
 */

/**
 * Wire a player to a client: every `audio` frame is played, `audio.done` ends its response's
 * audio, and `audio.flush` (barge-in) flushes the player and sends `response.truncate` with
 * `audio_end_ms` = what was played.
 * @param {AudioClient} client
 * @param {AudioPlayer} player
 * @returns {() => void} Call it to detach.
 */
export function attachAudio(client, player) {
  const offs = [
    client.on("audio", (frame) => player.enqueue(frame)),
    client.on("audio.done", (event) => player.finish(event.response_id)),
    client.on("audio.flush", (event) => {
      const heard = player.flush(event.response_id);
      Promise.resolve(client.truncateAudio(heard, { responseId: event.response_id })).catch(() => {});
    }),
  ];
  return () => {
    for (const off of offs) off();
  };
}
