/**
 * @file One WebSocket to the gateway (mirrors the Python SDK's `client_sdk/connection.py`):
 * the URL a resuming socket dials, opening a socket with the subprotocols and routing its
 * events, giving up on one, and sending a frame. Which socket the session is on, and when to
 * open another, is `resume.js`'s.
 * @module connection
 */

import { describe } from "./errors.js";
import { SUBPROTOCOL, TOKEN_SUBPROTOCOL_PREFIX } from "./protocol.js";

/**
 * @typedef {"idle" | "connecting" | "open" | "reconnecting" | "closed"} ConnectionState
 * `idle` only before `connect()`; the "connection" listeners see the other four.
 */

/**
 * What "connection" listeners receive.
 * @typedef {object} ConnectionEvent
 * @property {Exclude<ConnectionState, "idle">} state
 * @property {number} reconnects Successful resumes so far.
 * @property {import("./errors.js").ClientError} [error] With `closed`: why (a `SessionClosed`).
 */

/**
 * The handlers of one socket's events (`Dialer.dial`).
 * @typedef {object} SocketHandlers
 * @property {(ws: any) => void} open The upgrade succeeded.
 * @property {(ws: any, data: any) => void} frame A frame arrived (after the open).
 * @property {(ws: any, code: number, reason: string, opened: boolean) => void} close Once per
 *   socket; `ws` is null when the WebSocket constructor threw.
 */

/**
 * The query parameter naming the session a socket resumes, for load balancers that route by
 * it (deploy/nginx.conf hashes it, so every resume of a session reaches the same node). The
 * gateway ignores it: the session is the one `session.resume` names.
 */
export const SESSION_PARAM = "session";

const WS_OPEN = 1;

/**
 * `url` with `session=<sessionId>` in its query, for a socket that resumes that session
 * (mirrors Python's `resume_url`): what the URL's query has (a token...) is kept as written,
 * and a `session` parameter already in it is replaced, never repeated. A relative URL stays
 * relative.
 * @param {string} url
 * @param {string} sessionId
 * @returns {string}
 */
export function resumeUrl(url, sessionId) {
  const text = String(url);
  const hashAt = text.indexOf("#");
  const fragment = hashAt < 0 ? "" : text.slice(hashAt);
  const base = hashAt < 0 ? text : text.slice(0, hashAt);
  const queryAt = base.indexOf("?");
  const path = queryAt < 0 ? base : base.slice(0, queryAt);
  const query = queryAt < 0 ? "" : base.slice(queryAt + 1);
  const kept = query.split("&").filter((pair) => pair && queryKey(pair) !== SESSION_PARAM);
  kept.push(`${SESSION_PARAM}=${encodeURIComponent(sessionId)}`);
  return `${path}?${kept.join("&")}${fragment}`;
}

/** The decoded name of one `name=value` pair of a query (as written when it does not decode). */
function queryKey(pair) {
  const key = pair.split("=", 1)[0].replace(/\+/g, " ");
  try {
    return decodeURIComponent(key);
  } catch {
    return key;
  }
}

/** Opens the sockets of one conversation, and remembers which it gave up on. */
export class Dialer {
  /**
   * @param {typeof WebSocket} WebSocketImpl The WebSocket class (a browser's, Node's, `ws`).
   * @param {string} url The gateway's URL of `/v1/realtime`.
   */
  constructor(WebSocketImpl, url) {
    this._WebSocket = WebSocketImpl;
    this._url = url;
    /** @type {WeakMap<object, Promise<void>>} resolved when that socket closed (or failed to open) */
    this._closed = new WeakMap();
    /** @type {WeakSet<object>} sockets given up on: their events are ignored */
    this._dropped = new WeakSet();
  }

  /** The gateway's URL of `/v1/realtime`. */
  get url() {
    return this._url;
  }

  /**
   * Open a socket and route its events. `close` comes once per socket, with `opened` =
   * whether it ever opened: for a close event, or for an `error` event before the open
   * (Node 20's WebSocket fires only that when the upgrade fails). Nothing comes from a
   * socket after `drop()`.
   * @param {SocketHandlers} on
   * @param {string | undefined} token offered as the `gateway.token.<token>` subprotocol
   * @param {string} [sessionId] the session the socket resumes: named in the URL (`resumeUrl`)
   * @returns {any} the socket, or null when the constructor threw (then `close` follows).
   */
  dial(on, token, sessionId) {
    let ws;
    let opened = false;
    let closed = false;
    const protocols = token == null ? [SUBPROTOCOL] : [SUBPROTOCOL, TOKEN_SUBPROTOCOL_PREFIX + token];
    try {
      const url = sessionId == null ? this._url : resumeUrl(this._url, sessionId);
      ws = new this._WebSocket(url, protocols);
      ws.binaryType = "arraybuffer"; // the answer's audio (audio.js parses it), not Blobs
    } catch (err) {
      queueMicrotask(() => on.close(null, 1006, describe(err), false));
      return null;
    }
    /** @type {() => void} */
    let markClosed = () => {};
    this._closed.set(ws, new Promise((resolve) => (markClosed = resolve)));
    const end = (/** @type {number} */ code, /** @type {string} */ reason) => {
      if (closed) return false;
      closed = true;
      markClosed();
      if (!this._dropped.has(ws)) on.close(ws, code, reason, opened);
      return true;
    };
    ws.onopen = () => {
      if (opened || closed || this._dropped.has(ws)) return;
      opened = true;
      on.open(ws);
    };
    ws.onmessage = (/** @type {{data: any}} */ e) => {
      if (opened && !closed && !this._dropped.has(ws)) on.frame(ws, e.data);
    };
    ws.onerror = () => {
      // After the open a close event follows; before it, one may never come.
      if (!opened && end(1006, "could not connect to the gateway")) safeClose(ws, 4000, "");
    };
    ws.onclose = (/** @type {{code?: number, reason?: string}} */ e) => {
      end(e?.code ?? 1006, e?.reason ?? "");
    };
    return ws;
  }

  /**
   * Give up on a socket: ignore its events from now on and close it (with 1000 only when
   * that is meant: 1000 ends the session of a socket the gateway attached to it).
   */
  drop(ws, code, reason) {
    if (!ws) return;
    this._dropped.add(ws);
    safeClose(ws, code, reason);
  }

  /**
   * Settled when `ws` (one of this dialer's) closed or failed to open.
   * @returns {Promise<void> | undefined}
   */
  closed(ws) {
    return this._closed.get(ws);
  }
}

/**
 * Send `msg` as a JSON text frame on `ws` if it is open.
 * @returns {boolean} whether it went out (a message lost to a drop is recovered on resume).
 */
export function sendFrame(ws, msg) {
  if (typeof ws.readyState === "number" && ws.readyState !== WS_OPEN) return false;
  try {
    ws.send(JSON.stringify(msg));
    return true;
  } catch {
    return false;
  }
}

/**
 * Send `data` (audio: PCM16) as a binary frame on `ws` if it is open.
 * @param {any} ws
 * @param {ArrayBuffer | ArrayBufferView} data
 * @returns {boolean} whether it went out (live audio lost to a drop is not sent again).
 */
export function sendBinary(ws, data) {
  if (typeof ws.readyState === "number" && ws.readyState !== WS_OPEN) return false;
  try {
    ws.send(data);
    return true;
  } catch {
    return false;
  }
}

/**
 * The HTTP URL of a session on the gateway whose `/v1/realtime` is at `url` (mirrors Python's
 * `session_url`): `wss://host/prefix/v1/realtime?...` gives `https://host/prefix/v1/sessions/<id>`;
 * the query (it may hold a token) is left out, the resume token goes in a header.
 * @param {string} url
 * @param {string} sessionId
 */
export function sessionUrl(url, sessionId) {
  const parsed = new URL(String(url), globalThis.location?.href);
  if (parsed.protocol === "ws:") parsed.protocol = "http:";
  else if (parsed.protocol === "wss:") parsed.protocol = "https:";
  parsed.pathname = `${parsed.pathname.replace(/\/[^/]*$/u, "")}/sessions/${encodeURIComponent(sessionId)}`;
  parsed.search = "";
  parsed.hash = "";
  return parsed.href;
}

/**
 * End a session that has no socket (close() between reconnect attempts, or during one) with
 * `DELETE /v1/sessions/{id}`, the resume token as its credential: one request, where a socket
 * would need an upgrade and a resume on a network slow enough to have held the last one.
 * Abandoned after `within` ms (the gateway then ends the session after its session_ttl); any
 * failure is ignored. Nothing of it reaches the listeners.
 * @param {Dialer} dialer
 * @param {import("./protocol.js").SessionCreated} session
 * @param {number} within ms
 * @returns {Promise<boolean>} whether the gateway said the session is over (204, or 404: no
 *   such session for this token).
 */
export async function endSession(dialer, session, within) {
  if (typeof fetch !== "function") return false;
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), within);
  try {
    const response = await fetch(sessionUrl(dialer.url, session.session_id), {
      method: "DELETE",
      headers: { Authorization: `Bearer ${session.resume_token}` },
      signal: abort.signal,
    });
    return response.status === 204 || response.status === 404;
  } catch {
    return false; // not reachable, or abandoned
  } finally {
    clearTimeout(timer);
  }
}

/** Wait for `promise`, `ms` at most. */
export function waitAtMost(promise, ms) {
  if (!promise) return Promise.resolve();
  /** @type {any} */
  let timer;
  const timeout = new Promise((resolve) => (timer = setTimeout(resolve, ms)));
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

export function safeClose(ws, code, reason) {
  try {
    ws.close(code, reason);
  } catch {
    // already closed
  }
}
