// DOM helpers of the web demo, and the cards it shows tool arguments and results as: a small
// key/value list people read at a glance, with the raw JSON one click away.

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
