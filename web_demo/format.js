// A tool's raw values as people read them at a glance in the demo's key/value cards: keys as
// labels ("order_id" -> "Order ID"), numbers with their unit, share or currency ("distance_km" 0
// -> "0 km", "level" 1 -> "100%", "price" 129 -> "129.00"). It must fit any agent's tools, and
// must never lie: the raw JSON is one click away, so when a rule is unsure it shows the value as
// it is. Pure functions, no DOM. Numbers and dates use the "en-US" locale, like the rest of the
// page's (English) text, so that they are the same for everyone and in the tests.

const LOCALE = "en-US";

// A key's last word that is a unit, and how the value shows it. Sizes in bytes are scaled.
const UNITS = {
  km: "km", m: "m", mi: "mi", ft: "ft", kg: "kg", g: "g", lb: "lb", lbs: "lb",
  s: "s", sec: "s", secs: "s", seconds: "s", ms: "ms", min: "min", mins: "min", minutes: "min",
  h: "h", hours: "h", days: "days", pct: "%", percent: "%", percentage: "%",
  bytes: "bytes", kb: "KB", mb: "MB", gb: "GB",
};
// "min" is also "minimum" (price_min) and "h" also "height" (box_h): they are time units only
// after a word that names a duration, so that "price_min" 10 never reads "10 min".
const AMBIGUOUS_UNITS = new Set(["min", "h"]);
const DURATIONS = new Set(["duration", "timeout", "delay", "wait", "eta", "interval", "ttl", "elapsed",
  "runtime", "uptime", "latency", "cooldown", "travel", "drive", "walk", "commute"]);
// Keys whose number is a share of something: in [0, 1] it is shown as a percentage.
const SHARES = new Set(["level", "ratio", "fraction", "share", "progress", "probability", "confidence"]);
// ...unless the word before says it is a rank or a shape: access_level 1 is not "100%".
const NOT_SHARES = new Set(["access", "alert", "aspect", "debug", "difficulty", "log", "nesting",
  "priority", "risk", "security", "skill", "threat", "tier", "trust", "user"]);
// Keys whose number is money. "total" is also a count (a page of results: {total: 3, items}),
// so it is money only with a currency, money beside it, or cents in it.
const MONEY = new Set(["price", "cost", "amount", "subtotal", "balance", "fee", "tax", "refund"]);
const INITIALISMS = new Set(["id", "url", "eta", "api", "sku", "ip", "utc", "http", "json", "pdf", "cpu", "usb"]);

/** A key's words: snake_case, kebab-case and camelCase split ("orderIDs" -> order, IDs). */
function wordsOf(key) {
  return String(key)
    .replace(/([a-z\d])([A-Z])/g, "$1 $2")
    .replace(/([A-Z]+)([A-Z](?:[a-rt-z]|s[a-z]))/g, "$1 $2") // "HTTPServer"; "IDs" stays whole
    .split(/[\s_-]+/)
    .filter(Boolean);
}

/** The unit the key's last word names (a key of one word has none: "ms" is not a unit), or null. */
function unitOf(words) {
  const lower = words.map((word) => word.toLowerCase());
  const last = lower.at(-1);
  if (words.length < 2 || !(last in UNITS)) return null;
  if (AMBIGUOUS_UNITS.has(last) && !DURATIONS.has(lower.at(-2))) return null;
  // "size_in_bytes": the "in" goes with the unit
  return { unit: UNITS[last], words: lower.at(-2) === "in" && words.length > 2 ? 2 : 1 };
}

/**
 * A key as a label: words split, the first capitalised, the rest lower case, known initialisms
 * (and words written in capitals, "VAT_number") upper case, a unit suffix dropped because
 * `displayOf` shows it with the number: "distance_km" -> "Distance", "order_id" -> "Order ID".
 * Give `value` when you have it: a unit key whose value is not a number keeps its unit
 * ("distance_km" "far" -> "Distance (km)"), since the value will not show it.
 * Numeric keys (array indexes) are returned unchanged.
 * @param {string|number} key
 * @param {any} [value]
 * @returns {string}
 */
export function labelOf(key, value) {
  const text = String(key);
  if (/^\d+$/.test(text)) return text;
  let words = wordsOf(text);
  if (words.length === 0) return text;
  const shouting = text === text.toUpperCase(); // MAX_RETRIES: capitals say nothing
  const unit = unitOf(words);
  let suffix = "";
  if (unit) {
    words = words.slice(0, -unit.words);
    // arguments.length: labelOf(key, undefined) is a value ("–"), labelOf(key) is none
    const shown = arguments.length < 2 || (typeof value === "number" && Number.isFinite(value));
    if (!shown) suffix = ` (${unit.unit})`;
  }
  const label = words.map((word) => {
    const lower = word.toLowerCase();
    if (INITIALISMS.has(lower)) return lower.toUpperCase();
    if (lower.endsWith("s") && INITIALISMS.has(lower.slice(0, -1))) return `${lower.slice(0, -1).toUpperCase()}s`;
    if (!shouting && /^[A-Z][A-Z\d]+$/.test(word)) return word;
    return lower;
  }).join(" ");
  return label.charAt(0).toUpperCase() + label.slice(1) + suffix;
}

/** Digits grouped by thousands: "1249" -> "1,249" (an integer part, with or without a sign). */
const group = (digits) => digits.replace(/\B(?=(\d{3})+(?!\d))/g, ",");

/** The number of decimals JavaScript writes `n` with (0.125 -> 3): formats never round below it. */
function decimalsOf(n) {
  const text = String(n);
  return text.includes(".") ? text.length - text.indexOf(".") - 1 : 0;
}

/** A plain number: grouped from 10,000 (years and codes such as 2026 stay bare), else as it is. */
function plain(n) {
  const text = String(n);
  if (/e/i.test(text) || Math.abs(n) < 10000) return text;
  const [int, frac] = text.split(".");
  return frac === undefined ? group(int) : `${group(int)}.${frac}`;
}

/** A number with its unit. Bytes are scaled to KB, MB, GB (of 1024), one decimal at most. */
function withUnit(n, unit) {
  if (unit === "%") return `${plain(n)}%`;
  if (unit === "days") return `${plain(n)} ${n === 1 ? "day" : "days"}`;
  if (unit !== "bytes") return `${plain(n)} ${unit}`;
  if (Math.abs(n) < 1024) return `${plain(n)} ${n === 1 ? "byte" : "bytes"}`;
  const scales = ["KB", "MB", "GB", "TB"];
  let i = 0;
  let size = n / 1024;
  // step up while the rounded size would reach 1024 ("1024 KB" reads better as "1 MB")
  while (Math.abs(Math.round(size * 10) / 10) >= 1024 && i < scales.length - 1) {
    size /= 1024;
    i += 1;
  }
  return `${plain(Math.round(size * 10) / 10)} ${scales[i]}`;
}

/**
 * Money: two decimals with grouping ("1,249.50"), or the currency's own digits and sign with
 * an ISO 4217 code ("$129.00", "¥129"). More decimals than that are kept: 0.125 never reads 0.13.
 */
function money(n, currency) {
  const text = String(n);
  if (/e/i.test(text)) return text;
  if (typeof currency === "string" && /^[A-Za-z]{3}$/.test(currency)) {
    try {
      const digits = new Intl.NumberFormat(LOCALE, { style: "currency", currency }).resolvedOptions().minimumFractionDigits;
      return new Intl.NumberFormat(LOCALE, {
        style: "currency", currency, minimumFractionDigits: digits, maximumFractionDigits: Math.max(digits, decimalsOf(n)),
      }).format(n);
    } catch { /* a code Intl refuses: plain money below */ }
  }
  const [int, frac = ""] = text.split(".");
  return `${group(int)}.${frac.padEnd(2, "0")}`;
}

/** Is the number under these words money? */
function isMoney(words, n, siblings) {
  const last = words.at(-1);
  if (MONEY.has(last)) return true;
  if (last !== "total") return false;
  if (!Number.isInteger(n) || typeof siblings.currency === "string") return true;
  return Object.keys(siblings).some((key) => MONEY.has(wordsOf(key).at(-1)?.toLowerCase()));
}

/** A share in [0, 1] as a percentage, one decimal at most; never rounded to a false 0% or 100%. */
function percentOf(share) {
  const pct = Math.round(share * 1000) / 10;
  if (pct === 0 && share > 0) return "<0.1%";
  if (pct === 100 && share < 1) return ">99.9%";
  return `${pct}%`;
}

// ISO 8601: a date, or a date-time with its offset. A date-time without one is a local time of
// an unknown place: left alone.
const ISO = /^(\d{4})-(\d{2})-(\d{2})(?:[Tt ](\d{2}):(\d{2})(?::(\d{2})(\.\d+)?)?([Zz]|[+-]\d{2}:?\d{2}))?$/;

/** An ISO 8601 date ("Nov 28, 2026") or date-time ("Dec 4, 2026, 10:00 AM UTC"), else null. */
function readableDate(text, timeZone) {
  const match = ISO.exec(text);
  if (!match) return null;
  const [y, mo, d, h, mi, s] = match.slice(1, 7).map((part) => Number(part ?? 0));
  const fraction = Number(match[7] ?? 0);
  const day = new Date(Date.UTC(2000, mo - 1, d));
  day.setUTCFullYear(y); // Date.UTC takes years 0-99 as 1900-1999
  // "2026-02-30" is no date: Date would roll it over to March 2
  if (y < 1000 || day.getUTCMonth() !== mo - 1 || day.getUTCDate() !== d || h > 23 || mi > 59 || s > 59) return null;
  const options = { year: "numeric", month: "short", day: "numeric" };
  // a calendar date has no time zone: shown as it is written
  if (!match[8]) return new Intl.DateTimeFormat(LOCALE, { ...options, timeZone: "UTC" }).format(day);
  const offset = /^[Zz]$/.test(match[8]) ? 0 : (match[8][0] === "-" ? -1 : 1) * (Number(match[8].slice(1, 3)) * 60 + Number(match[8].slice(-2)));
  const instant = day.getTime() + ((h * 60 + mi - offset) * 60 + s + fraction) * 1000;
  // in the reader's time zone (or `timeZone`), named, so that it stays unambiguous
  Object.assign(options, { hour: "numeric", minute: "2-digit", timeZoneName: "short", timeZone });
  if (s !== 0 || fraction !== 0) options.second = "2-digit";
  try { return new Intl.DateTimeFormat(LOCALE, options).format(instant); } catch { return null; }
}

/**
 * A scalar value as text for a card, read with its key (and its object's other fields, for a
 * `currency`): yes/no, "–" for null, numbers with their unit ("0 km"), share ("100%") or money
 * ("129.00", "$129.00"), ISO dates readable; strings otherwise as they are. Objects and arrays
 * return null: the card nests them itself.
 * @param {string|number} key
 * @param {any} value
 * @param {Record<string, any>} [siblings] the object `value` is a field of
 * @param {{timeZone?: string}} [options] date-times' time zone (default: the reader's)
 * @returns {string|null}
 */
export function displayOf(key, value, siblings = {}, { timeZone } = {}) {
  if (value === null || value === undefined) return "–";
  if (typeof value === "boolean") return value ? "yes" : "no";
  if (typeof value === "string") return readableDate(value, timeZone) ?? value;
  if (typeof value === "object") return null;
  if (typeof value !== "number" || !Number.isFinite(value)) return String(value);
  const words = wordsOf(key).map((word) => word.toLowerCase());
  const unit = unitOf(words);
  if (unit) return withUnit(value, unit.unit);
  if (words.length === 1 && UNITS[words[0]] === "%") return `${plain(value)}%`; // "percent": 0-100
  if (isMoney(words, value, siblings ?? {})) return money(value, siblings?.currency);
  if (SHARES.has(words.at(-1)) && !NOT_SHARES.has(words.at(-2)) && value >= 0 && value <= 1) return percentOf(value);
  return plain(value);
}

/** One-line JSON, shortened to `max` characters with an ellipsis. */
function shorten(text, max) {
  return text.length > max ? `${text.slice(0, Math.max(0, max - 1))}…` : text;
}

/**
 * A call's arguments on one line, as the demo shows them under the tool's name:
 * "Zip code 92031 · Section display". Empty values (null, undefined, "") are left out; each
 * value (an object as compact JSON, a long string too) is shortened to `max` characters.
 * @param {Record<string, any>} args
 * @param {number} [max]
 * @returns {string}
 */
export function argsSummary(args, max = 60) {
  if (args === null || args === undefined) return "";
  if (typeof args !== "object" || Array.isArray(args)) return shorten(displayOf("", args) ?? JSON.stringify(args), max);
  return Object.entries(args)
    .filter(([, value]) => value !== null && value !== undefined && value !== "")
    .map(([key, value]) => {
      let text = displayOf(key, value, args);
      if (text === null) { try { text = JSON.stringify(value) ?? String(value); } catch { text = String(value); } }
      return `${labelOf(key, value)} ${shorten(text, max)}`;
    })
    .join(" · ");
}

/**
 * An error message as people read it: a leading "Error: " or "Exception: " (the generic classes
 * of JavaScript and Python, which say nothing) is dropped; "TypeError: …" and the like are kept.
 * @param {string} text
 * @returns {string}
 */
export function errorText(text) {
  const message = String(text ?? "");
  const rest = message.replace(/^(?:Error|Exception): /, "");
  return rest.trim() ? rest : message; // "Error: " alone: better than nothing
}
