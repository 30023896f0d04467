/**
 * @file The AudioWorklet processor of the voice helpers (audio.js). This one file is both: in
 * the page (and in Node) it is an ordinary module exporting the processor's name; loaded with
 * `audioContext.audioWorklet.addModule(url of this file)`, it also registers the processor,
 * since the worklet's global scope has `registerProcessor` and `AudioWorkletProcessor`.
 * @module audio-worklets
 */

/** The capture processor: posts the microphone's samples, mono Float32, in chunks. */
export const CAPTURE_PROCESSOR = "gateway-capture";

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
}
