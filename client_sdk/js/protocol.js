/**
 * @file The wire vocabulary of protocol `gateway.v1` (docs/protocol.md) as this SDK sees it:
 * the server events' shapes (JSDoc types), the subprotocols, and the decoding of a server
 * frame with its omitted defaults filled in. It mirrors what the Python SDK imports from
 * `gateway.protocol`; nothing here opens a socket or keeps state.
 * @module protocol
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
 * @property {number} input_audio_tokens Of input_tokens, audio (a speech-to-speech model's).
 * @property {number} output_audio_tokens Of output_tokens, audio.
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
 * @property {string} [device_id] The id of the device that started the session (this one):
 *   a reconnect resumes as this device, so the session's other devices stay attached.
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
 * @property {string} [device_id] The device this socket is, when the resume named one.
 */

/**
 * Connection-level (no `seq`, never replayed): the answer to `session.attach` (the `join`
 * option): this socket joined the session as one more device, beside those attached
 * already. The replay from the attach's `last_seq` follows, as after `session.resumed`
 * (on a gap, `resume_gap` and `session.snapshot` come instead of it).
 * @typedef {object} SessionAttached
 * @property {"session.attached"} type
 * @property {0} seq
 * @property {string} session_id
 * @property {string} device_id This device's id: a reconnect resumes as it.
 * @property {number} replayed_from
 * @property {number} last_seq
 * @property {string | null} agent The agent the session is with now.
 * @property {ClientCall[]} open_calls Calls of this device's functions still waiting for a result.
 * @property {ConfirmItem[]} open_confirmations
 * @property {number} devices How many sockets are attached to the session now, this one included.
 */

/**
 * Connection-level (no `seq`, never replayed): the gateway will close this socket for its
 * own reasons in `time_left` seconds. The SDK resumes on a second socket at once and
 * switches to it when the gateway answers (the app sees `session.resumed` then), so the
 * close loses nothing.
 * @typedef {object} SessionGoingAway
 * @property {"session.going_away"} type
 * @property {0} seq
 * @property {"shutdown" | "session_moved" | "max_socket_age"} reason `shutdown`: the node
 *   drains; `session_moved`: another node drives the session now; `max_socket_age`: the
 *   socket reached the gateway's maximum age.
 * @property {number} time_left Seconds until the close (0: now).
 */

/**
 * What `GatewayClient.session` is on a device that joined a session (the `join` option),
 * made by the SDK from the join's answer: there is no `session.created` for it.
 * @typedef {object} JoinedSession
 * @property {string} session_id
 * @property {string} resume_token The join's.
 * @property {string | null} device_id This device's id (`session.attached`'s).
 * @property {string | null} agent The agent the session was with when this device joined.
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
 * @typedef {SessionCreated | SessionUpdated | SessionResumed | SessionAttached | SessionGoingAway
 *   | SessionSnapshot | AgentTransferred
 *   | TextSegment | ResponseTruncated | ResponseCreated | ResponseRetrying | TextDelta | TextDone | ToolCalls | ToolConfirm | ToolStatus | ResponseDone
 *   | ErrorEvent | Pong} ServerEvent
 */

// ------------------------------------------------------------------------- constants

/** The WebSocket subprotocol the client offers. */
export const SUBPROTOCOL = "gateway.v1";
/** A client token is offered as the subprotocol `gateway.token.<token>`, beside `gateway.v1`. */
export const TOKEN_SUBPROTOCOL_PREFIX = "gateway.token.";

/** Defaults of the fields servers omit, by event type. */
export const DEFAULTS = {
  "session.created": () => ({ tools: [], limits: null }),
  "session.updated": () => ({ tools: [], in_reply_to: null }),
  "session.resumed": () => ({ agent: null, open_calls: [], open_confirmations: [] }),
  "session.attached": () => ({ agent: null, open_calls: [], open_confirmations: [], devices: 1 }),
  "session.going_away": () => ({}),
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

// ------------------------------------------------------------------------- decoding

/** A server frame as an event with its omitted defaults filled in, or null (skip it). */
export function parseEvent(data) {
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

// ------------------------------------------------------------------------- client messages

/**
 * One call's result as `tool.results` carries it: its output, or an error the model hears.
 * @typedef {{call_id: string, tool: string, output?: any, error?: string}} ToolResult
 */

/** The object without its `undefined` and `null` fields (the protocol's omitted ones). */
export function compact(object) {
  return Object.fromEntries(Object.entries(object).filter(([, v]) => v !== undefined && v !== null));
}

/** `prefix` + 12 URL-safe random characters (like Python's `secrets.token_urlsafe(9)`). */
export function randomId(prefix) {
  const bytes = new Uint8Array(9);
  if (globalThis.crypto?.getRandomValues) {
    globalThis.crypto.getRandomValues(bytes);
  } else {
    for (let i = 0; i < bytes.length; i += 1) bytes[i] = Math.floor(Math.random() * 256);
  }
  const b64 = btoa(String.fromCharCode(...bytes));
  return prefix + b64.replace(/\+/g, "-").replace(/\//g, "_");
}

/**
 * What a device says of itself when it resumes as itself: its id and the functions it offers
 * now (declared again on every reconnect: a node the session moved to knows them only so).
 * @typedef {object} Device
 * @property {string} device_id
 * @property {object[]} client_functions ToolSpecs.
 */

/**
 * The session.resume of `session` from `lastSeq`; with `device`, as that device (the
 * session's other devices stay attached), else as the whole session (old gateways, and a
 * session whose `session.created` named no device).
 * @param {{session_id: string, resume_token: string}} session
 * @param {number} lastSeq
 * @param {Device | null} [device]
 */
export function resumeOf(session, lastSeq, device = null) {
  return {
    type: "session.resume",
    session_id: session.session_id,
    resume_token: session.resume_token,
    last_seq: lastSeq,
    ...(device ? { device_id: device.device_id, client_functions: device.client_functions } : {}),
  };
}

/**
 * The session.attach that joins the session `sessionId` as one more device, from its first
 * event (`last_seq` 0: everything the gateway still has is replayed).
 * @param {string} sessionId
 * @param {string} resumeToken
 * @param {object[]} clientFunctions ToolSpecs: the calls of these come to this device.
 */
export function attachOf(sessionId, resumeToken, clientFunctions) {
  return {
    type: "session.attach",
    session_id: sessionId,
    resume_token: resumeToken,
    last_seq: 0,
    client_functions: clientFunctions,
  };
}
