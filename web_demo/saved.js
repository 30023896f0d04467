// What survives a reload of the demo page, in sessionStorage (this tab only, gone when the
// tab closes): the session to resume (its session.created, with the resume token), the
// cursor (the highest seq the page has drawn), and the conversation as drawn up to it. On a
// reload the page draws it again and resumes the same session from that cursor, so the
// gateway replays only what the page had not drawn yet.

const KEY = "gateway-demo-session";
const TOKEN_KEY = "gateway-demo-token";
const VERSION = 1;

/**
 * @typedef {object} Saved
 * @property {object} session The session.created event (session_id, resume_token, tools...).
 * @property {number} last_seq The highest seq drawn in `html`.
 * @property {string} html The conversation (#messages) as drawn.
 * @property {object[]} responses Per response: { id, sep } (sep: the next text starts a new step).
 * @property {object[]} calls Per tool call: { id, tool, display, kind, isAsync, responseId }.
 */

/** The saved conversation, or null (none, another version, or storage unavailable). */
export function loadSaved() {
  try {
    const saved = JSON.parse(sessionStorage.getItem(KEY) ?? "null");
    if (!saved || saved.v !== VERSION || typeof saved.session?.session_id !== "string") return null;
    return /** @type {Saved} */ (saved);
  } catch {
    return null;
  }
}

/** Keep `saved` for the next load of this tab; quietly nothing when storage is unavailable. */
export function save(saved) {
  try {
    sessionStorage.setItem(KEY, JSON.stringify({ v: VERSION, ...saved }));
  } catch {
    // private mode or full: a reload starts a new session
  }
}

/** Forget the session (it ended, or the gateway refused to resume it). */
export function forget() {
  try { sessionStorage.removeItem(KEY); } catch { /* nothing kept */ }
}

/** The client token the page was opened with (?token=), kept so that a reload can resume. */
export function keepToken(token) {
  try {
    if (token === null) return sessionStorage.getItem(TOKEN_KEY);
    sessionStorage.setItem(TOKEN_KEY, token);
  } catch { /* storage unavailable */ }
  return token;
}
