// The connection banner: one transient line above the composer that says what the connection is
// doing while it is not simply fine, then goes away. It replaces the notes that used to pile up
// in the transcript (two permanent lines per drop, and a "restored" note landing after the reply
// it restored). One element for the whole page: an outage shows one banner, whose text changes
// (dropped → back) and which hides itself once the connection is back.
//
// States (data-state): "reconnecting" (with Retry now), "offline" (the browser has no network),
// "back" and "restored" (shown briefly, then hidden), "warn" (a message that goes after a
// while), "closed" (the session is over: stays, with New chat).

import { el } from "./cards.js";

/** How long the "back" kinds stay up (ms): long enough to read, short enough to be forgotten. */
const BRIEF_MS = 2500;
const WARN_MS = 8000;

export class ConnectionBanner {
  /**
   * @param {HTMLElement} node The banner's element (#banner), hidden when all is well.
   * @param {{retry: () => void, restart: () => void}} actions What its buttons do.
   */
  constructor(node, actions) {
    this.node = node;
    this._actions = actions;
    /** @type {ReturnType<typeof setTimeout> | null} */
    this._timer = null;
    /** how many outages this page has shown (tests and the curious: data-outages) */
    this.outages = 0;
  }

  /** The state shown now ("" when hidden). */
  get state() {
    return this.node.hidden ? "" : this.node.dataset.state ?? "";
  }

  /** The socket dropped: say so until it is back, with a button to try at once. */
  reconnecting() {
    if (this.state === "closed") return;
    this._countOutage();
    this._show("reconnecting", "Connection lost. Reconnecting… nothing you send is lost.", "retry");
  }

  /** The browser reports no network: messages wait for it. */
  offline() {
    if (this.state === "closed") return;
    this._countOutage();
    this._show("offline", "You're offline. Messages you send will go out when the network is back.", null);
  }

  /** The session is back on a new socket (`missed` events were replayed), or was all along. */
  back(missed = 0) {
    if (!["reconnecting", "offline"].includes(this.state)) return;
    const replayed = missed > 0 ? ` ${missed} missed event${missed === 1 ? "" : "s"} replayed.` : "";
    this._show("back", `Back online: the conversation resumed, nothing lost.${replayed}`, null, BRIEF_MS);
  }

  /** The page was reloaded and its conversation resumed where it was. */
  restored() {
    if (this.state === "closed") return;
    this._show("restored", "Conversation restored after the reload.", null, BRIEF_MS);
  }

  /** Something worth a moment's notice that is not an outage (a snapshot redraw, say). */
  warn(text) {
    if (this.state === "closed") return;
    this._show("warn", text, null, WARN_MS);
  }

  /** The session cannot go on: stays until the user starts a new chat. */
  closed(text) {
    this._show("closed", text, "restart");
  }

  /** Hide it (a new chat starts, say). */
  clear() {
    this._cancelTimer();
    this.node.hidden = true;
    this.node.dataset.state = "";
  }

  _countOutage() {
    if (["reconnecting", "offline"].includes(this.state)) return; // the same outage, still on
    this.outages += 1;
    this.node.dataset.outages = String(this.outages);
  }

  _show(state, text, action, hideAfter = 0) {
    this._cancelTimer();
    const button = action === "retry"
      ? el("button", { class: "btn btn-small banner-action", type: "button", "data-banner-action": "retry" }, "Retry now")
      : action === "restart"
        ? el("button", { class: "btn btn-primary btn-small banner-action", type: "button", "data-banner-action": "restart" }, "New chat")
        : null;
    button?.addEventListener("click", () => (action === "retry" ? this._actions.retry() : this._actions.restart()));
    this.node.replaceChildren(el("span", { class: "banner-dot", "aria-hidden": "true" }), el("span", { class: "banner-text" }, text), button);
    this.node.dataset.state = state;
    this.node.hidden = false;
    if (hideAfter) this._timer = setTimeout(() => this.clear(), hideAfter);
  }

  _cancelTimer() {
    if (this._timer !== null) clearTimeout(this._timer);
    this._timer = null;
  }
}
