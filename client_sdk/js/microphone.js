/**
 * @file The microphone, sent to the gateway as PCM16 binary frames (audio.js has the protocol
 * and an example).
 * @module microphone
 */

import { CAPTURE_PROCESSOR } from "./audio-worklets.js";
import { StreamResampler, floatTo16, loadWorklets, rms } from "./audio.js";

// ------------------------------------------------------------------------- the microphone

/**
 * What `MicrophoneCapture` needs of the client (a `GatewayClient` has it all).
 * @typedef {object} AudioSender
 * @property {(pcm: Int16Array | ArrayBuffer) => boolean} sendAudio Send one binary frame.
 * @property {() => (string | null)} [commitAudio] Send `input_audio.commit`.
 */

/**
 * @typedef {object} MicrophoneOptions
 * @property {number} [inputRate] The session's `input_rate` (default 16000).
 * @property {number} [frameMs] ms of audio per binary frame, 20 to 40 (default 20).
 * @property {"server_vad" | "semantic" | "manual"} [turnDetection] The session's; with
 *   `manual`, `release()` sends `input_audio.commit` (default `server_vad`).
 * @property {(level: number) => void} [onLevel] The RMS (0..1) of each chunk the microphone
 *   gives (about every 20 ms), for a meter; 0 once stopped.
 * @property {AudioContext} [context] The context to capture in (default: a new one, closed by `stop()`).
 * @property {MediaTrackConstraints} [constraints] In place of the default echo cancellation,
 *   noise suppression and automatic gain control.
 */

/**
 * The microphone, sent to the gateway: getUserMedia (echo cancellation, noise suppression,
 * automatic gain), an AudioWorklet that posts the samples, resampled to `inputRate` and sent
 * as PCM16 binary frames of `frameMs` through the client. Frames are not sent while muted
 * (push-to-talk released), nor while the client is disconnected (live audio is not queued).
 */
export class MicrophoneCapture {
  /**
   * @param {AudioSender} client
   * @param {MicrophoneOptions} [options]
   */
  constructor(client, options = {}) {
    this.client = client;
    this.inputRate = options.inputRate ?? 16000;
    const frameMs = Math.min(40, Math.max(20, options.frameMs ?? 20));
    /** samples per binary frame */
    this.frameSamples = Math.round((this.inputRate * frameMs) / 1000);
    this.turnDetection = options.turnDetection ?? "server_vad";
    this.onLevel = options.onLevel ?? (() => {});
    this._context = options.context ?? null;
    this._ownContext = !options.context;
    this._constraints = options.constraints ?? { echoCancellation: true, noiseSuppression: true, autoGainControl: true };
    /** false while push-to-talk is released: chunks are measured, not sent */
    this.sending = true;
    /** Binary frames sent so far. */
    this.framesSent = 0;
    /** @type {MediaStream | null} */
    this._stream = null;
    /** @type {AudioNode[]} */
    this._nodes = [];
    /** @type {StreamResampler | null} */
    this._resampler = null;
    this._pending = new Int16Array(this.frameSamples);
    this._filled = 0;
    /** @type {Promise<void> | null} */
    this._starting = null;
  }

  /** Whether the microphone is on (started and not stopped). */
  get active() {
    return this._stream !== null;
  }

  /**
   * Ask for the microphone and start sending (call it from a user gesture: a click). Calling
   * it again while started does nothing.
   * @returns {Promise<void>}
   * @throws {DOMException} the user (or the browser) refused the microphone.
   */
  start() {
    this._starting ??= this._start().catch((err) => {
      this._starting = null;
      this._release();
      throw err;
    });
    return this._starting;
  }

  async _start() {
    const stream = await navigator.mediaDevices.getUserMedia({ audio: this._constraints });
    this._stream = stream;
    const context = (this._context ??= new AudioContext());
    if (context.state === "suspended") await context.resume();
    await loadWorklets(context);
    if (this._stream !== stream) return; // stop() came meanwhile
    this._resampler = new StreamResampler(context.sampleRate, this.inputRate);
    const source = context.createMediaStreamSource(stream);
    const chunk = Math.round(context.sampleRate / 50); // 20 ms at the context's rate
    const node = new AudioWorkletNode(context, CAPTURE_PROCESSOR, {
      numberOfInputs: 1,
      numberOfOutputs: 1,
      channelCount: 1,
      channelCountMode: "explicit",
      processorOptions: { chunk },
    });
    node.port.onmessage = (event) => this._onChunk(event.data);
    // A muted path to the speakers keeps the graph pulled in every browser.
    const mute = context.createGain();
    mute.gain.value = 0;
    source.connect(node).connect(mute).connect(context.destination);
    this._nodes = [source, node, mute];
  }

  /**
   * Turn the microphone off: its tracks stop (the browser's recording mark goes), and what
   * was captured but not yet a full frame is dropped.
   */
  async stop() {
    const context = this._release();
    this._starting = null;
    this.onLevel(0);
    if (context && this._ownContext) {
      this._context = null;
      await context.close().catch(() => {});
    }
  }

  /** Disconnect everything; the context, for `stop()` to close. */
  _release() {
    for (const node of this._nodes) {
      try {
        if ("port" in node) /** @type {any} */ (node).port.postMessage("stop"); // the worklet ends
        node.disconnect();
      } catch {
        // already disconnected
      }
    }
    this._nodes = [];
    for (const track of this._stream?.getTracks() ?? []) track.stop();
    this._stream = null;
    this._filled = 0;
    this._resampler?.reset();
    return this._context;
  }

  /**
   * Push-to-talk pressed: start if needed, and send from now on.
   * @returns {Promise<void>}
   */
  press() {
    this.sending = true;
    return this.start();
  }

  /**
   * Push-to-talk released: stop sending (the microphone stays on for the next press); with
   * `manual` turn detection, `input_audio.commit` ends the user's turn now.
   * @returns {boolean} whether a commit was sent.
   */
  release() {
    this._flushPartial();
    this.sending = false;
    if (this.turnDetection !== "manual" || typeof this.client.commitAudio !== "function") return false;
    return this.client.commitAudio() !== null;
  }

  /** One chunk from the worklet: measure it, resample it, send the full frames it makes. */
  _onChunk(/** @type {Float32Array} */ samples) {
    this.onLevel(rms(samples));
    if (!this._resampler || !this.sending) return;
    this.pushSamples(this._resampler.push(samples));
  }

  /**
   * Queue float samples at `inputRate` and send each full frame (public for tests and for
   * apps that capture by other means).
   * @param {Float32Array} samples
   */
  pushSamples(samples) {
    const pcm = floatTo16(samples);
    let at = 0;
    while (at < pcm.length) {
      const n = Math.min(pcm.length - at, this.frameSamples - this._filled);
      this._pending.set(pcm.subarray(at, at + n), this._filled);
      this._filled += n;
      at += n;
      if (this._filled === this.frameSamples) this._sendPending();
    }
  }

  /** At a release, what is queued goes too: the end of the user's words (padded to 20 ms). */
  _flushPartial() {
    if (this._filled === 0 || !this.sending) return;
    const min = Math.round(this.inputRate / 50);
    if (this._filled < min) {
      this._pending.fill(0, this._filled, min);
      this._filled = min;
    }
    this._sendPending();
  }

  _sendPending() {
    const frame = this._pending.slice(0, this._filled);
    this._filled = 0;
    if (this.client.sendAudio(frame)) this.framesSent += 1;
  }
}

