/**
 * @file The public API of a conversation: `GatewayClient` and `connect` (mirrors the Python
 * SDK's `Conversation` and `connect` in `client_sdk/client.py`; gateway-client.js has the
 * overview). Each method is documented here; the machinery behind them is conversation.js's.
 * @module client
 */

import { Conversation } from "./conversation.js";
import { ResumeGap, ServerError } from "./errors.js";
import { makeFunction } from "./functions.js";
import { randomId } from "./protocol.js";
import { RUN_ON_GATEWAY } from "./server-tools.js";

/** @typedef {import("./protocol.js").ServerEvent} ServerEvent */
/** @typedef {import("./protocol.js").SessionCreated} SessionCreated */
/** @typedef {import("./protocol.js").JoinedSession} JoinedSession */
/** @typedef {import("./errors.js").ClientError} ClientError */
/** @typedef {import("./errors.js").SessionClosed} SessionClosed */
/** @typedef {import("./connection.js").ConnectionState} ConnectionState */
/** @typedef {import("./connection.js").ConnectionEvent} ConnectionEvent */
/** @typedef {import("./functions.js").ClientFunctionHandler} ClientFunctionHandler */
/** @typedef {import("./functions.js").ClientFunctionOptions} ClientFunctionOptions */
/** @typedef {import("./server-tools.js").ServerToolHandler} ServerToolHandler */
/** @typedef {import("./confirm.js").ConfirmHandler} ConfirmHandler */
/** @typedef {import("./widgets.js").WidgetHandler} WidgetHandler */
/** @typedef {import("./options.js").GatewayClientOptions} GatewayClientOptions */
/** @typedef {import("./options.js").MessageOptions} MessageOptions */
/** @typedef {import("./options.js").SessionDefaults} SessionDefaults */

/**
 * A conversation with the gateway at `url`, connected (mirrors Python's `async with connect(...)`).
 * @param {string} url
 * @param {GatewayClientOptions} [options]
 * @returns {Promise<GatewayClient>}
 */
export async function connect(url, options = {}) {
  const conv = new GatewayClient(url, options);
  await conv.connect();
  return conv;
}

/** One session with the gateway, across as many sockets as it takes. */
export class GatewayClient {
  /** The same as the module's `RUN_ON_GATEWAY`, for a server-tool handler to return. */
  static RUN_ON_GATEWAY = RUN_ON_GATEWAY;

  /**
   * @param {string} url The gateway's `ws://` or `wss://` URL of `/v1/realtime`. A socket that
   *   resumes the session adds `session=<session_id>` to its query (`resumeUrl`).
   * @param {GatewayClientOptions} [options]
   */
  constructor(url, options = {}) {
    /** the machinery: the session, its socket, its events */
    this._conv = new Conversation(url, options);
  }

  /**
   * The `session.created` event, or `null` before the session starts. On a device that
   * joined the session (the `join` option), what the SDK made of the join's answer: its
   * `session_id`, `resume_token`, `device_id` and `agent`.
   * @type {SessionCreated | JoinedSession | null}
   */
  get session() {
    return this._conv.session;
  }

  /**
   * This device's id among the session's devices (`session.created`'s, `session.attached`'s,
   * or the latest `session.resumed`'s), or `null` (not started yet, or a gateway that names
   * none). Every resume names it, with the client functions registered then, so that a
   * reconnect replaces this device's socket only and the session's other devices stay on.
   * @type {string | null}
   */
  get deviceId() {
    return this._conv.deviceId;
  }

  /**
   * The agent the session is with: `session.created`'s, then another after each
   * `agent.transferred`; `null` before the session starts. @type {string | null}
   */
  get agent() {
    return this._conv.agent;
  }

  /** The cursor: the highest `seq` received. @type {number} */
  get lastSeq() {
    return this._conv.lastSeq;
  }

  /** How many resumes succeeded so far. @type {number} */
  get reconnects() {
    return this._conv.reconnects;
  }

  /** The connection's state. @type {ConnectionState} */
  get state() {
    return this._conv.state;
  }

  // ----------------------------------------------------------------------- lifecycle

  /**
   * Open the socket (subprotocol `gateway.v1`). Calling it again returns the same promise.
   * A dial that fails (or gets no answer within `attemptTimeout`) is tried again with the
   * reconnects' backoff, until a socket opens or `giveUpAfter` passes.
   * @returns {Promise<void>}
   * @throws {SessionClosed} the gateway could not be reached for `giveUpAfter` (at the first
   *   failure without `reconnect`), the token function failed, or `close()` came first.
   */
  connect() {
    return this._conv.connect();
  }

  /**
   * Open the session (`say()` and `post()` do it when needed; it connects first if needed).
   * Every client function registered by then is declared in `session.start`. When the socket
   * drops before `session.created` (nothing is lost yet), `session.start` is sent again on a
   * new socket, with the reconnects' backoff.
   *
   * With the `join` option it joins that session instead: `session.attach` (with the
   * client functions registered by then, and `last_seq` 0) goes in place of `session.start`,
   * and it resolves once the gateway answers (`session.attached`, or `resume_gap` then
   * `session.snapshot`), with the `JoinedSession`; the events the gateway still has are
   * replayed to the listeners, and the calls still open for this device's functions run.
   * @returns {Promise<SessionCreated | JoinedSession>}
   * @throws {ServerError} the gateway refused `session.start`.
   * @throws {SessionClosed} the session ended first, or the gateway refused the join (4004
   *   unknown session, 4008 expired, 4003 another principal's).
   */
  start() {
    return this._conv.start();
  }

  /**
   * Attach to a session an earlier client started (a page before its reload, say) instead
   * of starting one: open a socket and send `session.resume`. Call it first, in place of
   * `connect()` and `start()`. The events after `lastSeq` are replayed to the listeners
   * (or `resume_gap` and `session.snapshot` when the gateway no longer has them all), and
   * the calls still open are run, as after any resume. It does not count in `reconnects`.
   * @param {SessionCreated | JoinedSession} session That session's `session.created` (its
   *   `session_id` and `resume_token` at least), kept by the app; with its `device_id`, the
   *   resume replaces only that device's socket (a page reloaded), not the other devices'.
   * @param {number} [lastSeq] The highest `seq` the app has handled (0: all the gateway has).
   * @returns {Promise<void>}
   * @throws {SessionClosed} the gateway refused (4001, 4004, 4008) or could not be reached
   *   (one attempt, within `attemptTimeout`); this client is closed then: start a new
   *   session with a new client.
   */
  resume(session, lastSeq = 0) {
    return this._conv.resume(session, lastSeq);
  }

  /**
   * Try to reach the gateway now, instead of at the end of the wait between two reconnect
   * attempts: when the browser's `online` event fires, the page becomes visible again, or the
   * user clicks "Retry now" in a "Reconnecting…" banner. The next attempt starts at once; if
   * it fails too, the SDK waits again, as long as the backoff says (it keeps growing), and
   * the app may call this again. It never ends the conversation nor starts a second series of
   * attempts, and `giveUpAfter` still counts from the first failed attempt. It works between
   * the attempts of a first connect or start as well.
   *
   * ```js
   * addEventListener("online", () => conv.retryNow());
   * retryButton.onclick = () => conv.retryNow();
   * ```
   * @returns {boolean} true when it cut a wait short; false when nothing was waiting:
   *   connected, closed, an attempt already in flight, or nothing started yet.
   */
  retryNow() {
    return this._conv.retryNow();
  }

  /**
   * End the session: the socket is closed with code 1000, which tells the gateway the
   * client is done. With several devices on the session, only this device leaves: the
   * session ends with the last one. Pending `say()` iterators and `events()` throw `SessionClosed` (1000).
   * Between reconnect attempts (or during one, which is dropped) there is no socket to
   * close: `DELETE /v1/sessions/{id}` (the resume token as its credential) ends the session
   * at once all the same; a request not answered within 0.8 s is abandoned, and the gateway
   * then ends the session after its `session_ttl`. A device that joined (the `join` option)
   * sends no DELETE, which would end the session for every device: without a socket it just
   * stops, and the gateway drops its device when the resume window runs out.
   * @returns {Promise<void>} settled once the socket reports its close, or the DELETE is
   *   answered (at most ~1 s).
   */
  close() {
    return this._conv.close();
  }

  // ----------------------------------------------------------------------- functions

  /**
   * Let the model call `handler` on this device. Registering after the session started
   * declares the functions again with `session.update`.
   * @param {string} name The name the model calls (`^[a-z][a-z0-9_]*$`, at most 64 characters).
   * @param {ClientFunctionHandler} handler
   * @param {ClientFunctionOptions} [options]
   */
  clientFunction(name, handler, options = {}) {
    this._conv.calls.functions.set(name, makeFunction(name, handler, options));
    this._conv.declareFunctions();
  }

  /**
   * Handle the server tools the model calls in manual tool mode (`tool.calls` with
   * `kind: "server"`). One handler for every such call; a new one replaces it, `null` removes
   * it. `handler(call, { signal })` returns the call's output (or a Promise of it), throws
   * (an error result, `"TypeError: ..."`), or returns `RUN_ON_GATEWAY` (or
   * `new RunOnGateway(args)`, edited arguments) to have the gateway run the tool (`tool.run`),
   * whose outcome then becomes the call's result. `signal` aborts at the call's deadline or on
   * close. Without a handler every such call runs on the gateway, as in auto mode. Each call id
   * is handled once; a `tool.run` the gateway has not confirmed is sent again after a resume;
   * one it refuses (arguments off the tool's schema) gets the refusal as the call's error
   * result, so the response goes on.
   * @param {ServerToolHandler | null} handler
   */
  onServerTool(handler) {
    if (handler !== null && typeof handler !== "function") {
      throw new TypeError("onServerTool: the handler must be a function (or null)");
    }
    this._conv.calls.serverTool = handler;
  }

  /**
   * Ask the user about the calls of tools marked `confirm` (`tool.confirm`). One handler for
   * every such call; a new one replaces it, `null` removes it. `handler(item, { signal })` gets
   * the `ConfirmItem` (`prompt`, the sentence to show, such as "Cancel order 1234?"; `tool`,
   * `display_name`, `args`, `timeout`...) and returns (or resolves to) `true` (approve),
   * `false` (decline), `{ approved: true, args }` (approve with edited arguments) or
   * `{ approved: false, reason }` (decline; the model hears the reason). A throw, any other
   * value, or no answer by the item's timeout (`signal` aborts then) declines the call, with a
   * reason that says so. Without a handler every such call is declined with the reason "this
   * client cannot ask the user": the SDK never approves by itself.
   *
   * The answer goes in a `tool.confirmation`. An approved server tool then runs on the gateway
   * (`tool.status`); an approved client function's call arrives in `tool.calls` and runs as
   * usual; a declined call fails (`tool.status` `failed`, `code: "declined"`). Each call id is
   * asked once, also when a resume offers it again in `open_confirmations`; an answer the
   * gateway has not confirmed is sent again after a resume. Edited arguments the gateway
   * refuses (off the tool's schema) decline the call, with the refusal as the reason.
   * @param {ConfirmHandler | null} handler
   */
  onConfirm(handler) {
    if (handler !== null && typeof handler !== "function") {
      throw new TypeError("onConfirm: the handler must be a function (or null)");
    }
    this._conv.calls.confirm = handler;
  }

  /**
   * Show the calls of widget tools to the user (`tool.calls` whose call has a `widget`). One
   * handler for every such call that no client function of its name answers; a new one
   * replaces it, `null` removes it. `handler(call, { signal })` gets the `ClientCall`
   * (`call.widget`: `type`, `prompt`, `options`, `fields`) and returns (or resolves to) the
   * user's answer, the call's output: `{ choice: "<option>" }` for `choice`,
   * `{ confirmed: true | false }` for `confirm`, `{ <field name>: value, ... }` for `form`
   * (numbers as numbers, empty optional fields left out). The gateway checks it against the
   * tool's output schema. A throw is an error result. `signal` aborts at the call's deadline
   * (an error result says the user did not answer in time), on close, or when a `tool.status`
   * ends the call before the answer (`cancelled`, `expired`, `failed`: nothing is sent). Without
   * a handler such a call gets the "no function" error result. Each call id is shown once.
   * @param {WidgetHandler | null} handler
   */
  onWidget(handler) {
    if (handler !== null && typeof handler !== "function") {
      throw new TypeError("onWidget: the handler must be a function (or null)");
    }
    this._conv.calls.widget = handler;
  }

  /**
   * Change the session's default `toolChoice`, `maxSteps` or `toolMode` (see the constructor's
   * options); an absent one stays as it is. They apply to the responses that start after it.
   * Before the session starts they go in `session.start`; after, in a `session.update` (sent
   * again after a resume until the gateway answers it), whose id is returned: `session.updated`
   * answers it, or an `error` naming it in `in_reply_to` (a tool name the session does not
   * have, say), which leaves the defaults as they were.
   * @param {SessionDefaults} defaults
   * @returns {Promise<string | null>} The update's id; `null` before the session started.
   * @throws {SessionClosed} the session ended.
   */
  async update(defaults = {}) {
    return this._conv.update(defaults);
  }

  // ----------------------------------------------------------------------- conversation

  /**
   * Send a user message and yield the text of the response to it, as it streams; ends at
   * that response's `response.done`. The text of consecutive model steps (before and after a
   * tool call) is joined with a space unless one side already has one.
   * @param {string} text
   * @param {MessageOptions} [options] For this message's response only.
   * @returns {AsyncGenerator<string, void, void>}
   * @throws {ServerError} the gateway refused the message or the response failed.
   * @throws {ResumeGap} events were lost across a reconnect.
   * @throws {SessionClosed} the session ended.
   */
  async *say(text, options = {}) {
    await this.start();
    const inbox = this._conv.subscribe();
    try {
      const msgId = await this.post(text, options);
      let responseId = null;
      let stepEnded = false; // a text.done came: the next delta starts a new model step
      let last = ""; // the last character yielded
      for (;;) {
        const event = /** @type {ServerEvent} */ (await inbox.next()); // throws the conversation's end
        switch (event.type) {
          case "response.created":
            if (event.in_reply_to === msgId) responseId = event.response_id;
            break;
          case "text.delta":
            if (responseId !== null && event.response_id === responseId && event.delta) {
              // Steps join with a space (unless one side has one), as the web demo shows them.
              const space = stepEnded && last && !/\s/.test(last) && !/^\s/.test(event.delta);
              stepEnded = false;
              last = event.delta.slice(-1);
              yield space ? ` ${event.delta}` : event.delta;
            }
            break;
          case "text.done":
            if (responseId !== null && event.response_id === responseId) stepEnded = true;
            break;
          case "error":
            if (event.in_reply_to === msgId || (responseId !== null && event.response_id === responseId)) {
              throw new ServerError(event);
            }
            break;
          case "session.snapshot":
            throw new ResumeGap(event);
          case "response.done":
            if (responseId !== null && event.response_id === responseId) return;
            break;
        }
      }
    } finally {
      this._conv.events.unsubscribe(inbox);
    }
  }

  /**
   * Send a user message without waiting for the reply; return its id. The reply arrives as
   * events: `response.created` names the message in `in_reply_to`. A message not yet
   * answered when the socket drops is sent again after the resume, options included; the
   * gateway counts it once.
   * @param {string} text
   * @param {MessageOptions} [options] For this message's response only.
   * @returns {Promise<string>}
   */
  async post(text, options = {}) {
    if (typeof options.tools === "string") throw new TypeError("tools is a list of tool names, not one name");
    await this.start();
    return this._conv.post(text, options);
  }

  /**
   * Every event of the session from now on, in order, once each (what `on("*")` gets).
   * @returns {AsyncGenerator<ServerEvent, void, void>}
   * @throws {SessionClosed} when the session ends.
   */
  async *events() {
    const inbox = this._conv.subscribe();
    try {
      for (;;) {
        yield /** @type {ServerEvent} */ (await inbox.next()); // throws the conversation's end
      }
    } finally {
      this._conv.events.unsubscribe(inbox);
    }
  }

  /**
   * Voice barge-in: the user heard only the first `heardChars` characters of the latest
   * response's text (its deltas joined, in code points: `[...text].length`). The gateway
   * stops it if it still runs and keeps only that much of it in the history, so the model
   * does not believe it said what was never heard. Sent again after a resume until the
   * gateway answers (`response.truncated`, or an `error` naming the returned id).
   * @param {number} heardChars
   * @param {{responseId?: string}} [options] The response; default: the latest one this
   *   client saw start (`latestResponse`).
   * @returns {Promise<string>} The message's id.
   * @throws {ClientError} no response started yet.
   */
  async truncate(heardChars, { responseId } = {}) {
    return this._conv.truncate(heardChars, responseId);
  }

  // ----------------------------------------------------------------------- voice

  /**
   * Turn the session's audio on, change it, or turn it off (`false`): before the session
   * starts, it goes in `session.start`; after, in a `session.update` (sent again after a
   * resume until `session.updated` answers, which carries the settings applied in `audio`).
   * @param {Record<string, any> | false} audio `{input_rate, output_rate, voice,
   *   turn_detection, silence_ms, interrupt_min_ms}`, each optional (docs/protocol.md).
   * @returns {string | null} the session.update's id; null when it went in session.start.
   */
  setAudio(audio) {
    return this._conv.setAudio(audio);
  }

  /**
   * Send one binary frame of microphone audio: PCM16 little-endian mono at the session's
   * `input_rate`, 20 to 100 ms of it. Dropped (false) while the socket is not open: live
   * audio is not queued across a reconnect.
   * @param {Int16Array | ArrayBuffer} pcm
   * @returns {boolean} whether it went out.
   */
  sendAudio(pcm) {
    return this._conv.sendAudio(pcm);
  }

  /**
   * End the user's spoken turn now (`input_audio.commit`: push-to-talk released, in manual
   * turn detection). Sent only while connected, like the audio.
   * @returns {string | null} its id, or null when not connected.
   */
  commitAudio() {
    return this._sendNow({ type: "input_audio.commit", id: randomId("cmt_") });
  }

  /**
   * Drop the audio of the user's turn in progress (`input_audio.clear`; `input_audio.cleared`
   * answers). Sent only while connected.
   * @returns {string | null} its id, or null when not connected.
   */
  clearAudio() {
    return this._sendNow({ type: "input_audio.clear", id: randomId("clr_") });
  }

  /**
   * After a barge-in (`audio.flush`): the user heard the first `audioEndMs` ms of the
   * response's audio. Like `truncate()`, the history keeps only what was heard, and it is
   * sent again after a resume until the gateway answers.
   * @param {number} audioEndMs ms from the response audio's first sample.
   * @param {{responseId?: string}} [options] Default: the latest response (`latestResponse`).
   * @returns {Promise<string>} The message's id.
   * @throws {ClientError} no response started yet.
   */
  async truncateAudio(audioEndMs, { responseId } = {}) {
    return this._conv.truncateAudio(audioEndMs, responseId);
  }

  /** Send `msg` if the socket is open; its id, or null. */
  _sendNow(msg) {
    return this._conv.sendNow(msg) ? msg.id : null;
  }

  /** The id of the latest response that started, or `null`. @type {string | null} */
  get latestResponse() {
    return this._conv.latestResponse;
  }

  /**
   * Stop the running response (barge-in). Sent only while connected: a cancel is not resent.
   * @param {string} [responseId] Cancel only if this is the running response.
   * @returns {Promise<void>}
   */
  async cancel(responseId) {
    this._conv.cancel(responseId);
  }

  /**
   * Listen to server events of one `type` (`"*"`: every known type), or to `"connection"`
   * (state changes). Listener errors are reported, never thrown into the SDK.
   * @overload
   * @param {"connection"} type
   * @param {(event: ConnectionEvent) => void} listener
   * @returns {() => void}
   */
  /**
   * @overload
   * @param {string} type
   * @param {(event: ServerEvent) => void} listener
   * @returns {() => void}
   */
  /**
   * @param {string} type
   * @param {(event: any) => void} listener
   * @returns {() => void} Call it to stop listening.
   */
  on(type, listener) {
    return this._conv.events.on(type, listener);
  }
}
