/**
 * @file The client's side of tool calls: the client functions and the app's handlers that
 * answer them, each call run (and each confirmation asked) once per call id, however often
 * `tool.calls`, `open_calls`, a replay or a resume brings it again. What to answer is the
 * concern of functions.js, server-tools.js, widgets.js and confirm.js; what is sent is kept in
 * the outbox until the gateway confirms it. A call that ends while this device still runs it
 * (another device answered it first, or it was cancelled or expired: a `tool.status` says
 * so) is stopped, its handler's signal aborted, and nothing is sent for it.
 * @module calls
 */

import { ask as askHandler, confirmation, refusedEdit } from "./confirm.js";
import { ClientError } from "./errors.js";
import { answer } from "./functions.js";
import { decide } from "./server-tools.js";
import { askUser } from "./widgets.js";

/** @typedef {import("./protocol.js").ClientCall} ClientCall */
/** @typedef {import("./protocol.js").ConfirmItem} ConfirmItem */
/** @typedef {import("./protocol.js").ErrorEvent} ErrorEvent */
/** @typedef {import("./protocol.js").ToolResult} ToolResult */
/** @typedef {import("./protocol.js").ToolStatus} ToolStatus */
/** @typedef {import("./functions.js").ClientFunction} ClientFunction */
/** @typedef {import("./functions.js").ToolSpec} ToolSpec */
/** @typedef {import("./server-tools.js").ServerToolHandler} ServerToolHandler */
/** @typedef {import("./confirm.js").ConfirmHandler} ConfirmHandler */
/** @typedef {import("./confirm.js").Answer} Answer */
/** @typedef {import("./widgets.js").WidgetHandler} WidgetHandler */
/** @typedef {import("./outbox.js").Outbox} Outbox */

/** tool.status values that end a call: a handler still running it stops (its signal aborts). */
const CALL_ENDED = new Set(["completed", "failed", "cancelled", "expired"]);

export class Calls {
  /**
   * @param {Outbox} outbox keeps what is sent until the gateway confirms it.
   * @param {(msg: object) => boolean} send sends if connected (a lost message goes again on resume).
   * @param {() => import("./errors.js").ClientError | null} ended why the conversation ended, if it did.
   */
  constructor(outbox, send, ended) {
    this._outbox = outbox;
    this._send = send;
    this._ended = ended;
    /** @type {Map<string, ClientFunction>} */
    this.functions = new Map();
    /** @type {ServerToolHandler | null} decides server-kind calls (manual tool mode) */
    this.serverTool = null;
    /** @type {ConfirmHandler | null} asks the user about calls of tools marked confirm */
    this.confirm = null;
    /** @type {WidgetHandler | null} shows widget tools' calls to the user */
    this.widget = null;

    /** @type {Set<string>} every call id ever run (exactly once per call id) */
    this._ran = new Set();
    /** @type {Map<string, AbortController>} handlers still running */
    this._running = new Map();
    /** @type {Set<string>} running calls a tool.status ended: nothing is sent for them */
    this._endedCalls = new Set();
    /** @type {Set<string>} every call id whose confirmation was asked (once per call id) */
    this._asked = new Set();
    /** @type {Map<string, AbortController>} confirmation handlers still running */
    this._asking = new Map();
  }

  /** The client functions as declared in `session.start` and `session.update`. @returns {ToolSpec[]} */
  specs() {
    return [...this.functions.values()].map((f) => f.spec);
  }

  /** Run a call unless its id ran already (calls come in tool.calls, open_calls, replays). */
  run(call) {
    if (!call || typeof call.call_id !== "string" || this._ended()) return;
    if (this._ran.has(call.call_id)) return;
    this._ran.add(call.call_id);
    const abort = new AbortController();
    this._running.set(call.call_id, abort);
    this._execute(call, abort).finally(() => {
      this._running.delete(call.call_id);
      this._endedCalls.delete(call.call_id);
    });
  }

  /** Ask the user about a call unless it was asked already (tool.confirm, open_confirmations). */
  ask(item) {
    if (!item || typeof item.call_id !== "string" || this._ended()) return;
    if (this._asked.has(item.call_id)) return;
    this._asked.add(item.call_id);
    const abort = new AbortController();
    this._asking.set(item.call_id, abort);
    this._confirmCall(item, abort).finally(() => this._asking.delete(item.call_id));
  }

  /**
   * A call still running here ended without this device's answer (another device's result
   * came first, or it was cancelled or expired): stop it (its signal aborts) and send nothing.
   * @param {ToolStatus} event
   */
  onStatus(event) {
    const running = this._running.get(event.call_id);
    if (!running || !CALL_ENDED.has(event.status)) return;
    this._endedCalls.add(event.call_id);
    running.abort(new ClientError(`the call was ${event.status}`));
  }

  /** Whether nothing is to be sent for `callId`: the conversation or the call ended. */
  _unanswerable(callId) {
    return this._ended() !== null || this._endedCalls.has(callId);
  }

  /**
   * An error answering a message of ours. One that refuses a tool.run for good forgets the
   * run; unless the call is unknown, it stays the client's, so the refusal becomes its error
   * result (the response goes on). One that refuses a tool.confirmation for good forgets it;
   * an approval refused for its arguments (the call still waits) becomes a decline that says
   * why.
   * @param {ErrorEvent} event
   */
  onRefused(event) {
    const run = this._outbox.refusedRun(event);
    if (run && event.code !== "unknown_call") {
      this._sendResult({ call_id: run.callId, tool: run.tool, error: event.message });
    }
    const refused = this._outbox.refusedAnswer(event);
    if (refused && event.code === "invalid_message" && refused.approved) {
      this._sendAnswer(refused.call_id, refusedEdit(event.message));
    }
  }

  /** The conversation ended: every handler still running is told (its signal aborts). */
  abortAll(error) {
    for (const abort of [...this._running.values(), ...this._asking.values()]) abort.abort(error);
  }

  /** @param {ClientCall} call @param {AbortController} abort */
  async _execute(call, abort) {
    await null; // listeners see the tool.calls event before any handler runs
    if (call.kind === "server") {
      // manual tool mode: never a client function's call
      const outcome = await decide(this.serverTool, call, abort);
      if (this._unanswerable(call.call_id)) return; // closed, or the call ended elsewhere
      if ("run" in outcome) {
        this._outbox.keepRun(outcome.run, call.tool);
        this._send(outcome.run);
      } else {
        this._sendResult(outcome.result);
      }
      return;
    }
    const fn = this.functions.get(call.tool);
    if (!fn && call.widget && this.widget) {
      await this._showWidget(call, this.widget, abort);
      return;
    }
    const result = await answer(fn, call, abort);
    if (this._unanswerable(call.call_id)) return; // closed, or the call ended elsewhere
    this._sendResult(result);
  }

  /**
   * A widget call: the user's answer (the handler's value) as its result; nothing when the
   * call ended first (a tool.status aborted the signal) or the conversation closed.
   * @param {ClientCall} call @param {WidgetHandler} handler @param {AbortController} abort
   */
  async _showWidget(call, handler, abort) {
    const result = await askUser(handler, call, abort);
    if (result === null || this._unanswerable(call.call_id)) return;
    this._sendResult(result);
  }

  /**
   * The handler's answer to `item`, sent as a tool.confirmation (a decline when there is no
   * handler, it throws, overruns, or answers something else).
   * @param {ConfirmItem} item @param {AbortController} abort
   */
  async _confirmCall(item, abort) {
    await null; // listeners see the tool.confirm event before the handler runs
    const decision = await askHandler(this.confirm, item, abort);
    if (this._ended()) return; // closed: nobody to answer
    this._sendAnswer(item.call_id, decision);
  }

  /** Send a result, kept until a tool.status confirms it. @param {ToolResult} result */
  _sendResult(result) {
    this._outbox.keepResult(result);
    this._send({ type: "tool.results", results: [result] });
  }

  /**
   * Send a tool.confirmation, kept until the gateway confirms it (it replaces an earlier one).
   * @param {string} callId @param {Answer} answer
   */
  _sendAnswer(callId, answer) {
    const msg = confirmation(callId, answer);
    this._outbox.keepAnswer(msg);
    this._send(msg);
  }
}
