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

/** `"<Error name>: <message>"`, as the model hears about a failure. */
export function describe(err) {
  if (err instanceof Error || (err && typeof err === "object" && "message" in err)) {
    return `${err.name || "Error"}: ${err.message}`;
  }
  return `Error: ${String(err)}`;
}

/** An Error whose `name` is `name` (what `describe` puts first): Python's names, say `LookupError`. */
export function namedError(name, message) {
  const err = new Error(message);
  err.name = name;
  return err;
}
