/**
 * @file Confirmation of tool calls (`tool.confirm`): the app asks the user (`onConfirm`), the
 * SDK answers with a `tool.confirmation`. A tool marked `confirm` does not run on the model's
 * guess alone; without a handler every such call is declined: a client that cannot ask the
 * user never approves. Mirrors the Python SDK's `client_sdk/confirm.py`.
 * @module confirm
 */

import { describe } from "./errors.js";
import { DEADLINE, invoke, toJson, withDeadline } from "./handler.js";
import { compact, randomId } from "./protocol.js";

/** @typedef {import("./protocol.js").ConfirmItem} ConfirmItem */

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
 * The answer to one call, before it becomes a `tool.confirmation`.
 * @typedef {{approved: boolean, args?: object, reason?: string}} Answer
 */

/**
 * A `tool.confirmation`, kept until the gateway confirms it.
 * @typedef {{type: "tool.confirmation", id: string, call_id: string, approved: boolean, args?: object, reason?: string}} Confirmation
 */

/** The reason of the decline sent when the app set no confirmation handler. */
const NO_HANDLER = "this client cannot ask the user";
const OVERRAN = "the confirmation handler overran its deadline";
/** The protocol's limit on a decline's `reason`. */
const MAX_REASON_CHARS = 1000;

/**
 * The answer to `item`: the handler's decision within the item's timeout. No handler, an
 * overrun, a throw or a value that is not an answer declines the call, with a reason that
 * says which.
 * @param {ConfirmHandler | null} handler
 * @param {ConfirmItem} item
 * @param {AbortController} abort aborted at the deadline (by `withDeadline`) or on close.
 * @returns {Promise<Answer>}
 */
export async function ask(handler, item, abort) {
  if (!handler) return { approved: false, reason: NO_HANDLER };
  try {
    const running = invoke(handler, item, { signal: abort.signal });
    return toAnswer(await withDeadline(running, item.timeout, abort, OVERRAN));
  } catch (err) {
    const reason = err === DEADLINE ? OVERRAN : `the confirmation handler failed (${describe(err)})`;
    return { approved: false, reason };
  }
}

/**
 * The `tool.confirmation` that sends `answer` for the call `callId` (a new id each time: one
 * sent again after a resume is the same message).
 * @param {string} callId
 * @param {Answer} answer
 * @returns {Confirmation}
 */
export function confirmation(callId, { approved, args, reason }) {
  return {
    type: /** @type {const} */ ("tool.confirmation"),
    id: randomId("cnf_"),
    call_id: callId,
    approved,
    ...compact({ args, reason: fitReason(reason) }),
  };
}

/**
 * The decline that answers a call whose approval the gateway refused (edited arguments off the
 * tool's schema): the call would otherwise wait until it expires.
 * @param {string} message The refusal's.
 * @returns {Answer}
 */
export function refusedEdit(message) {
  return { approved: false, reason: `the edited arguments were refused (${message})` };
}

/**
 * A confirmation handler's value as an answer; anything but a boolean or an object with a
 * boolean `approved` declines, saying what came (never approve by accident).
 * @returns {Answer}
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

