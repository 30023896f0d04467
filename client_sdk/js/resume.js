/**
 * @file Resuming a conversation after its socket dropped (mirrors `Reconnector` in the Python
 * SDK's `client_sdk/resume.py`): the socket the session is on, and getting it another one.
 * `loop()` opens sockets with backoff and full jitter until the gateway answers a
 * `session.resume` (or says the session is gone), or, for a session not started yet (the first
 * connect, a drop before `session.created`), until a socket opens and `session.start` is
 * answered; it gives up after `giveUpAfter` of failed attempts in a row. `close()` ends the
 * session, also without a socket (mid-reconnect: an HTTP DELETE, connection.js's `endSession`).
 * A socket that resumes a session is dialed with its id in the URL (`resumeUrl`, for load balancers that
 * route by session). What goes again on the new socket is the outbox's (outbox.js); what the
 * events mean is the client's (client.js).
 *
 * A session with several devices: each resume names this device (`device_id`, from
 * `session.created`, `session.attached` or `session.resumed`) and its client functions, so
 * only this device's socket is replaced. `session.going_away` (the gateway will close the
 * socket soon) starts an early resume on a second socket (`goingAway()`) while the first
 * still serves: once the gateway answers, the second is the session's and the first is
 * closed with 4000 (never 1000, which would end the session) and ignored from then on. The
 * early resume tries again with the loop's backoff for up to the notice's `time_left` (at
 * least once): a node going away refuses new sockets (it accepts, then closes with 1012),
 * and a round-robin load balancer may send one there. While it runs, user messages wait in
 * the outbox for the new socket (`moving`). An early resume that fails, however (even with
 * a "final" close code), changes nothing: the first socket serves on (the outbox goes again
 * on it), and when it closes the reconnect loop runs as after any drop.
 * @module resume
 */

import { endSession, safeClose, sendFrame, waitAtMost } from "./connection.js";
import { SessionClosed, describe } from "./errors.js";
import { parseEvent, resumeOf } from "./protocol.js";

/** @typedef {import("./protocol.js").SessionCreated} SessionCreated */
/** @typedef {import("./connection.js").ConnectionState} ConnectionState */
/** @typedef {import("./connection.js").Dialer} Dialer */

/**
 * The conversation a `Reconnector` serves: what it reads of it, and what it tells it.
 * @typedef {object} Host
 * @property {() => import("./errors.js").ClientError | null} ended Why it can go no further
 *   (close() included), or null.
 * @property {() => SessionCreated | null} session Its `session.created`, once it has one.
 * @property {() => number} lastSeq The cursor a resume asks the replay from.
 * @property {() => string | null} joining The id of the session this device joins (the `join`
 *   option), named in the URL of its first socket; null for one that starts its own.
 * @property {() => import("./protocol.js").Device | null} device What a resume says of this
 *   device (its id and functions), or null: the resume takes the whole session over.
 * @property {() => boolean} startWanted start() was asked and the session is neither created
 *   nor refused.
 * @property {() => boolean} startRefused The gateway refused session.start (no session).
 * @property {() => object[]} startMessages session.start, then what must follow it on the
 *   socket of a session started anew (the session.update messages not answered yet).
 * @property {() => void} opened A socket opened (connect() resolves).
 * @property {(data: any) => void} onFrame A frame of the attached socket.
 * @property {(first: any, gap: any) => void} afterResume The first answer to session.resume
 *   (after a `resume_gap` error `gap`, the snapshot) on the socket now attached.
 * @property {() => void} resendOutbox Send again, on the attached socket, all the outbox
 *   holds (after an early resume that failed: the user messages it held back).
 * @property {(error: SessionClosed) => void} finish The conversation can go no further.
 * @property {(type: "connection", payload: object) => void} emit Tell the "connection" listeners.
 */

/** What `_resumeToken` returns when the conversation ended while the token came. */
const STOP = Symbol("stop");
/** Closes after which resuming makes no sense: the session is gone or not ours. */
const FINAL_CLOSE_CODES = new Set([1000, 1008, 4001, 4003, 4004, 4008, 4009]);
const FIRST_RECONNECT_DELAY_MS = 50;
/** Default of `attemptTimeout`: ms from an attempt's dial to the gateway's answer. */
export const ATTEMPT_TIMEOUT_MS = 10_000;
/** Default of `giveUpAfter`: the gateway's default `session_ttl`, after which no resume succeeds. */
export const GIVE_UP_AFTER_MS = 120_000;
/** The longest close() waits for a socket's close. */
const CLOSE_WAIT_MS = 1_000;
/** The longest close() waits to end a session that has no socket (`endSession`): it returns
 * within a second whatever the network does. */
const END_WAIT_MS = 800;

/**
 * An early resume (`goingAway()`).
 * @typedef {{ws: any, stop: () => void, oldClosed: {code: number, reason: string} | null}} Early
 */

/** The session's socket, and getting it a new one. */
export class Reconnector {
  /**
   * @param {Dialer} dialer
   * @param {Host} host
   * @param {object} options As `GatewayClientOptions` has them (ms), checked by the client.
   * @param {string | (() => string | Promise<string>) | undefined} options.token
   * @param {boolean} options.reconnect
   * @param {number} options.maxDelay
   * @param {number} options.attemptTimeout
   * @param {number} options.giveUpAfter
   */
  constructor(dialer, host, { token, reconnect, maxDelay, attemptTimeout, giveUpAfter }) {
    this._dialer = dialer;
    this._host = host;
    this._token = token;
    this._reconnect = reconnect;
    this._maxDelay = maxDelay;
    this._attemptTimeout = attemptTimeout;
    this._giveUpAfter = giveUpAfter;

    /** @type {ConnectionState} */
    this.state = "idle";
    /** @type {any} the socket attached to the session */
    this.ws = null;
    /** How many resumes succeeded so far (resume() attaching is none). */
    this.reconnects = 0;
    /** @type {{ws: any, stop: () => void} | null} the attempt in flight: its socket, and how to drop it */
    this._pending = null;
    /**
     * The early resume under way after a `session.going_away` (at most one), from the notice
     * to the switch or the last failed attempt: its attempt's socket (null between two), how
     * to drop that attempt or cut the wait before the next, and the close of the socket it is
     * to replace if that came first.
     * @type {Early | null}
     */
    this._early = null;
    /** true once a socket opened (connect() resolved): a later loop is "reconnecting" */
    this._everOpened = false;
    /** @type {number | null} when the attempts now failing in a row began to fail */
    this._failingSince = null;
    /** @type {{settle: (outcome: any) => void} | null} a session.start waiting for its answer */
    this._startWatch = null;
    /** when start() was asked: its session.start's answer is due attemptTimeout after this or the dial */
    this._startAskedAt = 0;
    /** true while resume() attaches to a saved session (not a reconnect) */
    this._attaching = false;
    /**
     * @type {(() => void) | null} ends the wait between two attempts now under way (set while
     * `loop()` waits): the loop then tries again (`retryNow()`), or stops (`stop()`: the
     * conversation ended).
     */
    this._wake = null;
  }

  /** @param {ConnectionState} state @param {object} [extra] */
  setState(state, extra) {
    if (this.state === state) return;
    this.state = state;
    this._host.emit("connection", { state, reconnects: this.reconnects, ...extra });
  }

  /**
   * Whether an early resume (after `session.going_away`) is under way: a user message then
   * waits in the outbox for the new socket. Sent on the old one, its response would start on
   * the node going away, to be cut by the move and run again on the next (a visible gap).
   */
  get moving() {
    return this._early !== null;
  }

  /** Send on the attached socket if it is open; a message lost to a drop is recovered on resume. */
  send(msg) {
    const ws = this.ws;
    if (!ws || this._host.ended() || this.state !== "open") return false;
    return sendFrame(ws, msg);
  }

  /**
   * start() was asked: send session.start now on the attached socket, or else on the next one
   * the loop opens (its answer is due `attemptTimeout` from now or that socket's dial).
   */
  requestStart() {
    this._startAskedAt = now();
    if (this.ws !== null) this._startOnAttached();
  }

  /** The gateway answered session.start (session.created, or an error refusing it). */
  started() {
    this._startWatch?.settle("ok");
  }

  /**
   * resume(): attach to a saved session with one attempt (not counted in `reconnects`).
   * @returns {Promise<"resumed" | "stop" | SessionClosed>}
   */
  async attach() {
    this.setState("connecting");
    this._attaching = true;
    const outcome = await this._resumeOnce();
    this._attaching = false;
    return outcome;
  }

  /**
   * Cut the wait between two attempts short: the loop's next attempt starts at once, and the
   * wait after it, should it fail too, is as long as it would have been (the backoff grows).
   * The give-up count goes on from the first failure.
   * @returns {boolean} true when a wait was cut short; false when none was under way
   *   (connected, closed, an attempt in flight, nothing started yet).
   */
  retryNow() {
    const wake = this._wake;
    if (wake === null || this._host.ended()) return false;
    wake(); // the loop goes on with its next attempt: no second loop
    return true;
  }

  /** The conversation ended: stop waiting, drop the attempt in flight. */
  stop() {
    this._wake?.();
    this._pending?.stop();
    this._early?.stop();
    this._startWatch?.settle("stop");
  }

  /** The attached socket and the attempt in flight, for `close()` (read before `stop()`). */
  sockets() {
    return { ws: this.ws, attempt: this._pending?.ws ?? this._early?.ws };
  }

  /**
   * close(): the attached socket closes with 1000, which ends the session on the gateway; with
   * none, `DELETE /v1/sessions/{id}` ends it (`endSession`; no `session`: nothing to end, or
   * a device that joined, which never ends it for the others).
   * Settled once the attached socket reports its close (`CLOSE_WAIT_MS` at most), or, with
   * none, once the request is answered and the dropped attempt's socket closed (`END_WAIT_MS`
   * at most).
   * @param {{ws: any, attempt: any}} sockets What `sockets()` said before the conversation ended.
   * @param {SessionCreated | null} session
   */
  async close({ ws, attempt }, session) {
    if (ws) safeClose(ws, 1000, "");
    const waits = [];
    if (ws) waits.push(waitAtMost(this._dialer.closed(ws), CLOSE_WAIT_MS));
    // A dropped attempt's close is awaited no longer than the DELETE: close() within a second.
    if (attempt) waits.push(waitAtMost(this._dialer.closed(attempt), END_WAIT_MS));
    if (!ws && session) waits.push(endSession(this._dialer, session, END_WAIT_MS));
    await Promise.all(waits);
  }

  /**
   * The attached socket closed. A session.start waiting for its answer on it failed (its
   * owner tries again); otherwise the loop resumes the session, or opens a new socket for
   * one not started yet.
   */
  _onDrop(ws, code, reason) {
    if (ws !== this.ws) return;
    this.ws = null;
    const early = this._early;
    if (early !== null && !this._host.ended()) {
      // The socket a going_away announced closed (maybe 4009: the early resume replaced it,
      // its answer still on the way): the early resume decides what follows.
      early.oldClosed = { code, reason };
      return;
    }
    this._dropped(code, reason);
  }

  /** What follows the attached socket's close (`_onDrop`). */
  _dropped(code, reason) {
    const watch = this._startWatch;
    this._startWatch = null;
    if (this._host.ended()) {
      watch?.settle("stop");
      return;
    }
    if (FINAL_CLOSE_CODES.has(code) || !this._reconnect || this._host.startRefused()) {
      this._host.finish(new SessionClosed(code, reason));
      watch?.settle("stop");
      return;
    }
    if (watch) {
      watch.settle(new SessionClosed(code, reason));
      return;
    }
    this.loop();
  }

  /**
   * Attempt with backoff and full jitter until a socket is attached, close(), a final code,
   * or `giveUpAfter`: a resume once the session exists, else a new socket (which sends
   * session.start when start() was asked). The first connect, a drop before
   * session.created and a drop after it all go through here.
   */
  async loop() {
    let ceiling = Math.min(FIRST_RECONNECT_DELAY_MS, this._maxDelay);
    while (!this._host.ended()) {
      this.setState(this._everOpened ? "reconnecting" : "connecting");
      const outcome = this._host.session() ? await this._resumeOnce() : await this._openOnce();
      if (!(outcome instanceof SessionClosed) || this._host.ended()) return;
      if (!this._reconnect) {
        this._host.finish(outcome); // only the first connect gets here: a drop without reconnect ends in _onDrop
        return;
      }
      if (this._failed()) return;
      await this._sleep(Math.random() * ceiling); // jitter: no thundering herd
      ceiling = Math.min(ceiling * 2, this._maxDelay);
    }
  }

  /**
   * Count a failed attempt; past `giveUpAfter` of failures in a row, end the conversation.
   * @returns {boolean} whether it gave up.
   */
  _failed() {
    const at = now();
    if (this._failingSince === null) this._failingSince = at;
    if (at - this._failingSince < this._giveUpAfter) return false;
    this._host.finish(new SessionClosed(1006, `could not reach the gateway for ${this._giveUpAfter / 1000} s`));
    return true;
  }

  /** A socket's upgrade was answered: the gateway is reachable, failures count anew. */
  _reached() {
    this._failingSince = null;
    this._everOpened = true;
  }

  /** Whether a session.start is due on the next socket (asked for, not answered yet). */
  _startWanted() {
    return !this._attaching && this._host.startWanted();
  }

  /**
   * One attempt for a session not created yet: get the token, open a socket and attach it;
   * if start() was asked, send session.start on it and wait for the answer.
   * @returns {Promise<"ok" | "stop" | SessionClosed>} a SessionClosed: the attempt failed.
   */
  async _openOnce() {
    let token = this._token;
    if (typeof token === "function") {
      try {
        token = await token();
      } catch (err) {
        const error = new SessionClosed(1006, `could not get a client token: ${describe(err)}`);
        if (this._everOpened) return error; // the app's backend is not reachable (yet)
        this._host.finish(error);
        return "stop";
      }
      if (this._host.ended()) return "stop";
    }
    const dialedAt = now();
    return new Promise((resolve) => {
      /** @type {any} */
      let timer = null;
      /** @type {any} */
      let ws = null;
      const settle = (/** @type {any} */ outcome) => {
        clearTimeout(timer);
        if (this._pending?.ws === ws) this._pending = null;
        resolve(outcome);
      };
      ws = this._dialer.dial(
        {
          open: (/** @type {any} */ sock) => {
            clearTimeout(timer);
            if (this._pending?.ws === sock) this._pending = null;
            this._reached(); // (close() drops an attempt in flight: it never opens after that)
            this.ws = sock;
            this.setState("open");
            this._host.opened();
            if (this.ws !== sock || this._host.ended()) {
              resolve("stop"); // a "connection" listener closed, or the socket went
            } else if (this._startWanted()) {
              // At once: a drop from now on settles the watch of the start this attempt awaits.
              resolve(this._sendStart(Math.max(dialedAt, this._startAskedAt)));
            } else {
              resolve("ok");
            }
          },
          frame: (sock, data) => {
            if (sock === this.ws) this._host.onFrame(data);
          },
          close: (/** @type {any} */ sock, /** @type {number} */ code, /** @type {string} */ reason, /** @type {boolean} */ opened) => {
            if (opened) this._onDrop(sock, code, reason);
            else settle(new SessionClosed(code, reason || "could not connect to the gateway"));
          },
        },
        token,
        this._host.joining() ?? undefined, // a device joining names its session, as a resume does
      );
      this._pending = {
        ws,
        stop: () => {
          this._dialer.drop(ws, 1000, ""); // no session on it: a normal close ends nothing
          settle("stop");
        },
      };
      timer = setTimeout(() => {
        this._dialer.drop(ws, 4000, "no answer to the upgrade");
        settle(new SessionClosed(1006, "no answer to the upgrade"));
      }, this._attemptTimeout);
    });
  }

  /**
   * Send session.start on the attached socket, then the session.update messages not answered
   * yet (a session started anew must get them too).
   * @param {number} from When the answer's `attemptTimeout` began (the dial, or start()).
   * @returns {Promise<"ok" | "stop" | SessionClosed>} "ok" once answered (session.created,
   *   or an error refusing it); a SessionClosed when the socket dropped first or no answer
   *   came in time (then the socket is closed with 4000): the attempt failed.
   */
  _sendStart(from) {
    const ws = this.ws;
    if (ws === null || this._host.ended()) return Promise.resolve("stop");
    return new Promise((resolve) => {
      /** @type {any} */
      let timer = null;
      const watch = {
        settle: (/** @type {any} */ outcome) => {
          clearTimeout(timer);
          if (this._startWatch === watch) this._startWatch = null;
          resolve(outcome);
        },
      };
      this._startWatch = watch;
      timer = setTimeout(() => {
        this._dialer.drop(ws, 4000, "no answer to session.start"); // not 1000: that ends a session
        this._onDrop(ws, 1006, "no answer to session.start");
      }, Math.max(0, from + this._attemptTimeout - now()));
      for (const msg of this._host.startMessages()) this.send(msg);
    });
  }

  /** The first session.start, on the socket connect() opened; if it fails, the loop goes on. */
  async _startOnAttached() {
    const outcome = await this._sendStart(this._startAskedAt);
    if (!(outcome instanceof SessionClosed) || this._host.ended()) return;
    if (!this._failed()) this.loop();
  }

  /**
   * One resume attempt: get the token, open a socket, send session.resume, wait for the answer.
   * @returns {Promise<"resumed" | "stop" | SessionClosed>} a SessionClosed: the attempt failed.
   */
  async _resumeOnce() {
    const token = await this._resumeToken();
    if (token instanceof SessionClosed || token === STOP) return token === STOP ? "stop" : token;
    return this._resumeWith(token, null);
  }

  /**
   * The client token for a resume's socket (a token function is asked for a fresh one).
   * @returns {Promise<string | undefined | SessionClosed | typeof STOP>} a SessionClosed: the
   *   app's backend is not reachable (yet), like the gateway; STOP: the conversation ended.
   */
  async _resumeToken() {
    const token = this._token;
    if (typeof token !== "function") return token;
    try {
      const fresh = await token();
      return this._host.ended() ? STOP : fresh;
    } catch (err) {
      return new SessionClosed(1006, `could not get a client token: ${describe(err)}`);
    }
  }

  /**
   * `session.going_away`: the gateway closes the attached socket in `timeLeft` seconds.
   * Resume on a second socket now (at most one such early resume at a time), trying again
   * with the loop's backoff and jitter for up to `timeLeft` (at least one attempt);
   * `_resumeWith` switches to it once answered. When every attempt fails the attached socket
   * serves on and the outbox goes again on it (the user messages held meanwhile; the gateway
   * applies each message once). Should that socket close meanwhile, the attempt in flight may
   * still switch; otherwise its close is handled as any drop (the reconnect loop tries on).
   * @param {number} timeLeft Seconds, as the notice says (not a number: 0).
   */
  async goingAway(timeLeft) {
    if (this._early !== null || this.ws === null || this._host.session() === null || this._host.ended()) return;
    /** @type {Early} */
    const early = { ws: null, stop: () => {}, oldClosed: null };
    this._early = early; // taken while the token comes: no second early resume
    const seconds = Number(timeLeft);
    const deadline = now() + (Number.isFinite(seconds) && seconds > 0 ? seconds * 1000 : 0);
    let ceiling = Math.min(FIRST_RECONNECT_DELAY_MS, this._maxDelay);
    let resumed = false;
    for (;;) {
      const token = await this._resumeToken();
      if (token === STOP) break;
      resumed = !(token instanceof SessionClosed) && (await this._resumeWith(token, early)) === "resumed";
      // The old socket closed: the reconnect loop tries on from here (and says so).
      if (resumed || this._host.ended() || early.oldClosed !== null) break;
      const pause = Math.random() * ceiling; // jitter, as the loop's
      if (now() + pause >= deadline) break;
      await this._pause(early, pause);
      if (this._host.ended() || early.oldClosed !== null) break;
      ceiling = Math.min(ceiling * 2, this._maxDelay);
    }
    if (this._early === early) this._early = null;
    if (resumed || this._host.ended()) return;
    const closed = early.oldClosed;
    if (closed !== null) this._dropped(closed.code, closed.reason);
    else if (this.ws !== null) this._host.resendOutbox();
  }

  /**
   * Wait `ms` between two attempts of the early resume `early`, or less when the
   * conversation ends (`stop()` calls `early.stop`). Not `_sleep`: `retryNow()` is for the
   * loop's waits, and the conversation still has its socket.
   * @param {Early} early @param {number} ms
   */
  _pause(early, ms) {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        early.stop = () => {};
        resolve(undefined);
      };
      const timer = setTimeout(done, ms);
      early.stop = done;
    });
  }

  /**
   * One socket that resumes the session, attached once the gateway answers. `early`: one
   * attempt of a going_away's resume (`goingAway()`), while the attached socket still serves:
   * once answered it replaces that socket (closed with 4000, its events ignored from then
   * on), and its failure is never final (any close code, a timeout: the attached socket
   * serves on).
   * @param {string | undefined} token
   * @param {Early | null} early
   * @returns {Promise<"resumed" | "stop" | SessionClosed>}
   */
  _resumeWith(token, early) {
    const session = /** @type {SessionCreated} */ (this._host.session());
    return new Promise((resolve) => {
      /** @type {"dialing" | "waiting" | "gap" | "live"} */
      let phase = "dialing";
      /** @type {any} */
      let gap = null;
      /** @type {any} */
      let timer = null;
      /** @type {any} */
      let ws = null;
      const settle = (/** @type {any} */ outcome) => {
        clearTimeout(timer);
        if (early) {
          if (early.ws === ws) Object.assign(early, { ws: null, stop: () => {} }); // goingAway() goes on
        } else if (this._pending?.ws === ws) {
          this._pending = null;
        }
        resolve(outcome);
      };
      ws = this._dialer.dial(
        {
          open: (/** @type {any} */ sock) => {
            this._reached();
            phase = "waiting";
            try {
              sock.send(JSON.stringify(resumeOf(session, this._host.lastSeq(), this._host.device())));
            } catch {
              // the close event follows
            }
          },
          frame: (/** @type {any} */ sock, /** @type {any} */ data) => {
            if (phase === "live") {
              if (sock === this.ws) this._host.onFrame(data);
              return;
            }
            if (this._host.ended() || (phase !== "waiting" && phase !== "gap")) return;
            const event = parseEvent(data);
            if (!event) return;
            if (phase === "waiting" && event.type === "error" && event.code === "resume_gap") {
              gap = event; // session.snapshot follows
              phase = "gap";
              return;
            }
            phase = "live";
            const replaced = this.ws; // early: the socket going away (null once it closed)
            this.ws = sock;
            if (!this._attaching) this.reconnects += 1;
            settle("resumed");
            // The move is over: user messages go on this socket from now on (the outbox's
            // re-send in afterResume carries those held meanwhile).
            if (early && this._early === early) this._early = null;
            // Not 1000: that would end the session. From now on its events are ignored
            // (the gateway's own close of it, 4009, included).
            if (early && replaced !== null) this._dialer.drop(replaced, 4000, "moved");
            this.setState("open");
            this._host.afterResume(event, gap);
          },
          close: (/** @type {any} */ sock, /** @type {number} */ code, /** @type {string} */ reason) => {
            if (phase === "live") {
              this._onDrop(sock, code, reason);
            } else if (this._host.ended()) {
              settle("stop");
            } else if (FINAL_CLOSE_CODES.has(code) && !early) {
              this._host.finish(new SessionClosed(code, reason));
              settle("stop");
            } else {
              settle(new SessionClosed(code, reason || "could not reach the gateway")); // wait and try again
            }
          },
        },
        token,
        session.session_id,
      );
      const attempt = {
        ws,
        stop: () => {
          this._dialer.drop(ws, 4000, "the client is closing"); // not 1000: never the session's socket
          settle("stop");
        },
      };
      if (early) Object.assign(early, attempt);
      else this._pending = attempt;
      timer = setTimeout(() => {
        const why = phase === "dialing" ? "no answer to the upgrade" : "no answer to session.resume";
        this._dialer.drop(ws, 4000, why); // not 1000: that ends the session
        settle(new SessionClosed(1006, why));
      }, this._attemptTimeout);
    });
  }

  /** Wait `ms`, or less when `retryNow()` cuts it short or the conversation ends. */
  _sleep(ms) {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        if (this._wake === done) this._wake = null;
        resolve(undefined);
      };
      const timer = setTimeout(done, ms);
      this._wake = done;
    });
  }
}

/** A monotonic clock, ms. */
function now() {
  return globalThis.performance?.now ? globalThis.performance.now() : Date.now();
}
