// DOM helpers of the web demo, and the cards it shows tool arguments and results as: a small
// key/value list people read at a glance, with the raw JSON one click away. Also the card that
// asks the user to approve a call of a tool marked `confirm` (Approve / Decline), and the card
// of a widget tool's call, which the user answers (a choice, Yes / No, a form).

import { displayOf, labelOf } from "./format.js";

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
 * Keys and values read as people say them (format.js: "In stock: yes", "Level: 100%",
 * "Distance: 0 km"); each row keeps its key in data-key, and the raw JSON is one click away.
 */
export function kvCard(value, depth = 0) {
  if (value === null || typeof value !== "object") return el("span", { class: "kv-scalar" }, scalar(value));
  const list = Array.isArray(value);
  const entries = list ? value.map((item, i) => [String(i + 1), item]) : Object.entries(value);
  if (entries.length === 0) return el("span", { class: "kv-scalar muted" }, list ? "(none)" : "(empty)");
  const card = el("dl", { class: "kv" });
  for (const [key, item] of entries.slice(0, MAX_ROWS)) {
    const nested = item !== null && typeof item === "object";
    const shown = nested ? (depth < 1 ? kvCard(item, depth + 1) : compact(item, 120)) : list ? scalar(item) : displayOf(key, item, value);
    card.append(el("dt", { "data-key": key, title: list ? null : key }, list ? key : labelOf(key, item)), el("dd", { "data-key": key }, shown));
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

// ---- The widget card: a widget tool's call, which the user answers (tool.calls with a `widget`)

const WIDGET_ENDS = {
  completed: ["✓", "Sent"],
  failed: ["✗", "Failed"],
  expired: ["◷", "Expired: no answer in time"],
  cancelled: ["⊘", "Cancelled: the reply was stopped"],
};

/** The controls of a widget: a button per option, Yes / No, or a form's labelled inputs and Submit. */
function widgetControls(widget) {
  switch (widget.type) {
    case "choice":
      return el("div", { class: "widget-actions" }, ...(widget.options ?? []).map((option) =>
        el("button", { class: "btn btn-small widget-option", type: "button", "data-value": option, disabled: true }, option)));
    case "confirm":
      return el("div", { class: "widget-actions" },
        el("button", { class: "btn btn-primary btn-small widget-yes", type: "button", disabled: true }, "Yes"),
        el("button", { class: "btn btn-small widget-no", type: "button", disabled: true }, "No"));
    case "form":
      return el("form", { class: "widget-form" },
        ...(widget.fields ?? []).map((field) => {
          const required = field.required !== false;
          return el("label", { class: "widget-field" },
            el("span", { class: "widget-label" }, `${field.label}${required ? "" : " (optional)"}`),
            el("input", {
              class: "widget-input", name: field.name, type: field.type === "number" ? "number" : "text",
              step: field.type === "number" ? "any" : null, required, disabled: true,
              // a required text field needs more than spaces
              pattern: field.type !== "number" && required ? ".*\\S.*" : null,
            }));
        }),
        el("div", { class: "widget-actions" },
          el("button", { class: "btn btn-primary btn-small widget-submit", type: "submit", disabled: true }, "Submit")));
    default:
      return el("p", { class: "widget-detail" }, `This page cannot show a "${widget.type}" question.`);
  }
}

/**
 * The card that asks the user a widget tool's call (a ClientCall with `widget`): the prompt and
 * the controls of its type. Its controls stay disabled until `answerOnWidget`.
 */
export function widgetCard(call) {
  const widget = call.widget ?? {};
  return el("div", {
    class: "widget", role: "group", "aria-label": widget.prompt ?? call.tool,
    "data-call-id": call.call_id, "data-tool": call.tool, "data-type": widget.type, "data-status": "asking",
  },
  el("div", { class: "widget-head" },
    el("span", { class: "widget-icon", "aria-hidden": "true" }, "?"),
    el("span", { class: "widget-name" }, call.display_name || call.tool),
    el("span", { class: "widget-where" }, "waits for your answer")),
  el("p", { class: "widget-prompt" }, widget.prompt ?? ""),
  widgetControls(widget),
  el("div", { class: "widget-answer" }),
  el("span", { class: "widget-outcome", role: "status" }));
}

/** A form's values as the call's output: numbers as numbers, empty optional fields left out. */
function formOutput(card, widget) {
  const output = {};
  for (const field of widget.fields ?? []) {
    const input = card.querySelector(`input[name="${field.name}"]`);
    const raw = input ? input.value.trim() : "";
    if (raw === "") continue; // the browser let it through: optional
    output[field.name] = field.type === "number" ? Number(raw) : raw;
  }
  return output;
}

/** The user's answer, as the card shows it once given. */
function answerView(widget, output) {
  if (widget.type === "choice") return el("p", { class: "widget-picked" }, "You picked ", el("strong", {}, output.choice));
  if (widget.type === "confirm") return el("p", { class: "widget-picked" }, "You said ", el("strong", {}, output.confirmed ? "Yes" : "No"));
  return kvCard(output);
}

/** Disable every control of the card (the answer is given, or nobody waits for it any more). */
function lockWidget(card) {
  for (const control of card.querySelectorAll("button, input")) control.disabled = true;
}

/**
 * Enable the card's controls; resolves with the call's output at the user's answer
 * (`{choice}`, `{confirmed}` or the form's values). The card then shows the answer and locks.
 * When `signal` aborts first (the deadline, the call ended, the session closing) the controls
 * go off and the promise rejects with its reason. A type the page cannot show rejects at once.
 * @returns {Promise<Record<string, any>>}
 */
export function answerOnWidget(card, widget, signal) {
  return new Promise((resolve, reject) => {
    const asking = new AbortController();
    const stop = () => {
      asking.abort();
      lockWidget(card);
    };
    const answer = (output, button = null) => {
      stop();
      button?.classList.add("chosen");
      button?.setAttribute("aria-pressed", "true");
      card.dataset.status = "answered";
      $(".widget-where", card).textContent = "answered";
      $(".widget-answer", card).replaceChildren(answerView(widget, output));
      $(".widget-outcome", card).textContent = "Sending…";
      resolve(output);
    };
    if (signal.aborted) {
      stop();
      reject(signal.reason);
      return;
    }
    const on = (node, type, listener) => node.addEventListener(type, listener, { signal: asking.signal });
    switch (widget.type) {
      case "choice":
        for (const button of card.querySelectorAll(".widget-option")) on(button, "click", () => answer({ choice: button.dataset.value }, button));
        break;
      case "confirm":
        on($(".widget-yes", card), "click", (event) => answer({ confirmed: true }, event.currentTarget));
        on($(".widget-no", card), "click", (event) => answer({ confirmed: false }, event.currentTarget));
        break;
      case "form":
        // submit fires only once the browser finds every required field filled in
        on($(".widget-form", card), "submit", (event) => {
          event.preventDefault();
          answer(formOutput(card, widget));
        });
        break;
      default:
        stop();
        reject(new RangeError(`this page cannot show a "${widget.type}" widget`));
        return;
    }
    on(signal, "abort", () => { stop(); reject(signal.reason); });
    card.dataset.status = "asking";
    for (const control of card.querySelectorAll("button, input")) control.disabled = false;
  });
}

/**
 * Show how the call ended (a tool.status): `completed` (the answer was taken), `failed`
 * (`detail`: the gateway's reason, e.g. an answer off the tool's schema), `expired` or
 * `cancelled`. The controls lock.
 */
export function settleWidget(card, status, detail = null) {
  const [icon, label] = WIDGET_ENDS[status] ?? WIDGET_ENDS.failed;
  card.dataset.status = status in WIDGET_ENDS ? status : "failed";
  lockWidget(card);
  $(".widget-icon", card).textContent = icon;
  if (card.dataset.status !== "completed" && !$(".widget-answer", card).childElementCount) {
    $(".widget-where", card).textContent = "not answered";
  }
  $(".widget-outcome", card).textContent = label;
  if (detail && card.dataset.status === "failed") card.append(el("p", { class: "widget-detail" }, detail));
}
