/**
 * @file The AudioWorklet processors of the voice helpers (audio.js). This one file is both: in
 * the page (and in Node) it is an ordinary module exporting the processors' names and the
 * playback queue; loaded with `audioContext.audioWorklet.addModule(url of this file)`, it also
 * registers the processors, since the worklet's global scope has `registerProcessor` and
 * `AudioWorkletProcessor`.
 * @module audio-worklets
 */

/** The capture processor: posts the microphone's samples, mono Float32, in chunks. */
export const CAPTURE_PROCESSOR = "gateway-capture";

/** The playback processor: plays the answers' samples queued by the page (a `PlaybackQueue`). */
export const PLAYBACK_PROCESSOR = "gateway-playback";

/** Samples between two position reports while playing, by default: 20 ms at 48 kHz. */
const DEFAULT_REPORT_EVERY = 960;

/** How many flushed response ids the queue remembers (to drop their late samples). */
const FLUSHED_KEPT = 256;

/**
 * A message the page posts to the playback processor: a response's samples (mono Float32 at
 * the context's rate, to play after everything queued), or drop a response's queued samples.
 * @typedef {{type: "samples", id: string, samples: Float32Array} | {type: "flush", id: string}} PlaybackMessage
 */

/**
 * What the playback processor posts back: `played`, samples played so far of each response
 * it names (those that played since the last report, and those drained or flushed); `drained`,
 * the responses whose queued samples just ran out (all played, or an underrun: more may come);
 * `flushed`, the responses just flushed (their `played` is where they stopped).
 * @typedef {{played: Record<string, number>, drained: string[], flushed: string[]}} PlaybackReport
 */

/**
 * The playback processor's logic, free of the worklet (Node tests drive it with fake render
 * quanta): a FIFO of sample chunks tagged by response id, rendered in order, silence when
 * empty. It reports through `post`: when a response starts playing, every `reportEvery`
 * samples while something plays, and at once when a response drains or is flushed.
 */
export class PlaybackQueue {
  /**
   * @param {(report: PlaybackReport) => void} post
   * @param {{reportEvery?: number}} [options]
   */
  constructor(post, { reportEvery = DEFAULT_REPORT_EVERY } = {}) {
    this._post = post;
    this._reportEvery = Math.max(1, reportEvery);
    /** @type {{id: string, samples: Float32Array, at: number}[]} */
    this._chunks = [];
    /** @type {Map<string, number>} samples played per response */
    this._played = new Map();
    /** @type {Set<string>} responses that played since the last report */
    this._changed = new Set();
    /** @type {Set<string>} flushed responses: their late samples are dropped */
    this._flushed = new Set();
    this._sinceReport = 0;
  }

  /** Samples queued and not yet played, every response. */
  get queued() {
    return this._chunks.reduce((sum, c) => sum + c.samples.length - c.at, 0);
  }

  /** @param {PlaybackMessage} message One message from the page. */
  receive(message) {
    if (message?.type === "samples") {
      if (!this._flushed.has(message.id) && message.samples.length > 0) {
        this._chunks.push({ id: message.id, samples: message.samples, at: 0 });
      }
    } else if (message?.type === "flush") {
      this._flush(message.id);
    }
  }

  /**
   * Fill one render quantum: the queued samples in order, then silence.
   * @param {Float32Array} output
   */
  render(output) {
    let filled = 0;
    let started = false;
    /** @type {string[]} */
    const drained = [];
    while (filled < output.length && this._chunks.length > 0) {
      const chunk = this._chunks[0];
      const n = Math.min(output.length - filled, chunk.samples.length - chunk.at);
      output.set(chunk.samples.subarray(chunk.at, chunk.at + n), filled);
      filled += n;
      chunk.at += n;
      const before = this._played.get(chunk.id) ?? 0;
      if (before === 0) started = true; // onStart should not wait for the next report
      this._played.set(chunk.id, before + n);
      this._changed.add(chunk.id);
      if (chunk.at === chunk.samples.length) {
        this._chunks.shift();
        if (!this._chunks.some((c) => c.id === chunk.id)) drained.push(chunk.id);
      }
    }
    output.fill(0, filled);
    this._sinceReport += filled;
    if (started || drained.length > 0 || (this._changed.size > 0 && this._sinceReport >= this._reportEvery)) {
      this._report(drained, []);
    }
  }

  _flush(/** @type {string} */ id) {
    this._chunks = this._chunks.filter((c) => c.id !== id);
    this._flushed.add(id);
    if (this._flushed.size > FLUSHED_KEPT) this._flushed.delete(this._flushed.values().next().value);
    this._report([], [id]);
    this._played.delete(id); // it never plays again: its count is reported for good
  }

  _report(/** @type {string[]} */ drained, /** @type {string[]} */ flushed) {
    /** @type {Record<string, number>} */
    const played = {};
    for (const id of [...this._changed, ...drained, ...flushed]) played[id] = this._played.get(id) ?? 0;
    this._changed.clear();
    this._sinceReport = 0;
    this._post({ played, drained, flushed });
  }
}

/** Samples per posted chunk by default: 20 ms at 48 kHz (a render quantum is 128). */
const DEFAULT_CHUNK = 960;

if (typeof registerProcessor === "function" && typeof AudioWorkletProcessor === "function") {
  /**
   * Collects channel 0 of its input into chunks of `processorOptions.chunk` samples and posts
   * each (a transferred Float32Array) to the node's port. Outputs nothing.
   */
  class CaptureProcessor extends AudioWorkletProcessor {
    constructor(options) {
      super();
      const size = Math.max(128, Math.floor(Number(options?.processorOptions?.chunk) || DEFAULT_CHUNK));
      this._chunk = new Float32Array(size);
      this._filled = 0;
      this._running = true;
      this.port.onmessage = (event) => {
        if (event.data === "stop") this._running = false;
      };
    }

    process(inputs) {
      const channel = inputs[0]?.[0];
      if (channel) {
        let at = 0;
        while (at < channel.length) {
          const n = Math.min(channel.length - at, this._chunk.length - this._filled);
          this._chunk.set(channel.subarray(at, at + n), this._filled);
          this._filled += n;
          at += n;
          if (this._filled === this._chunk.length) {
            const full = this._chunk;
            this._chunk = new Float32Array(full.length); // before the transfer detaches it (length 0)
            this.port.postMessage(full, [full.buffer]);
            this._filled = 0;
          }
        }
      }
      return this._running; // false: the node may be collected
    }
  }
  registerProcessor(CAPTURE_PROCESSOR, CaptureProcessor);

  /**
   * Plays a `PlaybackQueue` on its one output (mono; copied to every channel it has) and posts
   * the queue's reports to the node's port. `processorOptions.reportEvery`: samples between
   * reports. The message "stop" ends it.
   */
  class PlaybackProcessor extends AudioWorkletProcessor {
    constructor(options) {
      super();
      const reportEvery = Math.floor(Number(options?.processorOptions?.reportEvery) || DEFAULT_REPORT_EVERY);
      this._queue = new PlaybackQueue((report) => this.port.postMessage(report), { reportEvery });
      this._running = true;
      this.port.onmessage = (event) => {
        if (event.data === "stop") this._running = false;
        else this._queue.receive(event.data);
      };
    }

    process(_inputs, outputs) {
      const channels = outputs[0] ?? [];
      if (channels.length > 0) {
        this._queue.render(channels[0]);
        for (let c = 1; c < channels.length; c += 1) channels[c].set(channels[0]);
      }
      return this._running; // true keeps a node with no input alive
    }
  }
  registerProcessor(PLAYBACK_PROCESSOR, PlaybackProcessor);
}
