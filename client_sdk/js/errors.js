/**
 * @file What the SDK throws (mirrors the Python SDK's `client_sdk/exceptions.py`), and how a
 * failure is put into words for the model.
 * @module errors
 */

/** @typedef {import("./protocol.js").ErrorEvent} ErrorEvent */
/** @typedef {import("./protocol.js").SessionSnapshot} SessionSnapshot */

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
    /** Seconds after which the same request may succeed (`rate_limited`,
     * `budget_exceeded`), if the gateway said. @type {number | null} */
    this.retryAfter = event.retry_after ?? null;
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

/**
 * A failure in words, as the gateway, the model and the user hear of it (mirrors Python's
 * `failure_text` in client_sdk/handler.py): `"<Error name>: <message>"` (`"TypeError: bad zip
 * code"`), or the message alone when the name is the generic `"Error"`, which says nothing
 * (`throw new Error("the user turned off battery access")`, a thrown string); a named error
 * keeps its name (`RangeError`, a DOMException's, `namedError`'s). Without a message, the name
 * alone.
 * @param {unknown} err What was thrown.
 * @returns {string}
 */
export function describe(err) {
  let name = "Error";
  let message;
  if (err instanceof Error || (err && typeof err === "object" && "message" in err)) {
    const { name: own, message: text } = /** @type {{name?: unknown, message?: unknown}} */ (err);
    name = typeof own === "string" && own ? own : "Error";
    message = text == null ? "" : String(text);
  } else {
    message = String(err);
  }
  if (!message) return name;
  return name === "Error" ? message : `${name}: ${message}`;
}

/** An Error whose `name` is `name` (what `describe` puts first): Python's names, say `LookupError`. */
export function namedError(name, message) {
  const err = new Error(message);
  err.name = name;
  return err;
}
