/**
 * @file Widget tools: calls whose result comes from the user, not from code. The call carries
 * a `widget` (a choice, a yes/no question, a short form); the app's handler (`onWidget`) shows
 * it and returns the user's answer (`{ choice }`, `{ confirmed }`, the form's values), which
 * is the call's output. Mirrors the Python SDK's `client_sdk/widgets.py`.
 * @module widgets
 */

import { describe } from "./errors.js";
import { DEADLINE, invoke, toJson, withDeadline } from "./handler.js";

/** @typedef {import("./protocol.js").ClientCall} ClientCall */
/** @typedef {import("./protocol.js").ToolResult} ToolResult */

/**
 * Shows a widget tool's call to the user and returns their answer (`onWidget`).
 * @callback WidgetHandler
 * @param {ClientCall} call The call; `call.widget` says what to ask (`type`, `prompt`...).
 * @param {{signal: AbortSignal}} context `signal` aborts at the call's deadline, on close, or
 *   when a `tool.status` ends the call (`cancelled`, `expired`, `failed`) before the answer.
 * @returns {any} The call's output (`{ choice }`, `{ confirmed }`, or the form's values), or
 *   a Promise of it; a throw is an error result.
 */

const NOT_ANSWERED = "the user did not answer in time";

/**
 * The result of the widget `call`: the user's answer, or an error result when the handler
 * threw or overran the call's deadline; `null` (send nothing) when `abort` aborted first,
 * because the conversation closed or a `tool.status` ended the call.
 * @param {WidgetHandler} handler
 * @param {ClientCall} call
 * @param {AbortController} abort
 * @returns {Promise<ToolResult | null>}
 */
export async function askUser(handler, call, abort) {
  try {
    const running = invoke(handler, call, { signal: abort.signal });
    const output = await withDeadline(running, call.timeout, abort, NOT_ANSWERED);
    return { call_id: call.call_id, tool: call.tool, output: toJson(output) };
  } catch (err) {
    if (err !== DEADLINE && abort.signal.aborted) return null; // closed, or the call ended
    return { call_id: call.call_id, tool: call.tool, error: err === DEADLINE ? NOT_ANSWERED : describe(err) };
  }
}
