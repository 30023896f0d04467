// Voice in the web demo: the microphone button of the composer, its level meter, the user's
// spoken words as their bubble, and the answer's audio played (with barge-in). Built on the
// browser SDK's audio.js; nothing here is sent until the user presses the microphone, so a
// text-only conversation is unchanged.
//
// The button: a click toggles hands-free listening (turn_detection "server_vad": the gateway
// hears when the user stops); a press held longer than HOLD_MS is push-to-talk ("manual": the
// release sends input_audio.commit). The page exposes what it played for tests and curious
// developers: document.body.dataset.audioFrames and .audioMs (answer audio scheduled).

/** The gateway's voice events, which an SDK hands only to listeners that name them. */
export const VOICE_EVENTS = [
  "input_audio.speech_started",
  "input_audio.speech_stopped",
  "input_audio.transcript",
  "input_audio.cleared",
  "audio.done",
  "audio.flush",
];

/** A press held this long (ms) is push-to-talk, not a click. */
const HOLD_MS = 300;
/** How long the gateway has to apply the audio settings (session.updated), ms. */
const UPDATE_TIMEOUT_MS = 10_000;
const INPUT_RATE = 16000;
const OUTPUT_RATE = 24000;
const LABELS = {
  off: "Talk: click to listen hands-free, hold to talk",
  starting: "Starting the microphone…",
  listening: "Listening: click to stop",
  talking: "Talking: release to send",
};

export class VoiceControl {
  /**
   * @param {HTMLButtonElement} button The microphone button (it holds the level meter).
   * @param {object} page What the page draws.
   * @param {(text: string) => HTMLElement} page.addUserBubble A user bubble for `text`.
   * @param {(text: string, options?: {kind?: string}) => void} page.note A line in the chat.
   * @param {() => void} [page.changed] The conversation changed (save it, follow it).
   */
  constructor(button, page) {
    this.button = button;
    this.page = page;
    this.meter = button.querySelector(".mic-level-bar");
    /** @type {"off" | "starting" | "listening" | "talking"} */
    this.state = "off";
    this.client = null;
    this.sdk = null;
    /** the audio settings in force (session.created / session.updated), null: off */
    this.settings = null;
    this.mic = null;
    this.player = null;
    /** the bubble of the user's turn being transcribed (partials), or null */
    this.partial = null;
    this._holdTimer = null;
    this._held = false;
    /** the press under way (or just ended) was a hold: its click is no toggle */
    this._wasHold = false;
    /** push-to-talk was released while the microphone was starting */
    this._stopAfterStart = false;
    this._offs = [];
    this._bind();
    this._render();
  }

  /**
   * A new GatewayClient for the page (a new chat, a reload): the voice follows it. The old
   * one's microphone and audio stop.
   * @param {any} client
   * @param {any} sdk The SDK module (MicrophoneCapture, AudioPlayer, attachAudio).
   */
  attach(client, sdk) {
    this.detach();
    this.client = client;
    this.sdk = sdk;
    this.settings = null;
    this.button.hidden = true;
    this._offs.push(client.on("audio", () => this._counted()));
  }

  /** Stop everything of the current client. */
  detach() {
    for (const off of this._offs.splice(0)) off();
    this.mic?.stop();
    this.mic = null;
    this.player?.close();
    this.player = null;
    this.partial = null;
    this._setState("off");
  }

  /** session.created: the button shows only when the gateway speaks audio and the browser can. */
  onSession(created) {
    const gateway = (created?.voices ?? []).length > 0; // the voices it speaks in: none, no audio
    const browser = typeof AudioWorkletNode === "function" && Boolean(navigator.mediaDevices?.getUserMedia);
    this.settings = created?.audio ?? null;
    this.button.hidden = !(gateway && browser && typeof this.client?.sendAudio === "function");
  }

  /** session.updated: the audio settings now in force. */
  onUpdated(event) {
    if (Object.hasOwn(event, "audio")) this.settings = event.audio ?? null;
  }

  /** A voice event of the page's client (VOICE_EVENTS), already de-duplicated by seq. */
  onEvent(event) {
    switch (event.type) {
      case "input_audio.speech_started":
        this.button.dataset.speech = "true";
        break;
      case "input_audio.speech_stopped":
        delete this.button.dataset.speech;
        break;
      case "input_audio.transcript":
        this._transcript(event);
        break;
      case "input_audio.cleared":
        this.partial?.remove();
        this.partial = null;
        break;
      default:
        break; // audio.done, audio.flush: attachAudio plays and truncates
    }
  }

  // ---- the user's words -------------------------------------------------------------------

  /** Partials grey in one bubble, updated in place; the final makes it the user's message. */
  _transcript(event) {
    const text = String(event.text ?? "").trim();
    if (!event.final) {
      if (!text) return;
      if (!this.partial?.isConnected) {
        this.partial = this.page.addUserBubble(text);
        this.partial.classList.add("partial");
        this.partial.dataset.voice = "true";
      }
      this.partial.querySelector(".msg-text").textContent = text;
      return;
    }
    const bubble = this.partial?.isConnected ? this.partial : null;
    this.partial = null;
    if (!text) {
      bubble?.remove(); // nothing understood: no message
      return;
    }
    const final = bubble ?? this.page.addUserBubble(text);
    final.classList.remove("partial");
    final.dataset.voice = "true";
    final.querySelector(".msg-text").textContent = text;
    if (event.message_id) final.dataset.messageId = event.message_id;
    this.page.changed?.();
  }

  // ---- the button --------------------------------------------------------------------------

  _bind() {
    const b = this.button;
    b.addEventListener("pointerdown", (e) => {
      if (e.button !== 0) return;
      b.setPointerCapture?.(e.pointerId);
      this._held = false;
      this._wasHold = false;
      clearTimeout(this._holdTimer);
      this._holdTimer = setTimeout(() => {
        this._held = true;
        this._pushToTalk();
      }, HOLD_MS);
    });
    const up = () => {
      clearTimeout(this._holdTimer);
      this._holdTimer = null;
      if (this._held) {
        this._held = false;
        this._releaseTalk();
      }
    };
    b.addEventListener("pointerup", up);
    b.addEventListener("pointercancel", up);
    // A click (mouse, touch or keyboard) that was not a hold toggles hands-free listening.
    b.addEventListener("click", () => {
      if (this._wasHold) {
        this._wasHold = false; // the click that ends a hold
        return;
      }
      this._toggle();
    });
    b.addEventListener("contextmenu", (e) => e.preventDefault()); // a long touch is push-to-talk
  }

  async _toggle() {
    if (this.state === "listening" || this.state === "starting") {
      await this._stop();
      return;
    }
    await this._start("server_vad", "listening");
  }

  async _pushToTalk() {
    this._wasHold = true;
    await this._start("manual", "talking");
  }

  _releaseTalk() {
    this._wasHold = true;
    if (this.state !== "talking") {
      this._stopAfterStart = true; // released before the microphone was on
      return;
    }
    this.mic?.release(); // sends what is queued, then input_audio.commit
    this._setState("off");
    this.mic?.stop();
    this.mic = null;
  }

  async _stop() {
    this._setState("off");
    const mic = this.mic;
    this.mic = null;
    await mic?.stop();
  }

  /**
   * Turn audio on with `turnDetection` (a session.update, once per change), make sure the
   * answers' audio can play (this runs in the click: browsers allow audio then), and start
   * the microphone.
   */
  async _start(turnDetection, state) {
    const client = this.client;
    if (!client || !this.sdk) return;
    this._stopAfterStart = false;
    this._setState("starting");
    try {
      this._ensurePlayer();
      await this.player.resume();
      await this._ensureAudio(turnDetection);
      if (this.client !== client || this.state !== "starting") return; // stopped meanwhile
      await this.mic?.stop();
      this.mic = new this.sdk.MicrophoneCapture(client, {
        inputRate: this.settings?.input_rate ?? INPUT_RATE,
        turnDetection,
        onLevel: (level) => this._level(level),
      });
      await this.mic.start();
      if (this.client !== client || this.state !== "starting") {
        await this.mic?.stop();
        return;
      }
      this._setState(state);
      if (this._stopAfterStart) this._releaseTalk();
    } catch (err) {
      this._setState("off");
      await this.mic?.stop();
      this.mic = null;
      this.page.note(`The microphone could not start: ${err?.message ?? err}`, { kind: "error" });
    }
  }

  /** The player of the answers' audio, wired to the client (one per client). */
  _ensurePlayer() {
    if (this.player) return;
    const rate = this.settings?.output_rate ?? OUTPUT_RATE;
    this.player = new this.sdk.AudioPlayer({
      outputRate: rate,
      onStart: ({ responseId }) => this._speaking(responseId, true),
      onEnd: ({ responseId, interrupted }) => this._speaking(responseId, false, interrupted),
    });
    this._offs.push(this.sdk.attachAudio(this.client, this.player));
  }

  /** Audio on with this turn detection: ask (session.update) unless it is in force already. */
  async _ensureAudio(turnDetection) {
    if (this.settings && this.settings.turn_detection === turnDetection) return;
    const client = this.client;
    const wanted = { input_rate: INPUT_RATE, output_rate: OUTPUT_RATE, turn_detection: turnDetection };
    const id = client.setAudio(wanted);
    if (id === null) return; // it goes in session.start
    const answer = await new Promise((resolve, reject) => {
      const offs = [];
      const done = (fn, value) => {
        clearTimeout(timer);
        for (const off of offs) off();
        fn(value);
      };
      const timer = setTimeout(() => done(reject, new Error("the gateway did not answer")), UPDATE_TIMEOUT_MS);
      offs.push(client.on("session.updated", (event) => { if (event.in_reply_to === id) done(resolve, event); }));
      offs.push(client.on("error", (event) => { if (event.in_reply_to === id) done(reject, new Error(event.message)); }));
    });
    this.onUpdated(answer);
    if (!this.settings) throw new Error("the gateway did not turn audio on");
    if (this.player && this.settings.output_rate && this.settings.output_rate !== this.player.outputRate) {
      this.player.outputRate = this.settings.output_rate;
    }
  }

  // ---- what the page shows ----------------------------------------------------------------

  _setState(state) {
    this.state = state;
    this._render();
  }

  _render() {
    const b = this.button;
    b.dataset.state = this.state;
    b.setAttribute("aria-pressed", String(this.state === "listening" || this.state === "talking"));
    b.title = LABELS[this.state];
    b.setAttribute("aria-label", LABELS[this.state]);
    if (this.state === "off") this._level(0);
  }

  /** The meter: RMS of speech is small (0.05 is loud enough), so it is shown on a square-root scale. */
  _level(level) {
    if (this.meter) this.meter.style.transform = `scaleY(${Math.min(1, Math.sqrt(level) * 2).toFixed(3)})`;
  }

  /** A response's audio started or ended: its bubble says so. */
  _speaking(responseId, on, interrupted = false) {
    const bubble = document.querySelector(`.msg.assistant[data-response-id="${CSS.escape(responseId)}"]`);
    if (!bubble) return;
    if (on) bubble.dataset.speaking = "true";
    else delete bubble.dataset.speaking;
    if (interrupted) bubble.dataset.interrupted = "true";
  }

  /** For tests and the curious: how much answer audio the page has scheduled. */
  _counted() {
    // attachAudio's listener ran first (registered before this one? not always): read after it.
    queueMicrotask(() => {
      if (!this.player) return;
      document.body.dataset.audioFrames = String(this.player.frames);
      document.body.dataset.audioMs = String(Math.round(this.player.scheduledMs));
    });
  }
}
