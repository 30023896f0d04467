/**
 * @file What the client sent that the gateway has not confirmed yet, to be sent again on the
 * socket of a resume (mirrors `Outbox` in the Python SDK's `client_sdk/resume.py`). The
 * gateway applies each message once: results, `tool.run` and `tool.confirmation` by call id,
 * user messages, `session.update` and `response.truncate` by their id.
 * @module outbox
 */

/** @typedef {import("./protocol.js").ToolResult} ToolResult */
/** @typedef {import("./protocol.js").ErrorEvent} ErrorEvent */
/** @typedef {import("./server-tools.js").ToolRun} ToolRun */
/** @typedef {import("./confirm.js").Confirmation} Confirmation */

/** The most results one `tool.results` sent again carries. */
const MAX_RESULTS_PER_MESSAGE = 128;

export class Outbox {
  constructor() {
    /** @type {Map<string, ToolResult>} results sent but not confirmed by a tool.status */
    this.results = new Map();
    /**
     * tool.run requests by call id, until a tool.status for their call (or an error that
     * answers them and is not retryable).
     * @type {Map<string, {msg: ToolRun, tool: string}>}
     */
    this.runs = new Map();
    /**
     * tool.confirmation answers by call id, until a tool.status for their call, a tool.calls
     * that holds it (an approved client function's), or an error that answers them.
     * @type {Map<string, Confirmation>}
     */
    this.answers = new Map();
    /**
     * In the order sent, by id: user messages until a response to them starts, session.update
     * messages until session.updated answers them, and response.truncate until
     * response.truncated does (any: or an error).
     * @type {Map<string, any>}
     */
    this.sent = new Map();
  }

  /**
   * Keep `msg` (a user message, `session.update` or `response.truncate`: it has an id) until
   * the gateway answers it. A session.update replaces the unanswered ones sent just before it
   * (no user message in between) that it overrides in full: every field they set, it sets too.
   */
  keep(msg) {
    if (msg.type === "session.update") {
      for (const [id, earlier] of [...this.sent].reverse()) {
        if (earlier.type !== "session.update") break; // a user message between them is answered with the earlier settings
        if (updatedFields(earlier).every((field) => field in msg)) this.sent.delete(id);
      }
    }
    this.sent.set(msg.id, msg);
  }

  /** The message `id` was answered (a response to it started, an update applied, an error). */
  answered(id) {
    this.sent.delete(id);
  }

  /** @param {ToolResult} result */
  keepResult(result) {
    this.results.set(result.call_id, result);
  }

  /** @param {ToolRun} msg @param {string} tool the call's */
  keepRun(msg, tool) {
    this.runs.set(msg.call_id, { msg, tool });
  }

  /** Keep `msg` (it replaces an earlier answer for its call). @param {Confirmation} msg */
  keepAnswer(msg) {
    this.answers.set(msg.call_id, msg);
  }

  /** The call arrived in tool.calls (an approved client function's): its answer was applied. */
  forgetAnswer(callId) {
    this.answers.delete(callId);
  }

  /** A tool.status for the call: the gateway has what was sent for it. */
  forgetCall(callId) {
    this.results.delete(callId);
    this.runs.delete(callId);
    this.answers.delete(callId);
  }

  /**
   * The tool.run that `event` refuses for good (not `retryable`), forgotten, with its call.
   * @param {ErrorEvent} event
   * @returns {{callId: string, tool: string} | null}
   */
  refusedRun(event) {
    if (event.retryable) return null; // rate_limited: kept, sent again after a resume
    for (const [callId, run] of this.runs) {
      if (run.msg.id !== event.in_reply_to) continue;
      this.runs.delete(callId);
      return { callId, tool: run.tool };
    }
    return null;
  }

  /**
   * The tool.confirmation that `event` refuses for good (not `retryable`), forgotten.
   * @param {ErrorEvent} event
   * @returns {Confirmation | null}
   */
  refusedAnswer(event) {
    if (event.retryable) return null; // rate_limited: kept, sent again after a resume
    for (const [callId, msg] of this.answers) {
      if (msg.id !== event.in_reply_to) continue;
      this.answers.delete(callId);
      return msg;
    }
    return null;
  }

  /**
   * Everything unconfirmed, in the order to send it on a resumed socket: results, tool.run
   * requests, tool.confirmation answers, then user messages and the rest in the order sent.
   */
  resend() {
    const results = [...this.results.values()];
    const batches = [];
    for (let i = 0; i < results.length; i += MAX_RESULTS_PER_MESSAGE) {
      batches.push({ type: "tool.results", results: results.slice(i, i + MAX_RESULTS_PER_MESSAGE) });
    }
    const runs = [...this.runs.values()].map(({ msg }) => msg);
    return [...batches, ...runs, ...this.answers.values(), ...this.sent.values()];
  }
}

/** The fields a session.update sets. */
function updatedFields(update) {
  return Object.keys(update).filter((key) => key !== "type" && key !== "id");
}
