/**
 * @file What a `GatewayClient` is given: its options (with their defaults), the options of one
 * user message and the session defaults `update()` changes, each as the wire fields they
 * become (mirrors the keyword arguments of the Python SDK's `Conversation`).
 * @module options
 */

import { ClientError } from "./errors.js";
import { compact } from "./protocol.js";
import { ATTEMPT_TIMEOUT_MS, GIVE_UP_AFTER_MS } from "./resume.js";

/** @typedef {"auto" | "manual"} ToolMode */

/**
 * @typedef {object} GatewayClientOptions
 * @property {typeof WebSocket} [WebSocketImpl] The WebSocket class (default `globalThis.WebSocket`).
 * @property {string | (() => string | Promise<string>)} [token] A client token (your backend
 *   mints one with `POST /v1/sessions`), or a function returning a fresh one: it is called
 *   before every connect and reconnect, so a session outlives its tokens. Sent as the
 *   subprotocol `gateway.token.<token>`, which keeps it out of URLs and access logs.
 * @property {string} [agent] The agent to talk to (the gateway's default when absent).
 * @property {string} [instructions] Extra instructions for this session.
 * @property {Record<string, any>} [metadata] Anything the app wants kept with the session.
 * @property {boolean} [reconnect] Resume after a dropped socket, and retry a first connect
 *   that fails and a session start whose socket dropped before `session.created` (default
 *   true); `false` ends the conversation instead.
 * @property {number} [maxReconnectDelay] The longest wait between reconnect attempts, ms (default 10000).
 * @property {number} [attemptTimeout] How long one attempt to reach the gateway may take, ms
 *   (default 10000), counted from its dial: the upgrade, then the gateway's answer to the
 *   `session.start` or `session.resume` it sends. Then its socket is closed with 4000 (not
 *   1000, which would end the session) and the attempt counts as failed.
 * @property {number} [giveUpAfter] After how long of attempts failing in a row the SDK stops
 *   trying, ms (default 120000, the gateway's default `session_ttl`, after which a resume
 *   cannot succeed anyway): the conversation ends with `SessionClosed` 1006, reason
 *   "could not reach the gateway for 120 s". A socket whose upgrade the gateway answers
 *   starts the count anew.
 * @property {number} [ackEvery] Acknowledge received events after this many (default 64).
 * @property {boolean} [segments] Voice: the gateway also sends each answer's text as
 *   speakable `text.segment` events (whole sentences or clauses, for a speech synthesizer).
 * @property {Record<string, any>} [audio] Voice on the socket: `{input_rate, output_rate,
 *   voice, turn_detection, silence_ms, interrupt_min_ms}`, each optional (docs/voice.md);
 *   the answers' audio then comes as `audio` events (see `GatewayClient.setAudio`).
 * @property {string | null} [timeZone] The user's IANA time zone, for tools that tell the time
 *   (the gateway's `get_current_time`). Default: the browser's own
 *   (`Intl.DateTimeFormat().resolvedOptions().timeZone`); `null` sends none.
 * @property {string} [toolChoice] The session's default for which tools the model may call in
 *   a response: `"auto"` (its choice; the gateway's default), `"none"`, `"required"` (at least
 *   one) or one tool's name. A forced choice holds for the first model step of a response;
 *   the steps after it are `"auto"`. Sent as `tool_choice` in `session.start`.
 * @property {JoinOptions} [join] Join a session another device started (or joined) instead
 *   of starting one: `start()` sends `session.attach` on the first socket, with the client
 *   functions registered by then (the calls of those come to this device; the session's
 *   other devices stay attached), and resolves once `session.attached` answers (or
 *   `resume_gap` and `session.snapshot`); the events the gateway still has are replayed.
 *   The session's options (`agent`, `instructions`, `toolChoice`...) are the starter's: a
 *   join ignores them. A refusal closes the socket (4004 unknown session, 4008 expired,
 *   4003 another principal's...) and `start()` rejects with `SessionClosed`.
 * @property {number} [maxSteps] The session's default for how many model steps a response may
 *   take (each tool round is one): 1 up to the gateway's limit (`session.limits.max_steps`,
 *   also its default). Sent as `max_steps`.
 * @property {ToolMode} [toolMode] The session's default tool mode: `"auto"` (the gateway runs
 *   its server tools; the gateway's default) or `"manual"` (every tool call the model asks
 *   for, server tools included, comes to the client: see `onServerTool`). Sent as `tool_mode`.
 */

/**
 * The session a device joins (`GatewayClientOptions.join`): what the device that started it
 * knows as `session.session_id` and `session.resume_token`.
 * @typedef {object} JoinOptions
 * @property {string} sessionId
 * @property {string} resumeToken
 */

/**
 * Options of one user message, for its response only (`say()`, `post()`).
 * @typedef {object} MessageOptions
 * @property {string} [toolChoice] As the session's `toolChoice` (its default when absent).
 * @property {string[]} [tools] The only tools the model may use for this response, by name
 *   (some of the session's); every tool of the session when absent.
 * @property {number} [maxSteps] The most model steps this response may take (the session's
 *   default when absent).
 * @property {ToolMode} [toolMode] `"auto"` or `"manual"` for this response only (the
 *   session's default when absent).
 */

/**
 * New session defaults (`update()`); an absent one stays as it is.
 * @typedef {object} SessionDefaults
 * @property {string} [toolChoice]
 * @property {number} [maxSteps]
 * @property {ToolMode} [toolMode]
 */

/**
 * The client's options checked, with their defaults: the fields of `session.start` and the
 * reconnector's settings.
 * @param {GatewayClientOptions} options
 * @throws {ClientError} there is no WebSocket class.
 */
export function readOptions(options) {
  const {
    WebSocketImpl = globalThis.WebSocket,
    token,
    agent,
    instructions,
    metadata,
    reconnect = true,
    maxReconnectDelay = 10_000,
    attemptTimeout = ATTEMPT_TIMEOUT_MS,
    giveUpAfter = GIVE_UP_AFTER_MS,
    ackEvery = 64,
    toolChoice,
    maxSteps,
    toolMode,
    timeZone = defaultTimeZone(),
    segments,
    audio,
    join,
  } = options;
  if (typeof WebSocketImpl !== "function") {
    throw new ClientError("no WebSocket class here: pass options.WebSocketImpl");
  }
  if (join != null && (typeof join?.sessionId !== "string" || typeof join?.resumeToken !== "string")) {
    throw new ClientError("join: {sessionId, resumeToken}, both strings");
  }
  return {
    WebSocketImpl,
    join: join == null ? null : { sessionId: join.sessionId, resumeToken: join.resumeToken },
    startFields: compact({
      agent,
      instructions,
      metadata,
      tool_choice: toolChoice,
      max_steps: maxSteps,
      tool_mode: toolMode,
      time_zone: timeZone,
      segments,
      audio,
    }),
    ackEvery: Math.max(1, Math.floor(Number(ackEvery)) || 1),
    reconnector: {
      token,
      reconnect: Boolean(reconnect),
      maxDelay: Math.max(0, Number(maxReconnectDelay)),
      attemptTimeout: Math.max(0, Number(attemptTimeout)),
      giveUpAfter: Math.max(0, Number(giveUpAfter)),
    },
  };
}

/**
 * The fields of a `user.message` its options set.
 * @param {MessageOptions} options
 */
export function messageFields({ toolChoice, tools, maxSteps, toolMode }) {
  return compact({
    tool_choice: toolChoice,
    tools: tools == null ? tools : [...tools],
    max_steps: maxSteps,
    tool_mode: toolMode,
  });
}

/**
 * The fields of a `session.update` (or of `session.start`) new defaults set.
 * @param {SessionDefaults} defaults
 */
export function defaultsFields({ toolChoice, maxSteps, toolMode }) {
  return compact({ tool_choice: toolChoice, max_steps: maxSteps, tool_mode: toolMode });
}

/** The runtime's own IANA time zone (a browser's, Node's), or `undefined` if it has none. */
function defaultTimeZone() {
  try {
    return Intl.DateTimeFormat().resolvedOptions().timeZone || undefined;
  } catch {
    return undefined;
  }
}
