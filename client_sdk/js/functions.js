/**
 * @file Client functions: the app's functions the gateway's model can call on this device
 * (mirrors the Python SDK's `client_sdk/functions.py`): how one is declared to the gateway,
 * and running one call of it within the call's deadline.
 * @module functions
 */

import { ClientError, describe, namedError } from "./errors.js";
import { DEADLINE, OVERRAN, invoke, toJson, withDeadline } from "./handler.js";
import { compact } from "./protocol.js";

/** @typedef {import("./protocol.js").ClientCall} ClientCall */
/** @typedef {import("./protocol.js").ToolResult} ToolResult */

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
 * A registered function: how it is declared, and what runs it.
 * @typedef {{spec: ToolSpec, handler: ClientFunctionHandler}} ClientFunction
 */

const FUNCTION_NAME = /^[a-z][a-z0-9_]*$/;

/**
 * Describe `handler` as the client function `name` (`GatewayClient.clientFunction`).
 * @param {string} name
 * @param {ClientFunctionHandler} handler
 * @param {ClientFunctionOptions} options
 * @returns {ClientFunction}
 * @throws {ClientError} the name is not one the protocol allows.
 */
export function makeFunction(name, handler, options) {
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
  return { spec, handler };
}

/**
 * Run `call` with `fn` (`undefined`: this client has no function by that name) within the
 * call's deadline; a failure or an overrun becomes the result's `error`.
 * @param {ClientFunction | undefined} fn
 * @param {ClientCall} call
 * @param {AbortController} abort aborted at the deadline (by `withDeadline`) or on close.
 * @returns {Promise<ToolResult>}
 */
export async function answer(fn, call, abort) {
  try {
    if (!fn) throw namedError("LookupError", `this client has no function '${call.tool}'`);
    const running = invoke(fn.handler, call.args ?? {}, { signal: abort.signal, call });
    const output = await withDeadline(running, call.timeout, abort);
    return { call_id: call.call_id, tool: call.tool, output: toJson(output) };
  } catch (err) {
    return { call_id: call.call_id, tool: call.tool, error: err === DEADLINE ? OVERRAN : describe(err) };
  }
}
