/**
 * @file The browser client SDK of the conversation gateway: one conversation over one
 * resilient WebSocket (protocol `gateway.v1`, see docs/protocol.md). It mirrors the Python
 * SDK (`client_sdk/client.py`): client functions, streamed replies, and a socket that
 * survives drops. A dependency-free ES module: it runs unchanged in browsers, and in Node
 * with an injected WebSocket class (`options.WebSocketImpl`).
 *
 * ```js
 * import { GatewayClient, SessionClosed } from "./gateway-client.js";
 *
 * const conv = new GatewayClient("ws://127.0.0.1:8000/v1/realtime");
 * conv.clientFunction("get_battery_level", async () => ({ level: 0.82, charging: false }), {
 *   description: "Read the device's battery level (0 to 1) and whether it is charging.",
 *   timeout: 15,
 * });
 * conv.on("connection", ({ state, reconnects }) => console.log(state, reconnects));
 * conv.on("tool.status", (event) => console.log(event.tool, event.status));
 *
 * await conv.connect();
 * for await (const delta of conv.say("what's my battery level?")) {
 *   output.textContent += delta;
 * }
 * await conv.close(); // code 1000: the gateway ends the session at once
 * ```
 *
 * - **Events.** `conv.on(type, listener)` receives every server event of that type (or of
 *   every known type with `"*"`), in order and once each: events are checked by `seq`, so a
 *   replay after a reconnect never hands a duplicate to the app. The connection-level events
 *   `session.resumed`, `session.snapshot` and the `resume_gap` error (they have no `seq`)
 *   are delivered too. `conv.on("connection", ...)` reports the socket's state.
 * - **Client functions.** `conv.clientFunction(name, handler, options)` declares a function
 *   in `session.start` (or `session.update` when registered later). When the model calls
 *   it, `handler(args, { signal, call })` runs, concurrently with the other calls of the
 *   batch, and its value (or a Promise of it) is sent back as the result. A thrown error
 *   becomes an error result (`"TypeError: ..."`); a handler still running at the call's
 *   deadline gets an error result too, and `signal` is aborted. Each call id runs once.
 * - **Manual tool mode.** With `toolMode: "manual"` (per session, or per message in `say()`
 *   and `post()`), every tool call the model asks for comes to the client, the gateway's
 *   server tools included (`tool.calls` with `kind: "server"`). `conv.onServerTool(handler)`
 *   decides: `handler(call, { signal })` returns the call's output (or a Promise of it),
 *   throws for an error result, or returns `RUN_ON_GATEWAY` (or `new RunOnGateway(args)`,
 *   edited arguments) to have the gateway run the tool (`tool.run`), whose outcome becomes
 *   the call's result. Without a handler every server-kind call runs on the gateway, as in
 *   auto mode. A server-kind call never goes to the client functions.
 * - **Confirmation.** A call of a tool marked `confirm` waits for the user's approval: the
 *   gateway sends `tool.confirm`, and `conv.onConfirm(handler)` asks the user:
 *   `handler(item, { signal })` returns `true` (approve), `false` (decline),
 *   `{ approved: true, args }` (approve with edited arguments) or
 *   `{ approved: false, reason }` (decline; the model hears why), or a Promise of one. It
 *   runs within the item's timeout (then `signal` aborts and the call is declined, saying
 *   so). Without a handler every such call is declined ("this client cannot ask the user"):
 *   the SDK never approves by itself.
 * - **Widgets.** A widget tool's call (`tool.calls` with a `widget`: a choice, a yes/no
 *   question or a form) is answered by the user. Unless a client function of its name is
 *   registered, `conv.onWidget(handler)` shows it: `handler(call, { signal })` returns the
 *   user's answer (`{ choice }`, `{ confirmed }` or the form's values), which is the call's
 *   output. A throw is an error result; `signal` aborts at the call's deadline, on close, or
 *   when a `tool.status` ends the call first (`cancelled`, `expired`, `failed`), and then nothing
 *   is sent. Without either handler the call gets the usual "no function" error result.
 * - **Reconnects.** A socket that drops with a code other than 1000, 1008, 4001, 4003, 4004, 4008
 *   or 4009 is resumed with exponential backoff and full jitter (50 ms, doubling, up to
 *   `maxReconnectDelay`). A first connect that fails, and a start whose socket drops before
 *   `session.created` (nothing is lost yet: `session.start` goes again on a new socket), are
 *   retried the same way. Each attempt must be answered within `attemptTimeout` of its dial
 *   (or its socket is closed with 4000 and it counts as failed); after `giveUpAfter` of
 *   failed attempts in a row the conversation ends with `SessionClosed` 1006 ("could not
 *   reach the gateway for 120 s"). `close()` between attempts ends the gateway's session all
 *   the same, with a short-lived socket. Results and `tool.run` requests the gateway has not
 *   confirmed, and user messages (options included) and `session.update` messages it has not
 *   answered, are sent again (the gateway applies each once), and so are `tool.confirmation`
 *   answers no `tool.status` (or `tool.calls`) has confirmed yet. Calls that opened while the
 *   client was away are run, and confirmations still open (`open_confirmations`) are asked,
 *   once each. When the gateway no longer has every missed event, pending `say()` iterators
 *   throw `ResumeGap`, whose `snapshot` holds the transcript to rebuild from. Every socket
 *   that resumes a session (a reconnect, `resume()`, the one `close()` ends it with) adds
 *   `session=<session_id>` to the URL's query (see `resumeUrl`), so that a load balancer
 *   routing by session (deploy/nginx.conf) sends it to the node that drives the session.
 * - **Errors.** Everything the SDK throws derives from `ClientError`: `ServerError` (the
 *   gateway answered with an `error` event), `SessionClosed` (the session cannot go on),
 *   `ResumeGap` (events were lost across a reconnect).
 *
 * @module gateway-client
 */

// ------------------------------------------------------------------------- typed events

/**
 * @typedef {object} ToolInfo
 * @property {string} name
 * @property {"client" | "server"} kind
 * @property {"sync" | "async"} execution
 * @property {"when_idle" | "interrupt" | "silent" | null} delivery
 * @property {string} display_name
 * @property {string} description
 */

/**
 * @typedef {object} Limits
 * @property {number} max_message_chars
 * @property {number} max_queued_messages
 * @property {number} max_steps
 * @property {number} ws_max_size Bytes.
 * @property {number} client_call_timeout Seconds.
 * @property {number} [max_messages_per_second] Frames per second the socket may send on
 *   average (absent: no limit); a ping sent after the previous pong is free.
 * @property {number} [max_message_burst] Frames the socket may send at once above that rate.
 * @property {number} [max_tool_result_size] Bytes of JSON a result's output or error may
 *   have (absent: no limit); a larger one gets error invalid_result and fails its call.
 */

/**
 * One call of a `tool.calls` batch (or of `open_calls`) the client answers.
 * @typedef {object} ClientCall
 * @property {string} call_id
 * @property {string} tool
 * @property {string} display_name
 * @property {Record<string, any>} args
 * @property {number} deadline Unix time, seconds.
 * @property {number} timeout Seconds left when the call was sent.
 * @property {"client" | "server"} kind `client`: a client function; `server`: a server tool
 *   offered in manual tool mode (`onServerTool`).
 * @property {Widget} [widget] A widget tool's call: the user answers it (`onWidget`).
 */

/**
 * One field of a `form` widget.
 * @typedef {object} WidgetField
 * @property {string} name The key of the value in the output (`^[a-z][a-z0-9_]*$`).
 * @property {string} label What the user reads next to the input.
 * @property {"text" | "number"} [type] Default `text`; a `number` value goes as a JSON number.
 * @property {boolean} [required] Default `true`; an empty optional field is left out.
 */

/**
 * What the user is asked in a widget tool's call; the answer is the call's output:
 * `choice` → `{ choice: "<the option picked>" }`, `confirm` → `{ confirmed: true | false }`,
 * `form` → `{ <field name>: value, ... }`.
 * @typedef {object} Widget
 * @property {"choice" | "confirm" | "form"} type
 * @property {string} prompt The question, its `{arg}` placeholders filled in by the gateway.
 * @property {string[]} [options] `choice`: the options to pick from.
 * @property {WidgetField[]} [fields] `form`: the fields to fill in.
 */

/**
 * A call of a tool marked `confirm`, waiting for the user's approval (`tool.confirm`, or
 * `open_confirmations` after a resume); `onConfirm` answers it.
 * @typedef {object} ConfirmItem
 * @property {string} call_id
 * @property {string} tool
 * @property {string} display_name
 * @property {Record<string, any>} args The arguments the call would run with.
 * @property {string} prompt A sentence to ask the user, e.g. "Cancel order 1234?".
 * @property {number} deadline Unix time, seconds: unanswered by then, the call expires.
 * @property {number} timeout Seconds left when the item was sent.
 * @property {"client" | "server"} kind Where the call runs once approved (`client` when the
 *   server omits it).
 */

/**
 * @typedef {object} TranscriptEntry
 * @property {"user" | "assistant"} role
 * @property {string} text
 */

/**
 * @typedef {object} Usage
 * @property {number} input_tokens
 * @property {number} output_tokens
 */

/**
 * @typedef {object} SessionCreated
 * @property {"session.created"} type
 * @property {number} seq
 * @property {string} session_id
 * @property {string} resume_token
 * @property {string} agent
 * @property {number} protocol_version
 * @property {ToolInfo[]} tools
 * @property {Limits | null} limits
 */

/**
 * @typedef {object} SessionUpdated
 * @property {"session.updated"} type
 * @property {number} seq
 * @property {ToolInfo[]} tools
 * @property {string | null} in_reply_to
 */

/**
 * Connection-level (no `seq`): a resume succeeded; the replay follows.
 * @typedef {object} SessionResumed
 * @property {"session.resumed"} type
 * @property {0} seq
 * @property {string} session_id
 * @property {number} replayed_from
 * @property {number} last_seq
 * @property {string | null} agent The agent the session is with now.
 * @property {ClientCall[]} open_calls
 * @property {ConfirmItem[]} open_confirmations Calls still waiting for the user's approval.
 */

/**
 * Connection-level (no `seq`): sent after the `resume_gap` error instead of a replay.
 * @typedef {object} SessionSnapshot
 * @property {"session.snapshot"} type
 * @property {0} seq
 * @property {string} session_id
 * @property {number} last_seq
 * @property {string | null} agent The agent the session is with now.
 * @property {TranscriptEntry[]} transcript
 * @property {ClientCall[]} open_calls
 * @property {ConfirmItem[]} open_confirmations
 */

/**
 * The agent handed the conversation to another (`transfer_to_agent`); it answers from now on.
 * @typedef {object} AgentTransferred
 * @property {"agent.transferred"} type
 * @property {number} seq
 * @property {string} agent The agent the session is with now.
 * @property {string} previous_agent
 * @property {ToolInfo[]} tools The session's tools now.
 * @property {string | null} reason Why, in the previous agent's words.
 * @property {string | null} response_id The response in which it happened.
 */

/**
 * Voice sessions (`segments`): a speakable piece of the answer's text, a whole sentence or
 * clause; a step's segments joined are its text.
 * @typedef {object} TextSegment
 * @property {"text.segment"} type
 * @property {number} seq
 * @property {string} response_id
 * @property {string} text
 */

/**
 * The answer to `truncate()`: the history keeps only what was heard.
 * @typedef {object} ResponseTruncated
 * @property {"response.truncated"} type
 * @property {number} seq
 * @property {string} response_id
 * @property {number} heard_chars
 * @property {string | null} in_reply_to
 */

/**
 * @typedef {object} ResponseCreated
 * @property {"response.created"} type
 * @property {number} seq
 * @property {string} response_id
 * @property {string | null} in_reply_to The `user.message` id it answers.
 * @property {string | null} call_id Set when an async tool's result started it.
 */

/**
 * The model request failed before the model said anything; the gateway sends it again after
 * `delay` seconds (nothing of the response is lost or repeated).
 * @typedef {object} ResponseRetrying
 * @property {"response.retrying"} type
 * @property {number} seq
 * @property {string} response_id
 * @property {number} attempt Which retry this is: 1 for the first.
 * @property {number} delay Seconds before the request is sent again.
 * @property {string} reason Why the last attempt failed, in a few words (`HTTP 429`...).
 */

/**
 * @typedef {object} TextDelta
 * @property {"text.delta"} type
 * @property {number} seq
 * @property {string} response_id
 * @property {string} delta
 */

/**
 * @typedef {object} TextDone
 * @property {"text.done"} type
 * @property {number} seq
 * @property {string} response_id
 * @property {string} text
 */

/**
 * @typedef {object} ToolCalls
 * @property {"tool.calls"} type
 * @property {number} seq
 * @property {string} response_id
 * @property {ClientCall[]} calls
 */

/**
 * Ask the user to approve these calls (`onConfirm`); the response waits.
 * @typedef {object} ToolConfirm
 * @property {"tool.confirm"} type
 * @property {number} seq
 * @property {string} response_id
 * @property {ConfirmItem[]} calls
 */

/**
 * @typedef {object} ToolStatus
 * @property {"tool.status"} type
 * @property {number} seq
 * @property {string} call_id
 * @property {string} tool
 * @property {"requested" | "running" | "pending" | "progress" | "completed" | "failed" | "cancelled" | "expired"} status
 * @property {string | null} response_id
 * @property {any} [result] Server tools' output, with `completed`.
 * @property {any} [progress] With `progress`.
 * @property {string | null} error
 * @property {string | null} code Why a failed call failed, when it has a code: `declined`
 *   (the user, or a rule, declined it), `forbidden`...
 * @property {boolean} duplicate
 */

/**
 * @typedef {object} ResponseDone
 * @property {"response.done"} type
 * @property {number} seq
 * @property {string} response_id
 * @property {"completed" | "cancelled" | "failed" | "incomplete"} status
 * @property {boolean} turn_completed
 * @property {Usage | null} usage
 */

/**
 * An `error` event. `resume_gap` is connection-level and has `seq` 0.
 * @typedef {object} ErrorEvent
 * @property {"error"} type
 * @property {number} seq
 * @property {string} code
 * @property {string} message
 * @property {string | null} in_reply_to
 * @property {string | null} call_id
 * @property {string | null} response_id
 * @property {boolean} retryable
 * @property {boolean} fatal
 */

/**
 * @typedef {object} Pong
 * @property {"pong"} type
 * @property {number} seq
 * @property {number | null} ts
 */

/**
 * Every server event, with omitted defaults filled in (docs/protocol.md, "Omitted defaults").
 * @typedef {SessionCreated | SessionUpdated | SessionResumed | SessionSnapshot | AgentTransferred
 *   | TextSegment | ResponseTruncated | ResponseCreated | ResponseRetrying | TextDelta | TextDone | ToolCalls | ToolConfirm | ToolStatus | ResponseDone
 *   | ErrorEvent | Pong} ServerEvent
 */

/**
 * @typedef {"idle" | "connecting" | "open" | "reconnecting" | "closed"} ConnectionState
 * `idle` only before `connect()`; the "connection" listeners see the other four.
 */

/**
 * What "connection" listeners receive.
 * @typedef {object} ConnectionEvent
 * @property {Exclude<ConnectionState, "idle">} state
 * @property {number} reconnects Successful resumes so far.
 * @property {ClientError} [error] With `closed`: why (a `SessionClosed`).
 */

/**
 * A function the client runs for the model, as declared to the gateway.
 * @typedef {object} ToolSpec
 * @property {string} name
 * @property {string} description
 * @property {object} input_schema
 * @property {object} [output_schema]
 * @property {string} [display_name]
 * @property {number} [timeout]
 */

/**
 * @typedef {object} ClientFunctionOptions
 * @property {string} [description] What the function does (the model reads it); default: the name in words.
 * @property {object} [inputSchema] JSON Schema of the arguments; default `{"type":"object","properties":{}}`.
 * @property {object} [outputSchema] JSON Schema the gateway checks each output against.
 * @property {number} [timeout] Seconds the gateway waits for a result (its default when absent).
 * @property {string} [displayName] A human-readable label.
 */

/**
 * @callback ClientFunctionHandler
 * @param {Record<string, any>} args The call's arguments (already checked against `inputSchema`).
 * @param {{signal: AbortSignal, call: ClientCall}} context `signal` aborts at the deadline or on close.
 * @returns {any} A JSON value, or a Promise of one.
 */

/**
 * Decides a server tool's call in manual tool mode (`onServerTool`).
 * @callback ServerToolHandler
 * @param {ClientCall} call The call (`kind: "server"`): `tool`, `args`, `deadline`...
 * @param {{signal: AbortSignal}} context `signal` aborts at the deadline or on close.
 * @returns {any} The call's output (a JSON value), `RUN_ON_GATEWAY` or a `RunOnGateway`
 *   (have the gateway run it), or a Promise of one of these; a throw is an error result.
 */

/**
 * The answer of a confirmation handler: `true` approves the call as it is, `false` declines it;
 * `{ approved: true, args }` approves it with these arguments instead (the gateway checks them
 * against the tool's input schema), `{ approved: false, reason }` declines it, the model
 * hearing `reason` (at most 1000 characters; a longer one is cut).
 * @typedef {boolean | {approved: boolean, args?: Record<string, any> | null, reason?: string | null}} ConfirmAnswer
 */

/**
 * Asks the user about a call of a tool marked `confirm` (`onConfirm`).
 * @callback ConfirmHandler
 * @param {ConfirmItem} item The call: `prompt` (the sentence to show), `tool`, `args`...
 * @param {{signal: AbortSignal}} context `signal` aborts at the item's deadline or on close.
 * @returns {ConfirmAnswer | Promise<ConfirmAnswer>} Anything else (or a throw) declines it.
 */

/**
 * Shows a widget tool's call to the user and returns their answer (`onWidget`).
 * @callback WidgetHandler
 * @param {ClientCall} call The call; `call.widget` says what to ask (`type`, `prompt`...).
 * @param {{signal: AbortSignal}} context `signal` aborts at the call's deadline, on close, or
 *   when a `tool.status` ends the call (`cancelled`, `expired`, `failed`) before the answer.
 * @returns {any} The call's output (`{ choice }`, `{ confirmed }`, or the form's values), or
 *   a Promise of it; a throw is an error result.
 */

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
 * @property {string | null} [timeZone] The user's IANA time zone, for tools that tell the time
 *   (the gateway's `get_current_time`). Default: the browser's own
 *   (`Intl.DateTimeFormat().resolvedOptions().timeZone`); `null` sends none.
 * @property {string} [toolChoice] The session's default for which tools the model may call in
 *   a response: `"auto"` (its choice; the gateway's default), `"none"`, `"required"` (at least
 *   one) or one tool's name. A forced choice holds for the first model step of a response;
 *   the steps after it are `"auto"`. Sent as `tool_choice` in `session.start`.
 * @property {number} [maxSteps] The session's default for how many model steps a response may
 *   take (each tool round is one): 1 up to the gateway's limit (`session.limits.max_steps`,
 *   also its default). Sent as `max_steps`.
 * @property {ToolMode} [toolMode] The session's default tool mode: `"auto"` (the gateway runs
 *   its server tools; the gateway's default) or `"manual"` (every tool call the model asks
 *   for, server tools included, comes to the client: see `onServerTool`). Sent as `tool_mode`.
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

// ------------------------------------------------------------------------- constants

/** The WebSocket subprotocol the client offers. */
export const SUBPROTOCOL = "gateway.v1";
/** A client token is offered as the subprotocol `gateway.token.<token>`, beside `gateway.v1`. */
export const TOKEN_SUBPROTOCOL_PREFIX = "gateway.token.";
/**
 * The query parameter naming the session a socket resumes, for load balancers that route by
 * it (deploy/nginx.conf hashes it, so every resume of a session reaches the same node). The
 * gateway ignores it: the session is the one `session.resume` names.
 */
export const SESSION_PARAM = "session";

/** Closes after which resuming makes no sense: the session is gone or not ours. */
const FINAL_CLOSE_CODES = new Set([1000, 1008, 4001, 4003, 4004, 4008, 4009]);
const FIRST_RECONNECT_DELAY_MS = 50;
/** Default of `attemptTimeout`: ms from an attempt's dial to the gateway's answer. */
const ATTEMPT_TIMEOUT_MS = 10_000;
/** Default of `giveUpAfter`: the gateway's default `session_ttl`, after which no resume succeeds. */
const GIVE_UP_AFTER_MS = 120_000;
/** The longest close() waits: for a socket's close, or to end a session that has no socket. */
const CLOSE_WAIT_MS = 1_000;
const MAX_RESULTS_PER_MESSAGE = 128;
const OVERRAN = "the client function overran its deadline";
const SERVER_TOOL_OVERRAN = "the server-tool handler overran its deadline";
/** The reason of the decline sent when the app set no confirmation handler. */
const NO_CONFIRM_HANDLER = "this client cannot ask the user";
const CONFIRM_OVERRAN = "the confirmation handler overran its deadline";
const WIDGET_OVERRAN = "the user did not answer in time";
/** tool.status values that end a call: a widget still asking stops (its signal aborts). */
const CALL_ENDED = new Set(["completed", "failed", "cancelled", "expired"]);
/** The protocol's limit on a decline's `reason`. */
const MAX_REASON_CHARS = 1000;
const FUNCTION_NAME = /^[a-z][a-z0-9_]*$/;
const WS_OPEN = 1;

/** Defaults of the fields servers omit, by event type. */
const DEFAULTS = {
  "session.created": () => ({ tools: [], limits: null }),
  "session.updated": () => ({ tools: [], in_reply_to: null }),
  "session.resumed": () => ({ agent: null, open_calls: [], open_confirmations: [] }),
  "session.snapshot": () => ({ agent: null, transcript: [], open_calls: [], open_confirmations: [] }),
  "agent.transferred": () => ({ tools: [], reason: null, response_id: null }),
  "response.created": () => ({ in_reply_to: null, call_id: null }),
  "response.retrying": () => ({}),
  "text.delta": () => ({}),
  "text.segment": () => ({}),
  "response.truncated": () => ({ in_reply_to: null }),
  "text.done": () => ({}),
  "tool.calls": () => ({ calls: [] }),
  "tool.confirm": () => ({ calls: [] }),
  "tool.status": () => ({ response_id: null, error: null, code: null, duplicate: false }),
  "response.done": () => ({ turn_completed: false, usage: null }),
  error: () => ({
    in_reply_to: null,
    call_id: null,
    response_id: null,
    retryable: false,
    fatal: false,
  }),
  pong: () => ({ ts: null }),
};

// ------------------------------------------------------------------------- errors

/** Base of everything the SDK throws. */
export class ClientError extends Error {
  /** @param {string} message @param {ErrorOptions} [options] */
  constructor(message, options) {
    super(message, options);
    this.name = "ClientError";
  }
}

/** The gateway answered with an `error` event (`code` says which). */
export class ServerError extends ClientError {
  /** @param {ErrorEvent} event */
  constructor(event) {
    super(`${event.code}: ${event.message}`);
    this.name = "ServerError";
    /** @type {ErrorEvent} */
    this.event = event;
    /** @type {string} */
    this.code = event.code;
    /** @type {boolean} */
    this.retryable = Boolean(event.retryable);
  }
}

/** The session cannot go on (closed normally, expired, refused, taken over...). */
export class SessionClosed extends ClientError {
  /** @param {number} closedWith @param {string} [reason] */
  constructor(closedWith, reason = "") {
    super(`session closed (${closedWith}${reason ? `: ${reason}` : ""})`);
    this.name = "SessionClosed";
    /** The WebSocket close code that ended it (docs/protocol.md lists them). */
    this.closedWith = closedWith;
    /** @type {string} */
    this.reason = reason;
  }
}

/**
 * After a reconnect the gateway no longer had every missed event; rebuild from `snapshot`
 * (the transcript so far and the open calls).
 */
export class ResumeGap extends ClientError {
  /** @param {SessionSnapshot} snapshot */
  constructor(snapshot) {
    super("events were lost across a reconnect; rebuild from the snapshot");
    this.name = "ResumeGap";
    /** @type {SessionSnapshot} */
    this.snapshot = snapshot;
  }
}

// ------------------------------------------------------------------------- manual tool mode

/**
 * What a server-tool handler (`onServerTool`) returns to have the gateway run the call
 * (`tool.run`), as auto mode would have; the outcome becomes the call's result.
 */
export class RunOnGateway {
  /**
   * @param {Record<string, any> | null} [args] Arguments to run it with instead of the
   *   model's (the gateway checks them against the tool's input schema); the model's when absent.
   */
  constructor(args = null) {
    if (args != null && (typeof args !== "object" || Array.isArray(args))) {
      throw new TypeError("RunOnGateway: args is an object of arguments");
    }
    /** @type {Record<string, any> | null} */
    this.args = args ?? null;
    Object.freeze(this);
  }
}

/** Returned by a server-tool handler: run the call on the gateway with the model's arguments. */
export const RUN_ON_GATEWAY = new RunOnGateway();

// ------------------------------------------------------------------------- the client

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

/**
 * `url` with `session=<sessionId>` in its query, for a socket that resumes that session
 * (mirrors Python's `resume_url`): what the URL's query has (a token...) is kept as written,
 * and a `session` parameter already in it is replaced, never repeated. A relative URL stays
 * relative.
 * @param {string} url
 * @param {string} sessionId
 * @returns {string}
 */
export function resumeUrl(url, sessionId) {
  const text = String(url);
  const hashAt = text.indexOf("#");
  const fragment = hashAt < 0 ? "" : text.slice(hashAt);
  const base = hashAt < 0 ? text : text.slice(0, hashAt);
  const queryAt = base.indexOf("?");
  const path = queryAt < 0 ? base : base.slice(0, queryAt);
  const query = queryAt < 0 ? "" : base.slice(queryAt + 1);
  const kept = query.split("&").filter((pair) => pair && queryKey(pair) !== SESSION_PARAM);
  kept.push(`${SESSION_PARAM}=${encodeURIComponent(sessionId)}`);
  return `${path}?${kept.join("&")}${fragment}`;
}

/** The decoded name of one `name=value` pair of a query (as written when it does not decode). */
function queryKey(pair) {
  const key = pair.split("=", 1)[0].replace(/\+/g, " ");
  try {
    return decodeURIComponent(key);
  } catch {
    return key;
  }
}

/** One session with the gateway, across as many sockets as it takes. */
/** The runtime's own IANA time zone (a browser's, Node's), or `undefined` if it has none. */
function defaultTimeZone() {
  try {
    return Intl.DateTimeFormat().resolvedOptions().timeZone || undefined;
  } catch {
    return undefined;
  }
}

export class GatewayClient {
  /** The same as the module's `RUN_ON_GATEWAY`, for a server-tool handler to return. */
  static RUN_ON_GATEWAY = RUN_ON_GATEWAY;

  /**
   * @param {string} url The gateway's `ws://` or `wss://` URL of `/v1/realtime`. A socket that
   *   resumes the session adds `session=<session_id>` to its query (`resumeUrl`).
   * @param {GatewayClientOptions} [options]
   */
  constructor(url, options = {}) {
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
    } = options;
    if (typeof WebSocketImpl !== "function") {
      throw new ClientError("no WebSocket class here: pass options.WebSocketImpl");
    }
    this._WebSocket = WebSocketImpl;
    this._url = url;
    this._token = token;
    this._startFields = compact({
      agent,
      instructions,
      metadata,
      tool_choice: toolChoice,
      max_steps: maxSteps,
      tool_mode: toolMode,
      time_zone: timeZone,
      segments,
    });
    this._reconnect = Boolean(reconnect);
    this._maxDelay = Math.max(0, Number(maxReconnectDelay));
    this._attemptTimeout = Math.max(0, Number(attemptTimeout));
    this._giveUpAfter = Math.max(0, Number(giveUpAfter));
    this._ackEvery = Math.max(1, Math.floor(Number(ackEvery)) || 1);

    /** @type {Map<string, {spec: ToolSpec, handler: ClientFunctionHandler}>} */
    this._functions = new Map();
    /** @type {ServerToolHandler | null} decides server-kind calls (manual tool mode) */
    this._serverTool = null;
    /** @type {ConfirmHandler | null} asks the user about calls of tools marked confirm */
    this._confirm = null;
    /** @type {WidgetHandler | null} shows widget tools' calls to the user */
    this._widget = null;
    /** @type {Map<string, Set<(event: any) => void>>} */
    this._listeners = new Map();
    /** @type {Set<Inbox>} the queues of say() and events() */
    this._subscribers = new Set();

    /** @type {ConnectionState} */
    this._state = "idle";
    /** @type {any} the socket attached to the session */
    this._ws = null;
    /** @type {{ws: any, stop: () => void} | null} the attempt in flight: its socket, and how to drop it */
    this._pending = null;
    /** @type {WeakMap<object, Promise<void>>} resolved when that socket closed (or failed to open) */
    this._socketClosed = new WeakMap();
    /** @type {WeakSet<object>} sockets given up on: their events are ignored */
    this._dropped = new WeakSet();
    /** @type {Deferred<void> | null} */
    this._connected = null;
    /** true once a socket opened (connect() resolved): a later loop is "reconnecting" */
    this._everOpened = false;
    /** @type {number | null} when the attempts now failing in a row began to fail */
    this._failingSince = null;
    /** @type {Promise<SessionCreated> | null} */
    this._starting = null;
    /** @type {Deferred<SessionCreated> | null} set once start() is asked (session.start sent or due) */
    this._created = null;
    /** when start() was asked: its session.start's answer is due attemptTimeout after this or the dial */
    this._startAskedAt = 0;
    /** true once the gateway answered session.start with an error: it is not sent again */
    this._refused = false;
    /** @type {{settle: (outcome: any) => void} | null} a session.start waiting for its answer */
    this._startWatch = null;
    this._closing = false;
    /** @type {Promise<void> | null} close()'s, once called */
    this._closed = null;
    /** @type {ClientError | null} why the conversation can go no further */
    this._end = null;
    /** @type {(() => void) | null} cuts the reconnect backoff short */
    this._wake = null;

    /** @type {Set<string>} every call id ever run (exactly once per call id) */
    this._ran = new Set();
    /** @type {Map<string, AbortController>} handlers still running */
    this._running = new Map();
    /** @type {Set<string>} widget calls whose handler is still running */
    this._widgetCalls = new Set();
    /** @type {Map<string, object>} results sent but not confirmed by a tool.status */
    this._unconfirmed = new Map();
    /** @type {Set<string>} every call id whose confirmation was asked (once per call id) */
    this._asked = new Set();
    /** @type {Map<string, AbortController>} confirmation handlers still running */
    this._asking = new Map();
    /**
     * tool.confirmation answers by call id, until a tool.status for their call, a tool.calls
     * that holds it (an approved client function's), or an error that answers them.
     * @type {Map<string, {type: "tool.confirmation", id: string, call_id: string, approved: boolean, args?: object, reason?: string}>}
     */
    this._answers = new Map();
    /**
     * tool.run requests by call id, until a tool.status for their call (or an error that
     * answers them and is not retryable).
     * @type {Map<string, {msg: {type: "tool.run", id: string, call_id: string, args?: object}, tool: string}>}
     */
    this._runs = new Map();
    /**
     * In the order sent, by id: user messages until a response to them starts, and
     * session.update messages until session.updated answers them (either: or an error).
     * @type {Map<string, any>}
     */
    this._unanswered = new Map();

    this._sinceAck = 0;
    /** @type {SessionCreated | null} */
    this._session = null;
    /** @type {string | null} */
    this._agent = null;
    /** @type {string | null} the latest response that started (`truncate`'s default) */
    this._latestResponse = null;
    this._lastSeq = 0;
    this._reconnects = 0;
    /** true while resume() attaches to a saved session (not a reconnect) */
    this._attaching = false;
  }

  /** The `session.created` event, or `null` before the session starts. @type {SessionCreated | null} */
  get session() {
    return this._session;
  }

  /**
   * The agent the session is with: `session.created`'s, then another after each
   * `agent.transferred`; `null` before the session starts. @type {string | null}
   */
  get agent() {
    return this._agent;
  }

  /** The cursor: the highest `seq` received. @type {number} */
  get lastSeq() {
    return this._lastSeq;
  }

  /** How many resumes succeeded so far. @type {number} */
  get reconnects() {
    return this._reconnects;
  }

  /** The connection's state. @type {ConnectionState} */
  get state() {
    return this._state;
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
    if (this._end) return Promise.reject(this._end);
    if (!this._connected) {
      this._connected = deferred();
      this._retryLoop();
    }
    return this._connected.promise;
  }

  /**
   * Open the session (`say()` and `post()` do it when needed; it connects first if needed).
   * Every client function registered by then is declared in `session.start`. When the socket
   * drops before `session.created` (nothing is lost yet), `session.start` is sent again on a
   * new socket, with the reconnects' backoff.
   * @returns {Promise<SessionCreated>}
   * @throws {ServerError} the gateway refused `session.start`.
   * @throws {SessionClosed} the session ended first.
   */
  start() {
    if (this._end) return Promise.reject(this._end);
    if (!this._starting) {
      this._starting = (async () => {
        if (this._state === "idle" || this._state === "connecting") await this.connect();
        if (this._end) throw this._end;
        this._created = deferred();
        this._startAskedAt = now();
        // Without a socket now, the reconnect loop sends session.start on its next one.
        if (this._ws !== null) this._startOnAttached();
        return this._created.promise;
      })();
      this._starting.catch(() => {});
    }
    return this._starting;
  }

  /**
   * Attach to a session an earlier client started (a page before its reload, say) instead
   * of starting one: open a socket and send `session.resume`. Call it first, in place of
   * `connect()` and `start()`. The events after `lastSeq` are replayed to the listeners
   * (or `resume_gap` and `session.snapshot` when the gateway no longer has them all), and
   * the calls still open are run, as after any resume. It does not count in `reconnects`.
   * @param {SessionCreated} session That session's `session.created` (its `session_id`
   *   and `resume_token` at least), kept by the app.
   * @param {number} [lastSeq] The highest `seq` the app has handled (0: all the gateway has).
   * @returns {Promise<void>}
   * @throws {SessionClosed} the gateway refused (4001, 4004, 4008) or could not be reached
   *   (one attempt, within `attemptTimeout`); this client is closed then: start a new
   *   session with a new client.
   */
  async resume(session, lastSeq = 0) {
    if (this._end) throw this._end;
    if (this._connected || this._starting) {
      throw new ClientError("resume() must come first, in place of connect() and start()");
    }
    this._session = session;
    this._agent = session.agent ?? null; // the resume's answer says if it changed since
    this._lastSeq = Math.max(0, Math.floor(Number(lastSeq)) || 0);
    const connected = (this._connected = deferred());
    const created = (this._created = deferred());
    this._starting = created.promise;
    this._setState("connecting");
    this._attaching = true;
    const outcome = await this._resumeOnce();
    this._attaching = false;
    if (outcome !== "resumed") this._finish(new SessionClosed(1006, "could not reach the gateway to resume"));
    if (this._end) throw this._end;
    connected.resolve();
    created.resolve(session);
  }

  /**
   * End the session: the socket is closed with code 1000, which tells the gateway the
   * client is done. Pending `say()` iterators and `events()` throw `SessionClosed` (1000).
   * Between reconnect attempts (or during one, which is dropped) there is no socket to
   * close: a short-lived one resumes the session and closes with 1000 once the gateway
   * answered, so the session ends at once all the same; should that fail, the gateway ends
   * it after its `session_ttl`. Nothing of that socket reaches the listeners.
   * @returns {Promise<void>} settled once the socket reports its close (at most ~1 s).
   */
  close() {
    if (!this._closed) this._closed = this._shutDown();
    return this._closed;
  }

  /** What close() does, once. */
  async _shutDown() {
    const ended = this._end !== null; // a session that ended already needs no ending
    const session = this._session;
    const ws = this._ws;
    const attempt = this._pending?.ws;
    this._closing = true;
    this._finish(new SessionClosed(1000, "closed by the client")); // drops the attempt in flight
    if (ws) safeClose(ws, 1000, "");
    const waits = [ws, attempt].filter(Boolean).map((sock) => waitAtMost(this._socketClosed.get(sock), CLOSE_WAIT_MS));
    if (!ws && !ended && session) waits.push(this._endOnGateway(session));
    await Promise.all(waits);
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
    if (typeof name !== "string" || name.length > 64 || !FUNCTION_NAME.test(name)) {
      throw new ClientError(`client function name ${JSON.stringify(name)} must match ^[a-z][a-z0-9_]*$ (64 characters at most)`);
    }
    if (typeof handler !== "function") {
      throw new TypeError(`client function ${name}: the handler must be a function`);
    }
    const { description, inputSchema, outputSchema, timeout, displayName } = options;
    /** @type {ToolSpec} */
    const spec = {
      name,
      description: (description || name.replace(/_/g, " ")).trim(),
      input_schema: inputSchema ?? { type: "object", properties: {} },
      ...compact({ output_schema: outputSchema, display_name: displayName, timeout }),
    };
    this._functions.set(name, { spec, handler });
    if (this._created) {
      // session.start went out already: declare them all again
      this._sendQuiet(this._newUpdate({ client_functions: this._specs() }));
    }
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
    this._serverTool = handler;
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
    this._confirm = handler;
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
    this._widget = handler;
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
  async update({ toolChoice, maxSteps, toolMode } = {}) {
    if (this._end) throw this._end;
    const fields = compact({ tool_choice: toolChoice, max_steps: maxSteps, tool_mode: toolMode });
    if (!this._created) {
      Object.assign(this._startFields, fields);
      return null;
    }
    const update = this._newUpdate(fields);
    this._send(update);
    return update.id;
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
    const inbox = this._subscribe();
    try {
      const msgId = await this.post(text, options);
      let responseId = null;
      let stepEnded = false; // a text.done came: the next delta starts a new model step
      let last = ""; // the last character yielded
      for (;;) {
        const item = await inbox.next();
        if (item instanceof End) throw item.error;
        const event = /** @type {ServerEvent} */ (item);
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
      this._subscribers.delete(inbox);
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
  async post(text, { toolChoice, tools, maxSteps, toolMode } = {}) {
    if (typeof tools === "string") throw new TypeError("tools is a list of tool names, not one name");
    await this.start();
    const id = randomId("msg_");
    const options = compact({
      tool_choice: toolChoice,
      tools: tools == null ? tools : [...tools],
      max_steps: maxSteps,
      tool_mode: toolMode,
    });
    const msg = { type: "user.message", id, text, ...options };
    this._unanswered.set(id, msg);
    this._send(msg);
    return id;
  }

  /**
   * Every event of the session from now on, in order, once each (what `on("*")` gets).
   * @returns {AsyncGenerator<ServerEvent, void, void>}
   * @throws {SessionClosed} when the session ends.
   */
  async *events() {
    const inbox = this._subscribe();
    try {
      for (;;) {
        const item = await inbox.next();
        if (item instanceof End) throw item.error;
        yield /** @type {ServerEvent} */ (item);
      }
    } finally {
      this._subscribers.delete(inbox);
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
    const target = responseId ?? this._latestResponse;
    if (target == null) throw new ClientError("no response to truncate yet");
    const id = randomId("trn_");
    const msg = { type: "response.truncate", id, response_id: target, heard_chars: heardChars };
    this._unanswered.set(id, msg);
    this._send(msg);
    return id;
  }

  /** The id of the latest response that started, or `null`. @type {string | null} */
  get latestResponse() {
    return this._latestResponse;
  }

  /**
   * Stop the running response (barge-in). Sent only while connected: a cancel is not resent.
   * @param {string} [responseId] Cancel only if this is the running response.
   * @returns {Promise<void>}
   */
  async cancel(responseId) {
    this._send(compact({ type: "response.cancel", response_id: responseId }));
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
    if (typeof listener !== "function") throw new TypeError("the listener must be a function");
    let listeners = this._listeners.get(type);
    if (!listeners) this._listeners.set(type, (listeners = new Set()));
    const entry = (/** @type {any} */ event) => listener(event);
    listeners.add(entry);
    return () => {
      listeners.delete(entry);
    };
  }

  // ----------------------------------------------------------------------- internals

  /**
   * A session.update, kept to be sent again until the gateway answers it. It replaces the
   * unanswered ones sent just before it (no user message in between) that it overrides in
   * full: every field they set, it sets too.
   * @param {Record<string, any>} fields
   */
  _newUpdate(fields) {
    const update = { type: "session.update", id: randomId("upd_"), ...fields };
    for (const [id, earlier] of [...this._unanswered].reverse()) {
      if (earlier.type !== "session.update") break; // a user message between them is answered with the earlier settings
      if (updatedFields(earlier).every((field) => field in fields)) this._unanswered.delete(id);
    }
    this._unanswered.set(update.id, update);
    return update;
  }

  /** @returns {ToolSpec[]} */
  _specs() {
    return [...this._functions.values()].map((f) => f.spec);
  }

  _subscribe() {
    if (this._end) throw this._end;
    const inbox = new Inbox();
    this._subscribers.add(inbox);
    return inbox;
  }

  /** Send if connected; a message lost to a drop is recovered on resume (results, user messages). */
  _send(msg) {
    if (this._end) throw this._end;
    this._sendQuiet(msg);
  }

  _sendQuiet(msg) {
    const ws = this._ws;
    if (!ws || this._end || this._state !== "open") return false;
    if (typeof ws.readyState === "number" && ws.readyState !== WS_OPEN) return false;
    try {
      ws.send(JSON.stringify(msg));
      return true;
    } catch {
      return false;
    }
  }

  /** @param {ConnectionState} state @param {object} [extra] */
  _setState(state, extra) {
    if (this._state === state) return;
    this._state = state;
    this._emit("connection", { state, reconnects: this._reconnects, ...extra });
  }

  _emit(type, payload) {
    const listeners = this._listeners.get(type);
    if (!listeners) return;
    for (const listener of [...listeners]) {
      try {
        const returned = listener(payload);
        if (returned && typeof returned.then === "function") returned.then(undefined, reportError);
      } catch (err) {
        reportError(err);
      }
    }
  }

  /** Hand an event to its listeners, the "*" listeners and the say()/events() queues. */
  _deliver(event) {
    this._emit(event.type, event);
    this._emit("*", event);
    for (const inbox of this._subscribers) inbox.push(event);
  }

  /**
   * Open a socket and route its events. `close` comes once per socket, with `opened` =
   * whether it ever opened: for a close event, or for an `error` event before the open
   * (Node 20's WebSocket fires only that when the upgrade fails). Nothing comes from a
   * socket after `_drop()`.
   * @param {any} on the handlers: open, frame, close
   * @param {string | undefined} token offered as the `gateway.token.<token>` subprotocol
   * @param {string} [sessionId] the session the socket resumes: named in the URL (`resumeUrl`)
   * @returns {any} the socket, or null when the constructor threw (then `close` follows).
   */
  _dial(on, token, sessionId) {
    let ws;
    let opened = false;
    let closed = false;
    const protocols = token == null ? [SUBPROTOCOL] : [SUBPROTOCOL, TOKEN_SUBPROTOCOL_PREFIX + token];
    try {
      const url = sessionId == null ? this._url : resumeUrl(this._url, sessionId);
      ws = new this._WebSocket(url, protocols);
    } catch (err) {
      queueMicrotask(() => on.close(null, 1006, describe(err), false));
      return null;
    }
    /** @type {() => void} */
    let markClosed = () => {};
    this._socketClosed.set(ws, new Promise((resolve) => (markClosed = resolve)));
    const end = (/** @type {number} */ code, /** @type {string} */ reason) => {
      if (closed) return false;
      closed = true;
      markClosed();
      if (!this._dropped.has(ws)) on.close(ws, code, reason, opened);
      return true;
    };
    ws.onopen = () => {
      if (opened || closed || this._dropped.has(ws)) return;
      opened = true;
      on.open(ws);
    };
    ws.onmessage = (/** @type {{data: any}} */ e) => {
      if (opened && !closed && !this._dropped.has(ws)) on.frame(ws, e.data);
    };
    ws.onerror = () => {
      // After the open a close event follows; before it, one may never come.
      if (!opened && end(1006, "could not connect to the gateway")) safeClose(ws, 4000, "");
    };
    ws.onclose = (/** @type {{code?: number, reason?: string}} */ e) => {
      end(e?.code ?? 1006, e?.reason ?? "");
    };
    return ws;
  }

  /**
   * Give up on a socket: ignore its events from now on and close it (with 1000 only when
   * that is meant: 1000 ends the session of a socket the gateway attached to it).
   */
  _drop(ws, code, reason) {
    if (!ws) return;
    this._dropped.add(ws);
    safeClose(ws, code, reason);
  }

  _onFrame(data) {
    const event = parseEvent(data);
    if (event) this._onEvent(event);
  }

  /** @param {any} event a parsed server event */
  _onEvent(event) {
    if (event.seq > 0) {
      if (event.seq <= this._lastSeq) return; // already seen: never hand the app a duplicate
      this._lastSeq = event.seq;
      this._sinceAck += 1;
      if (this._sinceAck >= this._ackEvery) {
        this._sinceAck = 0;
        this._sendQuiet({ type: "ack", seq: this._lastSeq });
      }
    }
    if (!Object.hasOwn(DEFAULTS, event.type)) {
      // An event type newer than this SDK: only listeners that asked for it by name get it.
      this._emit(event.type, event);
      return;
    }
    switch (event.type) {
      case "session.created":
        this._session = event;
        this._agent = event.agent;
        this._created?.resolve(event);
        this._startWatch?.settle("ok");
        break;
      case "agent.transferred":
        this._agent = event.agent;
        break;
      case "error":
        if (this._session === null && this._created) {
          // session.start refused (invalid_message, forbidden...): not sent again
          this._refused = true;
          this._created.reject(new ServerError(event));
          this._startWatch?.settle("ok");
        }
        if (event.in_reply_to) {
          this._unanswered.delete(event.in_reply_to);
          this._onRunRefused(event);
          this._onAnswerRefused(event);
        }
        break;
      case "session.updated":
      case "response.truncated":
        if (event.in_reply_to) this._unanswered.delete(event.in_reply_to);
        break;
      case "tool.calls":
        for (const call of event.calls) {
          if (call && typeof call === "object") this._answers.delete(call.call_id); // approved
          this._runCall(call);
        }
        break;
      case "tool.confirm":
        for (const item of event.calls) this._ask(item);
        break;
      case "tool.status":
        if (this._widgetCalls.has(event.call_id) && CALL_ENDED.has(event.status)) {
          // the call ended without the user's answer: stop asking, send nothing
          this._running.get(event.call_id)?.abort(new ClientError(`the call was ${event.status}`));
        }
        this._unconfirmed.delete(event.call_id);
        this._runs.delete(event.call_id);
        this._answers.delete(event.call_id);
        break;
      case "response.created":
        this._latestResponse = event.response_id;
        if (event.in_reply_to) this._unanswered.delete(event.in_reply_to);
        break;
    }
    this._deliver(event);
  }

  /** Run a call unless its id ran already (calls come in tool.calls, open_calls, replays). */
  _runCall(call) {
    if (!call || typeof call.call_id !== "string" || this._end) return;
    if (this._ran.has(call.call_id)) return;
    this._ran.add(call.call_id);
    const abort = new AbortController();
    this._running.set(call.call_id, abort);
    this._execute(call, abort).finally(() => this._running.delete(call.call_id));
  }

  /** @param {ClientCall} call @param {AbortController} abort */
  async _execute(call, abort) {
    await null; // listeners see the tool.calls event before any handler runs
    if (call.kind === "server") {
      await this._decide(call, abort); // manual tool mode: never a client function's call
      return;
    }
    const fn = this._functions.get(call.tool);
    if (!fn && call.widget && this._widget) {
      await this._showWidget(call, this._widget, abort);
      return;
    }
    /** @type {{call_id: string, tool: string, output?: any, error?: string}} */
    let result;
    try {
      if (!fn) throw namedError("LookupError", `this client has no function '${call.tool}'`);
      const running = invoke(fn.handler, call.args ?? {}, { signal: abort.signal, call });
      const output = await withDeadline(running, call.timeout, abort);
      result = { call_id: call.call_id, tool: call.tool, output: toJson(output) };
    } catch (err) {
      if (this._end) return; // closed: nobody to answer
      result = { call_id: call.call_id, tool: call.tool, error: err === DEADLINE ? OVERRAN : describe(err) };
    }
    if (this._end) return;
    this._unconfirmed.set(call.call_id, result);
    this._sendQuiet({ type: "tool.results", results: [result] });
  }

  /**
   * A widget call: the user's answer (the handler's value) as its result; nothing when the
   * call ended first (a tool.status aborted the signal) or the conversation closed.
   * @param {ClientCall} call @param {WidgetHandler} handler @param {AbortController} abort
   */
  async _showWidget(call, handler, abort) {
    this._widgetCalls.add(call.call_id);
    /** @type {{call_id: string, tool: string, output?: any, error?: string}} */
    let result;
    try {
      const running = invoke(handler, call, { signal: abort.signal });
      const output = await withDeadline(running, call.timeout, abort, WIDGET_OVERRAN);
      result = { call_id: call.call_id, tool: call.tool, output: toJson(output) };
    } catch (err) {
      if (err !== DEADLINE && abort.signal.aborted) return; // closed, or the call ended
      result = { call_id: call.call_id, tool: call.tool, error: err === DEADLINE ? WIDGET_OVERRAN : describe(err) };
    } finally {
      this._widgetCalls.delete(call.call_id);
    }
    if (this._end) return;
    this._unconfirmed.set(call.call_id, result);
    this._sendQuiet({ type: "tool.results", results: [result] });
  }

  /**
   * A server tool offered in manual tool mode: the handler's output or error as the result,
   * or a tool.run (no handler, or it returned a RunOnGateway).
   * @param {ClientCall} call @param {AbortController} abort
   */
  async _decide(call, abort) {
    const handler = this._serverTool;
    /** @type {Record<string, any> | undefined} edited arguments for tool.run */
    let args;
    /** @type {{call_id: string, tool: string, output?: any, error?: string} | null} */
    let result = null;
    if (handler) {
      try {
        const outcome = await withDeadline(invoke(handler, call, { signal: abort.signal }), call.timeout, abort);
        if (!(outcome instanceof RunOnGateway)) {
          result = { call_id: call.call_id, tool: call.tool, output: toJson(outcome) };
        } else if (outcome.args != null) {
          args = toJson(outcome.args); // a copy: the run resent later is the one sent first
        }
      } catch (err) {
        if (this._end) return; // closed: nobody to answer
        const error = err === DEADLINE ? SERVER_TOOL_OVERRAN : describe(err);
        result = { call_id: call.call_id, tool: call.tool, error };
      }
    }
    if (this._end) return;
    if (result) {
      this._unconfirmed.set(call.call_id, result);
      this._sendQuiet({ type: "tool.results", results: [result] });
      return;
    }
    const msg = { type: "tool.run", id: randomId("run_"), call_id: call.call_id, ...compact({ args }) };
    this._runs.set(call.call_id, { msg, tool: call.tool });
    this._sendQuiet(msg);
  }

  /**
   * An error that refuses a tool.run for good: forget the run; unless the call is unknown, it
   * stays the client's, so the refusal becomes its error result (the response goes on).
   * @param {ErrorEvent} event
   */
  _onRunRefused(event) {
    if (event.retryable) return; // rate_limited: kept, sent again after a resume
    for (const [callId, run] of this._runs) {
      if (run.msg.id !== event.in_reply_to) continue;
      this._runs.delete(callId);
      if (event.code === "unknown_call") return;
      const result = { call_id: callId, tool: run.tool, error: event.message };
      this._unconfirmed.set(callId, result);
      this._sendQuiet({ type: "tool.results", results: [result] });
      return;
    }
  }

  /** Ask the user about a call unless it was asked already (tool.confirm, open_confirmations). */
  _ask(item) {
    if (!item || typeof item.call_id !== "string" || this._end) return;
    if (this._asked.has(item.call_id)) return;
    this._asked.add(item.call_id);
    const abort = new AbortController();
    this._asking.set(item.call_id, abort);
    this._decideConfirmation(item, abort).finally(() => this._asking.delete(item.call_id));
  }

  /**
   * The handler's answer to `item`, sent as a tool.confirmation (a decline when there is no
   * handler, it throws, overruns, or answers something else).
   * @param {ConfirmItem} item @param {AbortController} abort
   */
  async _decideConfirmation(item, abort) {
    await null; // listeners see the tool.confirm event before the handler runs
    const handler = this._confirm;
    /** @type {{approved: boolean, args?: object, reason?: string}} */
    let answer;
    if (!handler) {
      answer = { approved: false, reason: NO_CONFIRM_HANDLER };
    } else {
      try {
        const running = invoke(handler, item, { signal: abort.signal });
        answer = toAnswer(await withDeadline(running, item.timeout, abort, CONFIRM_OVERRAN));
      } catch (err) {
        if (this._end) return; // closed: nobody to answer
        const reason = err === DEADLINE ? CONFIRM_OVERRAN : `the confirmation handler failed (${describe(err)})`;
        answer = { approved: false, reason };
      }
    }
    if (this._end) return;
    this._sendAnswer(item.call_id, answer);
  }

  /** Send a tool.confirmation, kept until the gateway confirms it (it replaces an earlier one). */
  _sendAnswer(callId, { approved, args, reason }) {
    const msg = {
      type: /** @type {const} */ ("tool.confirmation"),
      id: randomId("cnf_"),
      call_id: callId,
      approved,
      ...compact({ args, reason: fitReason(reason) }),
    };
    this._answers.set(callId, msg);
    this._sendQuiet(msg);
  }

  /**
   * An error that refuses a tool.confirmation for good: forget it; an approval refused for its
   * arguments (the call still waits) becomes a decline that says why, so the response goes on.
   * @param {ErrorEvent} event
   */
  _onAnswerRefused(event) {
    if (event.retryable) return; // rate_limited: kept, sent again after a resume
    for (const [callId, msg] of this._answers) {
      if (msg.id !== event.in_reply_to) continue;
      this._answers.delete(callId);
      if (event.code === "invalid_message" && msg.approved) {
        this._sendAnswer(callId, { approved: false, reason: `the edited arguments were refused (${event.message})` });
      }
      return;
    }
  }

  /**
   * The attached socket closed. A session.start waiting for its answer on it failed (its
   * owner tries again); otherwise the loop resumes the session, or opens a new socket for
   * one not started yet.
   */
  _onDrop(ws, code, reason) {
    if (ws !== this._ws) return;
    this._ws = null;
    const watch = this._startWatch;
    this._startWatch = null;
    if (this._closing || this._end) {
      watch?.settle("stop");
      return;
    }
    if (FINAL_CLOSE_CODES.has(code) || !this._reconnect || (this._session === null && this._refused)) {
      this._finish(new SessionClosed(code, reason));
      watch?.settle("stop");
      return;
    }
    if (watch) {
      watch.settle(new SessionClosed(code, reason));
      return;
    }
    this._retryLoop();
  }

  /**
   * Attempt with backoff and full jitter until a socket is attached, close(), a final code,
   * or `giveUpAfter`: a resume once the session exists, else a new socket (which sends
   * session.start when start() was asked). The first connect, a drop before
   * session.created and a drop after it all go through here.
   */
  async _retryLoop() {
    let ceiling = Math.min(FIRST_RECONNECT_DELAY_MS, this._maxDelay);
    while (!this._closing && !this._end) {
      this._setState(this._everOpened ? "reconnecting" : "connecting");
      const outcome = this._session ? await this._resumeOnce() : await this._openOnce();
      if (!(outcome instanceof SessionClosed) || this._closing || this._end) return;
      if (!this._reconnect) {
        this._finish(outcome); // only the first connect gets here: a drop without reconnect ends in _onDrop
        return;
      }
      if (this._failed()) return;
      await this._sleep(Math.random() * ceiling); // jitter: no thundering herd
      ceiling = Math.min(ceiling * 2, this._maxDelay);
    }
  }

  /**
   * Count a failed attempt; past `giveUpAfter` of failures in a row, end the conversation.
   * @returns {boolean} whether it gave up.
   */
  _failed() {
    const at = now();
    if (this._failingSince === null) this._failingSince = at;
    if (at - this._failingSince < this._giveUpAfter) return false;
    this._finish(new SessionClosed(1006, `could not reach the gateway for ${this._giveUpAfter / 1000} s`));
    return true;
  }

  /** A socket's upgrade was answered: the gateway is reachable, failures count anew. */
  _reached() {
    this._failingSince = null;
    this._everOpened = true;
  }

  /** Whether a session.start is due on the next socket (asked for, not answered yet). */
  _startWanted() {
    return this._created !== null && this._session === null && !this._refused && !this._attaching;
  }

  /**
   * One attempt for a session not created yet: get the token, open a socket and attach it;
   * if start() was asked, send session.start on it and wait for the answer.
   * @returns {Promise<"ok" | "stop" | SessionClosed>} a SessionClosed: the attempt failed.
   */
  async _openOnce() {
    let token = this._token;
    if (typeof token === "function") {
      try {
        token = await token();
      } catch (err) {
        const error = new SessionClosed(1006, `could not get a client token: ${describe(err)}`);
        if (this._everOpened) return error; // the app's backend is not reachable (yet)
        this._finish(error);
        return "stop";
      }
      if (this._closing || this._end) return "stop";
    }
    const dialedAt = now();
    return new Promise((resolve) => {
      /** @type {any} */
      let timer = null;
      /** @type {any} */
      let ws = null;
      const settle = (/** @type {any} */ outcome) => {
        clearTimeout(timer);
        if (this._pending?.ws === ws) this._pending = null;
        resolve(outcome);
      };
      ws = this._dial(
        {
          open: (/** @type {any} */ sock) => {
            clearTimeout(timer);
            if (this._pending?.ws === sock) this._pending = null;
            this._reached(); // (close() drops an attempt in flight: it never opens after that)
            this._ws = sock;
            this._setState("open");
            this._connected?.resolve();
            if (this._ws !== sock || this._end) {
              resolve("stop"); // a "connection" listener closed, or the socket went
            } else if (this._startWanted()) {
              // At once: a drop from now on settles the watch of the start this attempt awaits.
              resolve(this._sendStart(Math.max(dialedAt, this._startAskedAt)));
            } else {
              resolve("ok");
            }
          },
          frame: (sock, data) => {
            if (sock === this._ws) this._onFrame(data);
          },
          close: (/** @type {any} */ sock, /** @type {number} */ code, /** @type {string} */ reason, /** @type {boolean} */ opened) => {
            if (opened) this._onDrop(sock, code, reason);
            else settle(new SessionClosed(code, reason || "could not connect to the gateway"));
          },
        },
        token,
      );
      this._pending = {
        ws,
        stop: () => {
          this._drop(ws, 1000, ""); // no session on it: a normal close ends nothing
          settle("stop");
        },
      };
      timer = setTimeout(() => {
        this._drop(ws, 4000, "no answer to the upgrade");
        settle(new SessionClosed(1006, "no answer to the upgrade"));
      }, this._attemptTimeout);
    });
  }

  /**
   * Send session.start on the attached socket, then the session.update messages not answered
   * yet (a session started anew must get them too).
   * @param {number} from When the answer's `attemptTimeout` began (the dial, or start()).
   * @returns {Promise<"ok" | "stop" | SessionClosed>} "ok" once answered (session.created,
   *   or an error refusing it); a SessionClosed when the socket dropped first or no answer
   *   came in time (then the socket is closed with 4000): the attempt failed.
   */
  _sendStart(from) {
    const ws = this._ws;
    if (ws === null || this._end) return Promise.resolve("stop");
    return new Promise((resolve) => {
      /** @type {any} */
      let timer = null;
      const watch = {
        settle: (/** @type {any} */ outcome) => {
          clearTimeout(timer);
          if (this._startWatch === watch) this._startWatch = null;
          resolve(outcome);
        },
      };
      this._startWatch = watch;
      timer = setTimeout(() => {
        this._drop(ws, 4000, "no answer to session.start"); // not 1000: that ends a session
        this._onDrop(ws, 1006, "no answer to session.start");
      }, Math.max(0, from + this._attemptTimeout - now()));
      this._sendQuiet({ type: "session.start", ...this._startFields, client_functions: this._specs() });
      for (const msg of [...this._unanswered.values()]) this._sendQuiet(msg);
    });
  }

  /** The first session.start, on the socket connect() opened; if it fails, the loop goes on. */
  async _startOnAttached() {
    const outcome = await this._sendStart(this._startAskedAt);
    if (!(outcome instanceof SessionClosed) || this._closing || this._end) return;
    if (!this._failed()) this._retryLoop();
  }

  /**
   * One resume attempt: get the token, open a socket, send session.resume, wait for the answer.
   * @returns {Promise<"resumed" | "stop" | SessionClosed>} a SessionClosed: the attempt failed.
   */
  async _resumeOnce() {
    let token = this._token;
    if (typeof token === "function") {
      try {
        token = await token();
      } catch (err) {
        // the app's backend is not reachable (yet): like the gateway
        return new SessionClosed(1006, `could not get a client token: ${describe(err)}`);
      }
      if (this._closing || this._end) return "stop";
    }
    return this._resumeWith(token);
  }

  /**
   * @param {string | undefined} token
   * @returns {Promise<"resumed" | "stop" | SessionClosed>}
   */
  _resumeWith(token) {
    const session = /** @type {SessionCreated} */ (this._session);
    return new Promise((resolve) => {
      /** @type {"dialing" | "waiting" | "gap" | "live"} */
      let phase = "dialing";
      /** @type {any} */
      let gap = null;
      /** @type {any} */
      let timer = null;
      /** @type {any} */
      let ws = null;
      const settle = (/** @type {any} */ outcome) => {
        clearTimeout(timer);
        if (this._pending?.ws === ws) this._pending = null;
        resolve(outcome);
      };
      ws = this._dial(
        {
          open: (/** @type {any} */ sock) => {
            this._reached();
            phase = "waiting";
            try {
              sock.send(JSON.stringify(resumeOf(session, this._lastSeq)));
            } catch {
              // the close event follows
            }
          },
          frame: (/** @type {any} */ sock, /** @type {any} */ data) => {
            if (phase === "live") {
              if (sock === this._ws) this._onFrame(data);
              return;
            }
            if (this._closing || this._end || (phase !== "waiting" && phase !== "gap")) return;
            const event = parseEvent(data);
            if (!event) return;
            if (phase === "waiting" && event.type === "error" && event.code === "resume_gap") {
              gap = event; // session.snapshot follows
              phase = "gap";
              return;
            }
            phase = "live";
            this._ws = sock;
            if (!this._attaching) this._reconnects += 1;
            settle("resumed");
            this._setState("open");
            this._afterResume(event, gap);
          },
          close: (/** @type {any} */ sock, /** @type {number} */ code, /** @type {string} */ reason) => {
            if (phase === "live") {
              this._onDrop(sock, code, reason);
            } else if (this._closing || this._end) {
              settle("stop");
            } else if (FINAL_CLOSE_CODES.has(code)) {
              this._finish(new SessionClosed(code, reason));
              settle("stop");
            } else {
              settle(new SessionClosed(code, reason || "could not reach the gateway")); // wait and try again
            }
          },
        },
        token,
        session.session_id,
      );
      this._pending = {
        ws,
        stop: () => {
          this._drop(ws, 4000, "the client is closing"); // not 1000 before the answer: see _endOnGateway
          settle("stop");
        },
      };
      timer = setTimeout(() => {
        const why = phase === "dialing" ? "no answer to the upgrade" : "no answer to session.resume";
        this._drop(ws, 4000, why); // not 1000: that ends the session
        settle(new SessionClosed(1006, why));
      }, this._attemptTimeout);
    });
  }

  /**
   * End a session that has no socket (close() between attempts, or during one): a
   * short-lived socket sends session.resume and, once the gateway answered (session.resumed,
   * or resume_gap then session.snapshot), closes with 1000, which ends the session at once.
   * Within CLOSE_WAIT_MS; any failure is ignored (the gateway then ends the session after its
   * session_ttl). Nothing of it reaches the listeners.
   * @param {SessionCreated} session
   */
  async _endOnGateway(session) {
    /** @type {any} */
    let ws = null;
    let answered = false;
    let late = false;
    const ending = (async () => {
      const token = typeof this._token === "function" ? await this._token() : this._token;
      if (late) return;
      await new Promise((resolve) => {
        let gap = false;
        ws = this._dial(
          {
            open: (/** @type {any} */ sock) => {
              try {
                sock.send(JSON.stringify(resumeOf(session, this._lastSeq)));
              } catch {
                // the close event follows
              }
            },
            frame: (/** @type {any} */ sock, /** @type {any} */ data) => {
              const event = parseEvent(data);
              if (!event || answered) return;
              if (!gap && event.type === "error" && event.code === "resume_gap") {
                gap = true; // session.snapshot follows
                return;
              }
              answered = true;
              safeClose(sock, 1000, ""); // the gateway ends the session
            },
            close: () => resolve(undefined),
          },
          token,
          session.session_id,
        );
      });
    })();
    await waitAtMost(ending.catch(() => {}), CLOSE_WAIT_MS);
    late = true;
    if (!answered) this._drop(ws, 4000, ""); // never 1000 before the answer
  }

  /** The first answer to session.resume (after a resume_gap error, the snapshot) arrived. */
  _afterResume(first, gap) {
    /** @type {ClientCall[]} */
    let openCalls = [];
    /** @type {ConfirmItem[]} */
    let openConfirmations = [];
    if (gap) this._deliver(gap);
    if ((first.type === "session.snapshot" || first.type === "session.resumed") && first.agent) {
      this._agent = first.agent;
    }
    if (first.type === "session.snapshot" && gap) {
      this._lastSeq = first.last_seq;
      openCalls = first.open_calls;
      openConfirmations = first.open_confirmations;
      this._deliver(first); // pending say() iterators throw ResumeGap
    } else if (first.type === "session.resumed") {
      openCalls = first.open_calls;
      openConfirmations = first.open_confirmations;
      this._deliver(first);
    } else {
      this._onEvent(first);
    }
    if (this._end || this._ws === null) return;
    // What may have been lost on the way out goes again; the gateway applies it once.
    const results = [...this._unconfirmed.values()];
    for (let i = 0; i < results.length; i += MAX_RESULTS_PER_MESSAGE) {
      this._sendQuiet({ type: "tool.results", results: results.slice(i, i + MAX_RESULTS_PER_MESSAGE) });
    }
    for (const { msg } of [...this._runs.values()]) this._sendQuiet(msg);
    for (const msg of [...this._answers.values()]) this._sendQuiet(msg);
    for (const msg of [...this._unanswered.values()]) this._sendQuiet(msg);
    for (const call of openCalls) this._runCall(call);
    for (const item of openConfirmations) this._ask(item);
  }

  /** The conversation can go no further: tell everyone waiting. */
  _finish(error) {
    if (this._end) return;
    this._end = error;
    this._wake?.();
    this._pending?.stop();
    this._startWatch?.settle("stop");
    for (const abort of [...this._running.values(), ...this._asking.values()]) abort.abort(error);
    this._connected?.reject(error);
    this._created?.reject(error);
    for (const inbox of this._subscribers) inbox.push(new End(error));
    this._setState("closed", { error });
  }

  /** Wait `ms`, or less when the conversation ends. */
  _sleep(ms) {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        if (this._wake === done) this._wake = null;
        resolve(undefined);
      };
      const timer = setTimeout(done, ms);
      this._wake = done;
    });
  }
}

// ------------------------------------------------------------------------- helpers

/** Put on say()/events() queues when the conversation can go no further. */
class End {
  /** @param {ClientError} error */
  constructor(error) {
    this.error = error;
  }
}

/** An unbounded queue with one reader. */
class Inbox {
  constructor() {
    /** @type {any[]} */
    this._items = [];
    /** @type {((item: any) => void) | null} */
    this._reader = null;
  }

  push(item) {
    const reader = this._reader;
    if (reader) {
      this._reader = null;
      reader(item);
    } else {
      this._items.push(item);
    }
  }

  /** @returns {Promise<any>} */
  next() {
    if (this._items.length > 0) return Promise.resolve(this._items.shift());
    return new Promise((resolve) => (this._reader = resolve));
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

const DEADLINE = Symbol("deadline");

/**
 * The handler's promise, or a rejection with DEADLINE at `seconds` (or when aborted); at the
 * deadline `abort` aborts with a ClientError saying `overran`.
 */
function withDeadline(promise, seconds, abort, overran = OVERRAN) {
  return new Promise((resolve, reject) => {
    /** @type {any} */
    let timer = null;
    const onAbort = () => {
      clearTimeout(timer);
      reject(abort.signal.reason);
    };
    const stop = () => {
      clearTimeout(timer);
      abort.signal.removeEventListener("abort", onAbort);
    };
    if (typeof seconds === "number" && Number.isFinite(seconds)) {
      timer = setTimeout(() => {
        stop();
        reject(DEADLINE);
        abort.abort(new ClientError(overran)); // tell the handler it may stop
      }, Math.max(0, seconds) * 1000);
    }
    abort.signal.addEventListener("abort", onAbort, { once: true });
    promise.then(
      (value) => {
        stop();
        resolve(value);
      },
      (err) => {
        stop();
        reject(err);
      },
    );
  });
}

/** Call a handler; a synchronous throw becomes a rejection. */
function invoke(handler, args, context) {
  try {
    return Promise.resolve(handler(args, context));
  } catch (err) {
    return Promise.reject(err);
  }
}

/** A handler's value as JSON data (a copy: the result resent later is the one sent first). */
function toJson(value) {
  if (value === undefined) return null;
  const text = JSON.stringify(value);
  if (text === undefined) throw new TypeError("the client function returned a value JSON cannot hold");
  return JSON.parse(text);
}

/** `"<Error name>: <message>"`, as the model hears about a failure. */
function describe(err) {
  if (err instanceof Error || (err && typeof err === "object" && "message" in err)) {
    return `${err.name || "Error"}: ${err.message}`;
  }
  return `Error: ${String(err)}`;
}

function namedError(name, message) {
  const err = new Error(message);
  err.name = name;
  return err;
}

/** A server frame as an event with its omitted defaults filled in, or null (skip it). */
function parseEvent(data) {
  if (typeof data !== "string") return null; // the protocol's frames are text
  let raw;
  try {
    raw = JSON.parse(data);
  } catch {
    return null;
  }
  if (!raw || typeof raw !== "object" || Array.isArray(raw) || typeof raw.type !== "string") return null;
  const defaults = Object.hasOwn(DEFAULTS, raw.type) ? DEFAULTS[raw.type]() : {};
  const event = { seq: 0, ...defaults, ...raw };
  if (typeof event.seq !== "number") event.seq = 0;
  for (const key of ["calls", "open_calls", "open_confirmations"]) {
    if (Array.isArray(event[key])) {
      event[key] = event[key].map((call) => (call && typeof call === "object" ? { kind: "client", ...call } : call));
    }
  }
  if (Array.isArray(event.tools)) {
    event.tools = event.tools.map((tool) => ({
      execution: "sync",
      delivery: null,
      display_name: "",
      description: "",
      ...tool,
    }));
  }
  return event;
}

/**
 * A confirmation handler's value as an answer; anything but a boolean or an object with a
 * boolean `approved` declines, saying what came (never approve by accident).
 * @returns {{approved: boolean, args?: object, reason?: string}}
 */
function toAnswer(value) {
  if (value === true) return { approved: true };
  if (value === false) return { approved: false };
  if (value && typeof value === "object" && !Array.isArray(value) && typeof value.approved === "boolean") {
    if (!value.approved) return { approved: false, reason: value.reason == null ? undefined : String(value.reason) };
    const args = value.args;
    if (args == null) return { approved: true };
    if (typeof args !== "object" || Array.isArray(args)) {
      return { approved: false, reason: "the confirmation handler approved with args that are not an object" };
    }
    return { approved: true, args: toJson(args) }; // a copy: the answer resent later is the one sent first
  }
  const what = value === null ? "null" : Array.isArray(value) ? "an array" : typeof value;
  return { approved: false, reason: `the confirmation handler returned ${what}, not an answer` };
}

/** A decline's reason cut to the protocol's limit. */
function fitReason(reason) {
  if (reason == null || reason.length <= MAX_REASON_CHARS) return reason;
  return `${reason.slice(0, MAX_REASON_CHARS - 1)}…`;
}

/** The object without its `undefined` and `null` fields. */
function compact(object) {
  return Object.fromEntries(Object.entries(object).filter(([, v]) => v !== undefined && v !== null));
}

/** The fields a session.update sets. */
function updatedFields(update) {
  return Object.keys(update).filter((key) => key !== "type" && key !== "id");
}

/** `prefix` + 12 URL-safe random characters (like Python's `secrets.token_urlsafe(9)`). */
function randomId(prefix) {
  const bytes = new Uint8Array(9);
  if (globalThis.crypto?.getRandomValues) {
    globalThis.crypto.getRandomValues(bytes);
  } else {
    for (let i = 0; i < bytes.length; i += 1) bytes[i] = Math.floor(Math.random() * 256);
  }
  const b64 = btoa(String.fromCharCode(...bytes));
  return prefix + b64.replace(/\+/g, "-").replace(/\//g, "_");
}

/** A monotonic clock, ms. */
function now() {
  return globalThis.performance?.now ? globalThis.performance.now() : Date.now();
}

/** The session.resume of `session` from `lastSeq`. */
function resumeOf(session, lastSeq) {
  return {
    type: "session.resume",
    session_id: session.session_id,
    resume_token: session.resume_token,
    last_seq: lastSeq,
  };
}

function safeClose(ws, code, reason) {
  try {
    ws.close(code, reason);
  } catch {
    // already closed
  }
}

/** Wait for `promise`, `ms` at most. */
function waitAtMost(promise, ms) {
  if (!promise) return Promise.resolve();
  /** @type {any} */
  let timer;
  const timeout = new Promise((resolve) => (timer = setTimeout(resolve, ms)));
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

/** A listener threw: report it the way the platform does, never into the SDK. */
function reportError(err) {
  if (typeof globalThis.reportError === "function") globalThis.reportError(err);
  else console.error("gateway-client: a listener threw", err);
}
