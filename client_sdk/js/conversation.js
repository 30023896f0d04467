/**
 * @file The machinery of one conversation behind `GatewayClient` (client.js, which documents
 * the public API): starting, resuming and closing the session, and its events, once each and
 * in order, with what each settles (the Python SDK's `Conversation` in `client_sdk/client.py`
 * does both). It holds its collaborators: the reconnector (resume.js: the socket, and getting
 * another), the outbox (what goes again after a resume), the calls (calls.js: client
 * functions and handlers) and the listeners and queues (events.js).
 *
 * Several devices on one session: this device's id (`session.created`'s, `session.attached`'s
 * or `session.resumed`'s) goes in every resume with the functions registered now, so a
 * reconnect replaces this device's socket only. With the `join` option the first socket sends
 * `session.attach` instead of `session.start`, and `session.attached` (or, on a gap,
 * `resume_gap` then `session.snapshot`) answers it as `session.created` would, its replay
 * following. `session.going_away` hands the socket's end to the reconnector (an early
 * resume on a second socket: `Reconnector.goingAway`) and reaches the app like any event;
 * while that runs, user messages wait in the outbox for the new socket. A device that joined
 * never ends the session with a DELETE: that would end it for every device.
 * @module conversation
 */

import { parseAudioFrame } from "./audio.js";
import { Calls } from "./calls.js";
import { Dialer, sendBinary } from "./connection.js";
import { ClientError, ServerError, SessionClosed } from "./errors.js";
import { EventHub } from "./events.js";
import { Outbox } from "./outbox.js";
import { defaultsFields, messageFields, readOptions } from "./options.js";
import { DEFAULTS, attachOf, compact, parseEvent, randomId } from "./protocol.js";
import { Reconnector } from "./resume.js";

/** @typedef {import("./protocol.js").SessionCreated} SessionCreated */
/** @typedef {import("./protocol.js").JoinedSession} JoinedSession */
/** @typedef {import("./protocol.js").ClientCall} ClientCall */
/** @typedef {import("./protocol.js").ConfirmItem} ConfirmItem */
/** @typedef {import("./options.js").GatewayClientOptions} GatewayClientOptions */
/** @typedef {import("./options.js").MessageOptions} MessageOptions */
/** @typedef {import("./options.js").SessionDefaults} SessionDefaults */

export class Conversation {
  /**
   * @param {string} url
   * @param {GatewayClientOptions} options
   */
  constructor(url, options) {
    const settings = readOptions(options);
    /** what session.start sets besides the client functions */
    this._startFields = settings.startFields;
    /** @type {{sessionId: string, resumeToken: string} | null} the session this device joins, if it joins one */
    this._join = settings.join;
    this._ackEvery = settings.ackEvery;

    /** the listeners, and the queues of say() and events() */
    this.events = new EventHub();
    /** what was sent and not confirmed yet, to go again after a resume */
    this._outbox = new Outbox();
    /** the session's socket, and getting it another one */
    this._link = new Reconnector(new Dialer(settings.WebSocketImpl, url), this._host(), settings.reconnector);
    /** the client functions and handlers, and the calls they run */
    this.calls = new Calls(this._outbox, (msg) => this._link.send(msg), () => this._end);

    /** @type {Deferred<void> | null} */
    this._connected = null;
    /** @type {Promise<SessionCreated> | null} */
    this._starting = null;
    /** @type {Deferred<SessionCreated> | null} set once start() is asked (session.start sent or due) */
    this._created = null;
    /** true once the gateway answered session.start with an error: it is not sent again */
    this._refused = false;
    /** @type {Promise<void> | null} close()'s, once called */
    this._closed = null;
    /** @type {ClientError | null} why the conversation can go no further */
    this._end = null;

    this._sinceAck = 0;
    /** @type {SessionCreated | JoinedSession | null} */
    this.session = null;
    /** @type {string | null} this device's id among the session's: what a resume names */
    this.deviceId = null;
    /** @type {string | null} */
    this.agent = null;
    /** @type {string | null} the latest response that started (`truncate`'s default) */
    this.latestResponse = null;
    this.lastSeq = 0;
  }

  get state() {
    return this._link.state;
  }

  get reconnects() {
    return this._link.reconnects;
  }

  // ----------------------------------------------------------------------- lifecycle

  /** @returns {Promise<void>} */
  connect() {
    if (this._end) return Promise.reject(this._end);
    if (!this._connected) {
      this._connected = deferred();
      this._link.loop();
    }
    return this._connected.promise;
  }

  /** @returns {Promise<SessionCreated>} */
  start() {
    if (this._end) return Promise.reject(this._end);
    if (!this._starting) {
      this._starting = (async () => {
        if (this.state === "idle" || this.state === "connecting") await this.connect();
        if (this._end) throw this._end;
        this._created = deferred();
        // Without a socket now, the reconnect loop sends session.start on its next one.
        this._link.requestStart();
        return this._created.promise;
      })();
      this._starting.catch(() => {});
    }
    return this._starting;
  }

  /** @param {SessionCreated} session @param {number} lastSeq */
  async resume(session, lastSeq) {
    if (this._end) throw this._end;
    if (this._connected || this._starting) {
      throw new ClientError("resume() must come first, in place of connect() and start()");
    }
    this.session = session;
    this.deviceId = session.device_id ?? null; // a page reloaded resumes as the device it was
    this.agent = session.agent ?? null; // the resume's answer says if it changed since
    this.lastSeq = Math.max(0, Math.floor(Number(lastSeq)) || 0);
    const connected = (this._connected = deferred());
    const created = (this._created = deferred());
    this._starting = created.promise;
    const outcome = await this._link.attach();
    if (outcome !== "resumed") this._finish(new SessionClosed(1006, "could not reach the gateway to resume"));
    if (this._end) throw this._end;
    connected.resolve();
    created.resolve(session);
  }

  /** @returns {boolean} whether a wait between reconnect attempts was cut short */
  retryNow() {
    return this._end === null && this._link.retryNow();
  }

  /** @returns {Promise<void>} */
  close() {
    if (!this._closed) this._closed = this._shutDown();
    return this._closed;
  }

  /** What close() does, once. */
  async _shutDown() {
    // A session that ended already needs no ending; a device that joined leaves the session
    // to the others (without a socket it has nothing to take out of it: a DELETE would end
    // the session for every device).
    const session = this._end === null && this._join === null ? this.session : null;
    const sockets = this._link.sockets();
    this._finish(new SessionClosed(1000, "closed by the client")); // drops the attempt in flight
    await this._link.close(sockets, session);
  }

  // ----------------------------------------------------------------------- what the client sends

  /** A client function was registered: once session.start went out, declare them all again. */
  declareFunctions() {
    if (this._created) {
      this._link.send(this._newUpdate({ client_functions: this.calls.specs() }));
    }
  }

  /**
   * @param {SessionDefaults} defaults
   * @returns {string | null} the session.update's id; null before the session started.
   */
  update(defaults) {
    if (this._end) throw this._end;
    const fields = defaultsFields(defaults);
    if (!this._created) {
      Object.assign(this._startFields, fields);
      return null;
    }
    const update = this._newUpdate(fields);
    this.send(update);
    return update.id;
  }

  /**
   * Send a user message (the session started), kept until a response to it starts.
   * @param {string} text @param {MessageOptions} options
   * @returns {string} its id
   */
  post(text, options) {
    const id = randomId("msg_");
    const msg = { type: "user.message", id, text, ...messageFields(options) };
    if (this._end) throw this._end;
    this._outbox.keep(msg);
    // During a move (session.going_away) it waits in the outbox for the new socket: sent on
    // the old one, its response would start on the node going away, to be cut there by the
    // move and run again on the next. The outbox goes again on whichever socket serves after.
    if (!this._link.moving) this.send(msg);
    return id;
  }

  /**
   * @param {number} heardChars @param {string | undefined} responseId
   * @returns {string} the response.truncate's id
   */
  truncate(heardChars, responseId) {
    const target = responseId ?? this.latestResponse;
    if (target == null) throw new ClientError("no response to truncate yet");
    const id = randomId("trn_");
    const msg = { type: "response.truncate", id, response_id: target, heard_chars: heardChars };
    this._outbox.keep(msg);
    this.send(msg);
    return id;
  }

  /**
   * After a barge-in: the user heard the first `audioEndMs` of the response's audio.
   * @param {number} audioEndMs @param {string | undefined} responseId
   * @returns {string} the response.truncate's id
   */
  truncateAudio(audioEndMs, responseId) {
    const target = responseId ?? this.latestResponse;
    if (target == null) throw new ClientError("no response to truncate yet");
    const id = randomId("trn_");
    const ms = Math.max(0, Math.round(Number(audioEndMs) || 0));
    const msg = { type: "response.truncate", id, response_id: target, audio_end_ms: ms };
    this._outbox.keep(msg);
    this.send(msg);
    return id;
  }

  /**
   * The session's audio: in session.start before it started, else in a session.update.
   * @param {Record<string, any> | false} audio
   * @returns {string | null} the session.update's id; null before the session started.
   */
  setAudio(audio) {
    if (this._end) throw this._end;
    if (!this._created) {
      if (audio === false) delete this._startFields.audio;
      else this._startFields.audio = audio;
      return null;
    }
    const update = this._newUpdate({ audio });
    this.send(update);
    return update.id;
  }

  /**
   * Send a binary frame (the user's audio) if the socket is open: live audio lost to a drop
   * is not sent again. @param {ArrayBuffer | ArrayBufferView} pcm @returns {boolean}
   */
  sendAudio(pcm) {
    const ws = this._link.ws;
    if (!ws || this._end || this._link.state !== "open") return false;
    return sendBinary(ws, pcm);
  }

  /** Send `msg` now if the socket is open (never again later). @returns {boolean} */
  sendNow(msg) {
    return !this._end && this._link.send(msg);
  }

  /** @param {string | undefined} responseId */
  cancel(responseId) {
    this.send(compact({ type: "response.cancel", response_id: responseId }));
  }

  /** A queue of every event from now on (say(), events()); `events.unsubscribe` it when done. */
  subscribe() {
    if (this._end) throw this._end;
    return this.events.subscribe();
  }

  /** Send if connected; a message lost to a drop is recovered on resume (results, user messages). */
  send(msg) {
    if (this._end) throw this._end;
    this._link.send(msg);
  }

  // ----------------------------------------------------------------------- internals

  /** What the reconnector reads of this conversation, and tells it. @returns {import("./resume.js").Host} */
  _host() {
    return {
      ended: () => this._end,
      session: () => this.session,
      lastSeq: () => this.lastSeq,
      joining: () => this._join?.sessionId ?? null,
      device: () => (this.deviceId ? { device_id: this.deviceId, client_functions: this.calls.specs() } : null),
      startWanted: () => this._created !== null && this.session === null && !this._refused,
      startRefused: () => this.session === null && this._refused,
      startMessages: () => [
        this._join
          ? attachOf(this._join.sessionId, this._join.resumeToken, this.calls.specs())
          : { type: "session.start", ...this._startFields, client_functions: this.calls.specs() },
        ...this._outbox.sent.values(), // a session started anew gets the updates not answered yet
      ],
      opened: () => this._connected?.resolve(),
      onFrame: (data) => this._onFrame(data),
      afterResume: (first, gap) => this._afterResume(first, gap),
      resendOutbox: () => this._resendOutbox(),
      finish: (error) => this._finish(error),
      emit: (type, payload) => this.events.emit(type, payload),
    };
  }

  /**
   * A session.update, kept to be sent again until the gateway answers it (it replaces the
   * unanswered ones it overrides: see `Outbox.keep`).
   * @param {Record<string, any>} fields
   */
  _newUpdate(fields) {
    const update = { type: "session.update", id: randomId("upd_"), ...fields };
    this._outbox.keep(update);
    return update;
  }

  _onFrame(data) {
    if (typeof data !== "string") {
      // A binary frame: the answer's audio, outside the seq-checked events (never replayed).
      const frame = parseAudioFrame(data);
      if (frame) this.events.emit("audio", frame);
      return;
    }
    const event = parseEvent(data);
    if (event) this._onEvent(event);
  }

  /** @param {any} event a parsed server event */
  _onEvent(event) {
    if (event.seq > 0) {
      if (event.seq <= this.lastSeq) return; // already seen: never hand the app a duplicate
      this.lastSeq = event.seq;
      this._sinceAck += 1;
      if (this._sinceAck >= this._ackEvery) {
        this._sinceAck = 0;
        this._link.send({ type: "ack", seq: this.lastSeq });
      }
    }
    if (!Object.hasOwn(DEFAULTS, event.type)) {
      // An event type newer than this SDK: only listeners that asked for it by name get it.
      this.events.emit(event.type, event);
      return;
    }
    switch (event.type) {
      case "session.created":
        // Once the session is known, a session.created is a replay (a resume from seq 0, a
        // joined device's replay: its device_id is the starter's), for the app only.
        if (this.session !== null) break;
        this.session = event;
        this.deviceId = event.device_id ?? null;
        this.agent = event.agent;
        this._created?.resolve(event);
        this._link.started();
        break;
      case "agent.transferred":
        this.agent = event.agent;
        break;
      case "session.attached":
        if (this.session === null && this._join) {
          this._joined(event);
          return;
        }
        break;
      case "session.snapshot":
        if (this.session === null && this._join) {
          this._joined(event); // after resume_gap: the join's answer, with no replay
          return;
        }
        break;
      case "session.going_away":
        this._link.goingAway(event.time_left); // the early resume starts; the app hears of it too
        break;
      case "error":
        if (this.session === null && this._created && event.code !== "resume_gap") {
          // session.start refused (invalid_message, forbidden...): not sent again
          this._refused = true;
          this._created.reject(new ServerError(event));
          this._link.started();
        }
        if (event.in_reply_to) {
          this._outbox.answered(event.in_reply_to);
          this.calls.onRefused(event);
        }
        break;
      case "session.updated":
      case "response.truncated":
        if (event.in_reply_to) this._outbox.answered(event.in_reply_to);
        break;
      case "tool.calls":
        for (const call of event.calls) {
          if (call && typeof call === "object") this._outbox.forgetAnswer(call.call_id); // approved
          this.calls.run(call);
        }
        break;
      case "tool.confirm":
        for (const item of event.calls) this.calls.ask(item);
        break;
      case "tool.status":
        this.calls.onStatus(event);
        this._outbox.forgetCall(event.call_id);
        break;
      case "response.created":
        this.latestResponse = event.response_id;
        if (event.in_reply_to) this._outbox.answered(event.in_reply_to);
        break;
    }
    this.events.deliver(event);
  }

  /** The first answer to session.resume (after a resume_gap error, the snapshot) arrived. */
  _afterResume(first, gap) {
    /** @type {ClientCall[]} */
    let openCalls = [];
    /** @type {ConfirmItem[]} */
    let openConfirmations = [];
    if (gap) this.events.deliver(gap);
    if ((first.type === "session.snapshot" || first.type === "session.resumed") && first.agent) {
      this.agent = first.agent;
    }
    if (first.type === "session.resumed" && first.device_id) this.deviceId = first.device_id;
    if (first.type === "session.snapshot" && gap) {
      this.lastSeq = first.last_seq;
      openCalls = first.open_calls;
      openConfirmations = first.open_confirmations;
      this.events.deliver(first); // pending say() iterators throw ResumeGap
    } else if (first.type === "session.resumed") {
      openCalls = first.open_calls;
      openConfirmations = first.open_confirmations;
      this.events.deliver(first);
    } else {
      this._onEvent(first);
    }
    if (this._end || this._link.ws === null) return;
    this._resendOutbox();
    for (const call of openCalls) this.calls.run(call);
    for (const item of openConfirmations) this.calls.ask(item);
  }

  /** What may have been lost on the way out goes again; the gateway applies each message once. */
  _resendOutbox() {
    for (const msg of this._outbox.resend()) this._link.send(msg);
  }

  /**
   * The gateway answered this device's `session.attach` (the `join` option): `session.attached`,
   * or on a gap `session.snapshot` (after the `resume_gap` error, already delivered). The
   * session is known from now on (`start()` resolves); the replay, if any, follows.
   * @param {any} answer
   */
  _joined(answer) {
    const join = /** @type {{sessionId: string, resumeToken: string}} */ (this._join);
    this.deviceId = answer.device_id ?? null;
    this.agent = answer.agent ?? null;
    this.session = {
      session_id: answer.session_id ?? join.sessionId,
      resume_token: join.resumeToken,
      device_id: this.deviceId,
      agent: this.agent,
    };
    if (answer.type === "session.snapshot") this.lastSeq = answer.last_seq;
    this._created?.resolve(/** @type {any} */ (this.session));
    this._link.started();
    this.events.deliver(answer);
    if (this._end) return;
    for (const call of answer.open_calls) this.calls.run(call);
    for (const item of answer.open_confirmations) this.calls.ask(item);
  }

  /** The conversation can go no further: tell everyone waiting. */
  _finish(error) {
    if (this._end) return;
    this._end = error;
    this._link.stop(); // drops the attempt in flight
    this.calls.abortAll(error);
    this._connected?.reject(error);
    this._created?.reject(error);
    this.events.end(error);
    this._link.setState("closed", { error });
  }
}

/**
 * @template T
 * @typedef {{promise: Promise<T>, resolve: (value: T) => void, reject: (error: any) => void}} Deferred
 */

/** A promise settled from outside (at most once; a rejection nobody awaits is not reported). */
function deferred() {
  /** @type {any} */
  let resolve;
  /** @type {any} */
  let reject;
  const promise = new Promise((res, rej) => {
    resolve = res;
    reject = rej;
  });
  promise.catch(() => {});
  return { promise, resolve, reject };
}
