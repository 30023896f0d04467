/**
 * @file Who gets a conversation's events (mirrors the Python SDK's `client_sdk/events.py`):
 * the listeners of `on(type)`, and one queue per `say()` or `events()` reader. Which events
 * come, once each and in order, is the client's (`client.js`).
 * @module events
 */

/** Put on a queue when the conversation can go no further. */
class End {
  /** @param {import("./errors.js").ClientError} error */
  constructor(error) {
    this.error = error;
  }
}

/** An unbounded queue with one reader; after `end(error)`, `next()` rejects with `error`. */
export class Inbox {
  constructor() {
    /** @type {any[]} */
    this._items = [];
    /** @type {{resolve: (item: any) => void, reject: (error: any) => void} | null} */
    this._reader = null;
  }

  push(item) {
    const reader = this._reader;
    if (reader) {
      this._reader = null;
      if (item instanceof End) reader.reject(item.error);
      else reader.resolve(item);
    } else {
      this._items.push(item);
    }
  }

  /** Nothing more comes: the items already queued are read first, then `error`. */
  end(error) {
    this.push(new End(error));
  }

  /** @returns {Promise<any>} the next item; rejects with the conversation's end. */
  next() {
    if (this._items.length > 0) {
      const item = this._items.shift();
      return item instanceof End ? Promise.reject(item.error) : Promise.resolve(item);
    }
    return new Promise((resolve, reject) => (this._reader = { resolve, reject }));
  }
}

/** The listeners by type, and the queues of `say()` and `events()`. */
export class EventHub {
  constructor() {
    /** @type {Map<string, Set<(event: any) => void>>} */
    this._listeners = new Map();
    /** @type {Set<Inbox>} the queues of say() and events() */
    this._subscribers = new Set();
  }

  /**
   * Call `listener` with every payload of `type` from now on.
   * @param {string} type
   * @param {(event: any) => void} listener
   * @returns {() => void} Call it to stop listening.
   */
  on(type, listener) {
    if (typeof listener !== "function") throw new TypeError("the listener must be a function");
    let listeners = this._listeners.get(type);
    if (!listeners) this._listeners.set(type, (listeners = new Set()));
    const entry = (/** @type {any} */ event) => listener(event);
    listeners.add(entry);
    return () => {
      listeners.delete(entry);
    };
  }

  /** Hand `payload` to the listeners of `type`; what they throw (or reject) is reported, never thrown. */
  emit(type, payload) {
    const listeners = this._listeners.get(type);
    if (!listeners) return;
    for (const listener of [...listeners]) {
      try {
        const returned = listener(payload);
        if (returned && typeof returned.then === "function") returned.then(undefined, reportError);
      } catch (err) {
        reportError(err);
      }
    }
  }

  /** Hand an event to its listeners, the "*" listeners and the say()/events() queues. */
  deliver(event) {
    this.emit(event.type, event);
    this.emit("*", event);
    for (const inbox of this._subscribers) inbox.push(event);
  }

  /** A new queue that gets every event delivered from now on, until `unsubscribe`. */
  subscribe() {
    const inbox = new Inbox();
    this._subscribers.add(inbox);
    return inbox;
  }

  /** @param {Inbox} inbox */
  unsubscribe(inbox) {
    this._subscribers.delete(inbox);
  }

  /** The conversation can go no further: every queue ends with `error`. */
  end(error) {
    for (const inbox of this._subscribers) inbox.end(error);
  }
}

/** A listener threw: report it the way the platform does, never into the SDK. */
function reportError(err) {
  if (typeof globalThis.reportError === "function") globalThis.reportError(err);
  else console.error("gateway-client: a listener threw", err);
}
