// DOM helpers of the web demo, and the cards it shows tool arguments and results as: a small
// key/value list people read at a glance, with the raw JSON one click away. Also the card that
// asks the user to approve a call of a tool marked `confirm` (Approve / Decline).

/** The first element matching `selector` under `root`. */
export const $ = (selector, root = document) => root.querySelector(selector);

/** Create an element: el("li", { class: "msg", "data-x": 1 }, "text", child). */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children) if (child !== null && child !== undefined) node.append(child);
  return node;
}

/** One-line JSON, shortened to `max` characters. */
export function compact(value, max = 90) {
  let text;
  try { text = JSON.stringify(value) ?? String(value); } catch { text = String(value); }
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

/** Indented JSON (or the value as text when JSON cannot hold it). */
export const pretty = (value) => { try { return JSON.stringify(value, null, 2); } catch { return String(value); } };

const MAX_ROWS = 12;

/** A scalar as people read it: strings as they are, booleans as yes/no, null as a dash. */
function scalar(value) {
  if (value === null || value === undefined) return "–";
  if (typeof value === "boolean") return value ? "yes" : "no";
  return String(value);
}

/**
 * A value as a key/value card: an object's fields (or an array's items) as rows, one level of
 * nesting as a card in the row, anything deeper as one line of JSON. Scalars are plain text.
 */
export function kvCard(value, depth = 0) {
  if (value === null || typeof value !== "object") return el("span", { class: "kv-scalar" }, scalar(value));
  const entries = Array.isArray(value) ? value.map((item, i) => [String(i + 1), item]) : Object.entries(value);
  if (entries.length === 0) return el("span", { class: "kv-scalar muted" }, Array.isArray(value) ? "(none)" : "(empty)");
  const card = el("dl", { class: "kv" });
  for (const [key, item] of entries.slice(0, MAX_ROWS)) {
    const nested = item !== null && typeof item === "object";
    card.append(el("dt", {}, key), el("dd", {}, nested ? (depth < 1 ? kvCard(item, depth + 1) : compact(item, 120)) : scalar(item)));
  }
  if (entries.length > MAX_ROWS) card.append(el("dt", {}, "…"), el("dd", { class: "muted" }, `${entries.length - MAX_ROWS} more in the JSON`));
  return card;
}

/** The raw JSON of `value`, folded: a summary line to click, the JSON under it. */
export function jsonDetails(value, label = "JSON") {
  return el("details", { class: "json" }, el("summary", {}, label), el("pre", {}, pretty(value)));
}

// ---- The confirmation card: a call of a tool marked `confirm`, waiting for the user (tool.confirm)

const OUTCOMES = {
  approved: ["✓", "Approved"],
  declined: ["✗", "Declined"],
  expired: ["◷", "Expired: no answer in time"],
  cancelled: ["⊘", "Cancelled: the reply was stopped"],
  failed: ["✗", "Failed"],
};

/**
 * The card that asks the user about `item` (a ConfirmItem): the prompt, the arguments as a
 * key/value card, Approve and Decline. Its buttons stay disabled until `askOnCard`.
 */
export function confirmCard(item) {
  const kind = item.kind === "server" ? "server" : "client";
  const args = item.args ?? {};
  return el("div", {
    class: `confirm ${kind}`, role: "group", "aria-label": `Needs your approval: ${item.prompt}`,
    "data-call-id": item.call_id, "data-tool": item.tool, "data-kind": kind, "data-status": "asking",
  },
  el("div", { class: "confirm-head" },
    el("span", { class: "confirm-icon", "aria-hidden": "true" }, "?"),
    el("span", { class: "confirm-name" }, item.display_name || item.tool),
    el("span", { class: "confirm-where" }, `needs your approval · runs ${kind === "server" ? "on the gateway" : "in this page"}`)),
  el("p", { class: "confirm-prompt" }, item.prompt),
  Object.keys(args).length ? el("div", { class: "confirm-args" }, kvCard(args)) : null,
  el("div", { class: "confirm-actions" },
    el("button", { class: "btn btn-primary btn-small confirm-approve", type: "button", disabled: true }, "Approve"),
    el("button", { class: "btn btn-small confirm-decline", type: "button", disabled: true }, "Decline"),
    el("span", { class: "confirm-outcome", role: "status" })));
}

/**
 * Enable the card's buttons; resolves with `true` (Approve) or `false` (Decline) at the click.
 * When `signal` aborts first (the deadline, or the session closing) the buttons go off and the
 * promise rejects with its reason; the tool.status that follows says what became of the call.
 * @returns {Promise<boolean>}
 */
export function askOnCard(card, signal) {
  const approve = $(".confirm-approve", card);
  const decline = $(".confirm-decline", card);
  const outcome = $(".confirm-outcome", card);
  return new Promise((resolve, reject) => {
    const asking = new AbortController();
    const stop = () => {
      asking.abort();
      approve.disabled = true;
      decline.disabled = true;
    };
    const answer = (approved) => {
      stop();
      card.dataset.status = "answered";
      card.dataset.answer = approved ? "approve" : "decline";
      outcome.textContent = approved ? "Approving…" : "Declining…";
      resolve(approved);
    };
    if (signal.aborted) {
      stop();
      reject(signal.reason);
      return;
    }
    approve.addEventListener("click", () => answer(true), { signal: asking.signal });
    decline.addEventListener("click", () => answer(false), { signal: asking.signal });
    signal.addEventListener("abort", () => { stop(); reject(signal.reason); }, { signal: asking.signal });
    card.dataset.status = "asking";
    delete card.dataset.answer;
    outcome.textContent = "";
    approve.disabled = false;
    decline.disabled = false;
  });
}

/** What the first tool.status after the question says of the call. */
export function confirmOutcome(event) {
  if (event.status === "failed") return event.code === "declined" ? "declined" : "failed";
  if (event.status === "expired" || event.status === "cancelled") return event.status;
  return "approved"; // running, pending, progress, completed: it went ahead
}

/** Show the call's fate on the card; the buttons go. `detail` is the gateway's reason, if any. */
export function settleCard(card, outcome, detail = null) {
  const [icon, label] = OUTCOMES[outcome] ?? OUTCOMES.failed;
  card.dataset.status = outcome in OUTCOMES ? outcome : "failed";
  for (const button of card.querySelectorAll(".confirm-actions .btn")) {
    button.disabled = true;
    button.hidden = true;
  }
  $(".confirm-icon", card).textContent = icon;
  const where = card.dataset.kind === "server" ? "on the gateway" : "in this page";
  $(".confirm-where", card).textContent = card.dataset.status === "approved" ? `runs ${where}` : "did not run";
  $(".confirm-outcome", card).textContent = label;
  // The gateway's reason, unless the card says it already: the user's own Decline, or the
  // deadline. A decline the user did not click (an error, the SDK's) needs it.
  const own = (outcome === "declined" && card.dataset.answer === "decline") || outcome === "expired";
  if (detail && !own) card.append(el("p", { class: "confirm-detail" }, detail));
}
