/**
 * @file Running an app's handler (a client function, a server-tool, confirmation or widget
 * handler) within a call's deadline, and its value as JSON data (mirrors the Python SDK's
 * `client_sdk/handler.py`). What to send for the outcome is the caller's.
 * @module handler
 */

import { ClientError } from "./errors.js";

/**
 * The abort reason an overrunning handler's `signal` gets when the caller names none (the
 * server-tool handler's included: its result's error says it in its own words).
 */
export const OVERRAN = "the client function overran its deadline";

/** What `withDeadline` rejects with when the deadline passed first. */
export const DEADLINE = Symbol("deadline");

/**
 * The handler's promise, or a rejection with DEADLINE at `seconds` (or when aborted); at the
 * deadline `abort` aborts with a ClientError saying `overran`.
 */
export function withDeadline(promise, seconds, abort, overran = OVERRAN) {
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
export function invoke(handler, args, context) {
  try {
    return Promise.resolve(handler(args, context));
  } catch (err) {
    return Promise.reject(err);
  }
}

/** A handler's value as JSON data (a copy: the result resent later is the one sent first). */
export function toJson(value) {
  if (value === undefined) return null;
  const text = JSON.stringify(value);
  if (text === undefined) throw new TypeError("the client function returned a value JSON cannot hold");
  return JSON.parse(text);
}
