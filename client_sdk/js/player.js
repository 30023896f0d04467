/**
 * @file The answers' audio played, and barge-in (audio.js has the protocol and an example).
 * @module player
 */

import { StreamResampler, int16ToFloat, loadWorklets } from "./audio.js";
import { PLAYBACK_PROCESSOR } from "./audio-worklets.js";

// ------------------------------------------------------------------------- the answer's audio

/**
 * @typedef {object} PlayerOptions
 * @property {number} [outputRate] The session's `output_rate` (default 24000).
 * @property {AudioContext} [context] Where to play (default: a new one, at the first frame;
 *   create the player, or call `resume()`, in a user gesture so that the browser lets it play).
 * @property {(event: {responseId: string, delayMs: number}) => void} [onStart] A response's
 *   first audio started playing, to be heard in `delayMs` (the context's output latency).
 * @property {(event: {responseId: string, playedMs: number, interrupted: boolean}) => void} [onEnd]
 *   A response's audio ended: all played (after `finish()`), or flushed (`interrupted`).
 * @property {typeof AudioWorkletNode} [AudioWorkletNodeImpl] The AudioWorkletNode class (default:
 *   the browser's; tests pass a stand-in).
 */


/**
 * Plays the answers' PCM16 at `outputRate` through an AudioWorklet (`gateway-playback`, in
 * audio-worklets.js): each frame is resampled to the context's rate (one resampler per
 * response) and posted to the processor, which plays the responses one after the other, in
 * the order their audio came, and reports how much of each it played. `flush(id)` drops a
 * response's queued audio at once (barge-in) and `positionMs(id)` says how much of it was
 * heard (for `response.truncate`), as of the processor's last report (at most ~20 ms old).
 */
export class AudioPlayer {
  /** @param {PlayerOptions} [options] */
  constructor(options = {}) {
    this.outputRate = options.outputRate ?? 24000;
    this._context = options.context ?? null;
    this._ownContext = !options.context;
    this._NodeImpl = options.AudioWorkletNodeImpl ?? null;
    this.onStart = options.onStart ?? (() => {});
    this.onEnd = options.onEnd ?? (() => {});
    /**
     * @type {Map<string, {resampler: StreamResampler | null, rate: number, queued: number, played: number,
     *   started: boolean, finished: boolean, flushed: boolean, ended: boolean}>}
     */
    this._responses = new Map();
    /** @type {AudioWorkletNode | null} the playback node, once its module loaded */
    this._node = null;
    /** @type {Promise<void> | null} */
    this._starting = null;
    /** @type {[any, Transferable[]][]} messages posted before the node exists */
    this._pending = [];
    /** @type {unknown} why the worklet could not start, if it could not */
    this._failed = null;
    /** bumped by close(): a start still loading then gives up */
    this._generation = 0;
    /** ms of audio queued for playback so far, every response (for meters and tests) */
    this.scheduledMs = 0;
    /** frames handed to the player so far */
    this.frames = 0;
  }

  /** The AudioContext, created at first need. @type {AudioContext} */
  get context() {
    this._context ??= new AudioContext();
    return this._context;
  }

  /**
   * Let the context play (call it from a user gesture), and load the playback worklet.
   * @returns {Promise<void>} Rejects if the worklet cannot load (then nothing plays).
   */
  async resume() {
    if (this.context.state === "suspended") await this.context.resume();
    await this._start();
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
    r.rate = context.sampleRate;
    r.resampler ??= new StreamResampler(this.outputRate, context.sampleRate);
    const samples = r.resampler.push(int16ToFloat(pcm));
    this.frames += 1;
    this.scheduledMs += (pcm.length * 1000) / this.outputRate; // of the response's own audio
    if (samples.length === 0) return;
    r.queued += samples.length;
    this._post({ type: "samples", id: responseId, samples }, [samples.buffer]);
  }

  /**
   * No more audio comes for this response (`audio.done`): `onEnd` follows once it played.
   * @param {string} responseId
   */
  finish(responseId) {
    const r = this._response(responseId);
    r.finished = true;
    if (!r.flushed && (r.played >= r.queued || this._failed)) this._end(responseId, r, false);
  }

  /**
   * Barge-in: drop what is queued of the response at once; its position stays where it
   * stopped. Other responses' audio moves up into the gap. `onEnd` (interrupted) follows when
   * the processor confirms, with the exact position.
   * @param {string} responseId
   * @returns {number} ms of it that were heard (`positionMs`, as of the last report).
   */
  flush(responseId) {
    const r = this._response(responseId);
    if (r.flushed) return this.positionMs(responseId);
    r.flushed = true;
    if (r.queued === 0 || this._failed) this._end(responseId, r, true); // nothing to stop
    else this._post({ type: "flush", id: responseId }, []);
    return this.positionMs(responseId);
  }

  /** Flush every response (the user stopped, the page leaves). */
  flushAll() {
    for (const id of this._responses.keys()) this.flush(id);
  }

  /**
   * How much of the response has played, ms from its first sample (what `response.truncate`
   * calls `audio_end_ms`), as the processor last reported it; after a flush, where it stopped.
   * @param {string} responseId
   * @returns {number}
   */
  positionMs(responseId) {
    const r = this._responses.get(responseId);
    if (!r || !r.rate) return 0;
    return Math.round((r.played * 1000) / r.rate);
  }

  /** Whether some audio is queued and not yet played (as last reported). */
  get playing() {
    for (const r of this._responses.values()) if (!r.flushed && r.played < r.queued) return true;
    return false;
  }

  /** Stop everything (`onEnd` interrupted for what had not ended); close the context if the player made it. */
  async close() {
    this._generation += 1;
    for (const [id, r] of this._responses) {
      r.flushed = true;
      this._end(id, r, true);
    }
    const node = this._node;
    this._node = null;
    this._starting = null;
    this._pending = [];
    if (node) {
      node.port.onmessage = null;
      try {
        node.port.postMessage("stop"); // the processor ends
        node.disconnect();
      } catch {
        // already disconnected
      }
    }
    if (this._context && this._ownContext) await this._context.close().catch(() => {});
    this._context = null;
  }

  _response(/** @type {string} */ responseId) {
    let r = this._responses.get(responseId);
    if (!r) {
      r = { resampler: null, rate: 0, queued: 0, played: 0, started: false, finished: false, flushed: false, ended: false };
      this._responses.set(responseId, r);
    }
    return r;
  }

  /** Post to the processor, or keep the message until it exists. */
  _post(/** @type {any} */ message, /** @type {Transferable[]} */ transfer) {
    if (this._failed) return;
    if (this._node) {
      this._node.port.postMessage(message, transfer);
      return;
    }
    this._pending.push([message, transfer]);
    this._start().catch(() => {}); // resume() is where a failure shows
  }

  /** Load the worklet and make the node, once. */
  _start() {
    this._starting ??= this._open(this._generation).catch((err) => {
      this._failed = err;
      this._pending = [];
      // nothing will play: what waited on the processor ends now
      for (const [id, r] of this._responses) if (r.flushed || r.finished) this._end(id, r, r.flushed);
      throw err;
    });
    return this._starting;
  }

  async _open(/** @type {number} */ generation) {
    const context = this.context;
    await loadWorklets(context);
    if (generation !== this._generation) return; // closed meanwhile
    const Node = this._NodeImpl ?? globalThis.AudioWorkletNode;
    const node = new Node(context, PLAYBACK_PROCESSOR, {
      numberOfInputs: 0,
      numberOfOutputs: 1,
      outputChannelCount: [1],
      processorOptions: { reportEvery: Math.round(context.sampleRate / 50) }, // every 20 ms
    });
    node.port.onmessage = (event) => this._onReport(event.data);
    node.connect(context.destination);
    this._node = node;
    for (const [message, transfer] of this._pending.splice(0)) node.port.postMessage(message, transfer);
  }

  /**
   * A report from the processor: each response's position, start and end, in the order they
   * played (one that ran out comes before the next one that started).
   */
  _onReport(/** @type {import("./audio-worklets.js").PlaybackReport} */ report) {
    const delayMs = Math.round(1000 * (this._context?.outputLatency || this._context?.baseLatency || 0));
    for (const [id, played] of Object.entries(report.played)) {
      const r = this._responses.get(id);
      if (!r) continue;
      r.played = played;
      if (!r.started && played > 0) {
        r.started = true;
        this.onStart({ responseId: id, delayMs });
      }
      if (report.flushed.includes(id)) this._end(id, r, true);
      else if (report.drained.includes(id) && r.finished && !r.flushed && r.played >= r.queued) this._end(id, r, false);
    }
  }

  _end(/** @type {string} */ responseId, r, /** @type {boolean} */ interrupted) {
    if (r.ended) return;
    r.ended = true;
    this.onEnd({ responseId, playedMs: this.positionMs(responseId), interrupted });
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
