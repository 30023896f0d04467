/**
 * @file Server tools offered to the client in manual tool mode (`tool.calls` with
 * `kind: "server"`): the app's handler (`onServerTool`) answers one, or has the gateway run
 * it (`tool.run`). Without a handler every such call goes back to the gateway to run, so a
 * session in manual mode behaves as in auto mode. Mirrors the Python SDK's
 * `client_sdk/server_tools.py`.
 * @module server-tools
 */

import { describe } from "./errors.js";
import { DEADLINE, invoke, toJson, withDeadline } from "./handler.js";
import { compact, randomId } from "./protocol.js";

/** @typedef {import("./protocol.js").ClientCall} ClientCall */
/** @typedef {import("./protocol.js").ToolResult} ToolResult */

/**
 * Decides a server tool's call in manual tool mode (`onServerTool`).
 * @callback ServerToolHandler
 * @param {ClientCall} call The call (`kind: "server"`): `tool`, `args`, `deadline`...
 * @param {{signal: AbortSignal}} context `signal` aborts at the deadline or on close.
 * @returns {any} The call's output (a JSON value), `RUN_ON_GATEWAY` or a `RunOnGateway`
 *   (have the gateway run it), or a Promise of one of these; a throw is an error result.
 */

/**
 * A `tool.run`: the gateway runs the call (with `args` instead of the model's, if given).
 * @typedef {{type: "tool.run", id: string, call_id: string, args?: Record<string, any>}} ToolRun
 */

const OVERRAN = "the server-tool handler overran its deadline";

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

/**
 * What to send for the server-kind `call`: a `tool.run` (no handler, or the handler returned
 * a `RunOnGateway`), or a result (its output; its throw, or an overrun of the call's
 * deadline, as the result's `error`).
 * @param {ServerToolHandler | null} handler
 * @param {ClientCall} call
 * @param {AbortController} abort aborted at the deadline (by `withDeadline`) or on close.
 * @returns {Promise<{result: ToolResult} | {run: ToolRun}>}
 */
export async function decide(handler, call, abort) {
  /** @type {Record<string, any> | undefined} edited arguments for tool.run */
  let args;
  if (handler) {
    try {
      const outcome = await withDeadline(invoke(handler, call, { signal: abort.signal }), call.timeout, abort);
      if (!(outcome instanceof RunOnGateway)) {
        return { result: { call_id: call.call_id, tool: call.tool, output: toJson(outcome) } };
      }
      if (outcome.args != null) args = toJson(outcome.args); // a copy: the run resent later is the one sent first
    } catch (err) {
      const error = err === DEADLINE ? OVERRAN : describe(err);
      return { result: { call_id: call.call_id, tool: call.tool, error } };
    }
  }
  return { run: { type: "tool.run", id: randomId("run_"), call_id: call.call_id, ...compact({ args }) } };
}
