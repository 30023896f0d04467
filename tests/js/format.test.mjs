// Tests of web_demo/format.js: a tool's raw values as the demo's cards show them.
// Run: node --test tests/js/format.test.js
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { argsSummary, displayOf, errorText, labelOf } from "../../web_demo/format.js";

// ICU writes a narrow no-break space before AM/PM in some versions: compare with plain spaces.
const spaces = (text) => text.replace(/\s/gu, " ");

describe("labelOf", () => {
  test("splits snake_case, kebab-case and camelCase; first letter capitalised, the rest lower case", () => {
    assert.equal(labelOf("in_stock"), "In stock");
    assert.equal(labelOf("zipCode"), "Zip code");
    assert.equal(labelOf("zip-code"), "Zip code");
    assert.equal(labelOf("ZipCode"), "Zip code");
    assert.equal(labelOf("product"), "Product");
    assert.equal(labelOf("MAX_RETRIES"), "Max retries");
  });

  test("upper-cases known initialisms, and keeps words written in capitals", () => {
    assert.equal(labelOf("order_id"), "Order ID");
    assert.equal(labelOf("orderId"), "Order ID");
    assert.equal(labelOf("orderID"), "Order ID");
    assert.equal(labelOf("eta"), "ETA");
    assert.equal(labelOf("callback_url"), "Callback URL");
    assert.equal(labelOf("HTTPStatus"), "HTTP status");
    assert.equal(labelOf("api_key"), "API key");
    assert.equal(labelOf("sku"), "SKU");
    assert.equal(labelOf("client_ip"), "Client IP");
    assert.equal(labelOf("user_ids"), "User IDs");
    assert.equal(labelOf("orderIDs"), "Order IDs");
    assert.equal(labelOf("VAT_number"), "VAT number");
  });

  test("drops a unit suffix that displayOf shows with the number", () => {
    assert.equal(labelOf("distance_km"), "Distance");
    assert.equal(labelOf("timeout_s"), "Timeout");
    assert.equal(labelOf("timeoutMs"), "Timeout");
    assert.equal(labelOf("size_in_bytes"), "Size");
    assert.equal(labelOf("discount_pct"), "Discount");
    assert.equal(labelOf("distance_km", 3), "Distance");
  });

  test("keeps the unit when the value will not show it", () => {
    assert.equal(labelOf("distance_km", "far"), "Distance (km)");
    assert.equal(labelOf("timeout_s", null), "Timeout (s)");
    assert.equal(labelOf("timeout_s", undefined), "Timeout (s)");
  });

  test("a key of one word is no unit; ambiguous suffixes stay words", () => {
    assert.equal(labelOf("ms"), "Ms");
    assert.equal(labelOf("percent"), "Percent");
    assert.equal(labelOf("price_min"), "Price min"); // a minimum, not minutes
    assert.equal(labelOf("box_h"), "Box h"); // a height, not hours
    assert.equal(labelOf("wait_min"), "Wait");
  });

  test("leaves numeric keys (array indexes) unchanged", () => {
    assert.equal(labelOf("1"), "1");
    assert.equal(labelOf("12"), "12");
    assert.equal(labelOf(3), "3");
  });
});

describe("displayOf: scalars", () => {
  test("booleans read yes/no, null and undefined a dash", () => {
    assert.equal(displayOf("in_stock", true), "yes");
    assert.equal(displayOf("charging", false), "no");
    assert.equal(displayOf("price", null), "–");
    assert.equal(displayOf("eta", undefined), "–");
  });

  test("strings stay as they are, untrimmed, even when they look like numbers", () => {
    assert.equal(displayOf("status", "on its way"), "on its way");
    assert.equal(displayOf("status", "  padded "), "  padded ");
    assert.equal(displayOf("level", "0.5"), "0.5");
    assert.equal(displayOf("price", "129"), "129");
    assert.equal(displayOf("distance_km", "far"), "far");
  });

  test("objects and arrays return null: the card nests them", () => {
    assert.equal(displayOf("items", []), null);
    assert.equal(displayOf("store", { name: "Downtown" }), null);
  });

  test("numbers with no rule: grouped from 10,000, otherwise as they are", () => {
    assert.equal(displayOf("quantity", 7), "7");
    assert.equal(displayOf("page", 1), "1");
    assert.equal(displayOf("year", 2026), "2026");
    assert.equal(displayOf("count", 12500), "12,500");
    assert.equal(displayOf("count", -1234567.891), "-1,234,567.891");
    assert.equal(displayOf("score", 0.123456789), "0.123456789");
    assert.equal(displayOf("big", 1e21), "1e+21");
    assert.equal(displayOf("x", Number.NaN), "NaN");
  });
});

describe("displayOf: units", () => {
  test("distance, length and weight", () => {
    assert.equal(displayOf("distance_km", 0), "0 km");
    assert.equal(displayOf("distance_km", 12.4), "12.4 km");
    assert.equal(displayOf("height_m", 3), "3 m");
    assert.equal(displayOf("route_mi", 15000), "15,000 mi");
    assert.equal(displayOf("depth_ft", 6), "6 ft");
    assert.equal(displayOf("weight_kg", 2.5), "2.5 kg");
    assert.equal(displayOf("sugar_g", 30), "30 g");
    assert.equal(displayOf("weight_lb", 4), "4 lb");
    assert.equal(displayOf("distanceKm", 2), "2 km");
  });

  test("durations", () => {
    assert.equal(displayOf("timeout_s", 1.5), "1.5 s");
    assert.equal(displayOf("elapsed_sec", 3), "3 s");
    assert.equal(displayOf("wait_secs", 3), "3 s");
    assert.equal(displayOf("duration_seconds", 90), "90 s");
    assert.equal(displayOf("latency_ms", 250), "250 ms");
    assert.equal(displayOf("timeoutMs", 250), "250 ms");
    assert.equal(displayOf("wait_min", 5), "5 min");
    assert.equal(displayOf("break_mins", 5), "5 min");
    assert.equal(displayOf("session_minutes", 45), "45 min");
    assert.equal(displayOf("duration_h", 2), "2 h");
    assert.equal(displayOf("shift_hours", 8), "8 h");
    assert.equal(displayOf("trial_days", 14), "14 days");
    assert.equal(displayOf("trial_days", 1), "1 day");
  });

  test("percent suffixes and keys hold 0-100", () => {
    assert.equal(displayOf("discount_pct", 12), "12%");
    assert.equal(displayOf("battery_percent", 80), "80%");
    assert.equal(displayOf("percentage", 12), "12%");
    assert.equal(displayOf("percent", 0.5), "0.5%");
  });

  test("sizes: bytes scaled to KB/MB/GB of 1024, at most one decimal; kb/mb/gb as they are", () => {
    assert.equal(displayOf("size_bytes", 512), "512 bytes");
    assert.equal(displayOf("size_bytes", 1), "1 byte");
    assert.equal(displayOf("size_bytes", 2048), "2 KB");
    assert.equal(displayOf("size_bytes", 1536), "1.5 KB");
    assert.equal(displayOf("size_bytes", 1048575), "1 MB");
    assert.equal(displayOf("size_bytes", 5 * 1024 ** 3), "5 GB");
    assert.equal(displayOf("size_in_bytes", 3 * 1024 ** 2), "3 MB");
    assert.equal(displayOf("size_kb", 2048), "2048 KB");
    assert.equal(displayOf("free_mb", 300), "300 MB");
    assert.equal(displayOf("disk_gb", 64), "64 GB");
  });

  test("never lie: ambiguous suffixes and one-word keys are no units", () => {
    assert.equal(displayOf("price_min", 10), "10"); // a minimum price, not 10 minutes
    assert.equal(displayOf("box_h", 12), "12"); // a height, not 12 hours
    assert.equal(displayOf("ms", 5), "5");
  });
});

describe("displayOf: shares as percentages", () => {
  test("a number in [0, 1] under a key naming a share", () => {
    assert.equal(displayOf("level", 1), "100%");
    assert.equal(displayOf("level", 0.42), "42%");
    assert.equal(displayOf("level", 0), "0%");
    assert.equal(displayOf("battery_level", 0.5), "50%");
    assert.equal(displayOf("batteryLevel", 0.07), "7%");
    assert.equal(displayOf("ratio", 0.25), "25%");
    assert.equal(displayOf("fraction", 0.123), "12.3%");
    assert.equal(displayOf("share", 0.3), "30%");
    assert.equal(displayOf("progress", 0.9), "90%");
    assert.equal(displayOf("probability", 0.05), "5%");
    assert.equal(displayOf("confidence", 0.87), "87%");
  });

  test("never lie: out of [0, 1], other keys, ranks and near-ends", () => {
    assert.equal(displayOf("level", 7), "7");
    assert.equal(displayOf("progress", 50), "50");
    assert.equal(displayOf("level", -0.5), "-0.5");
    assert.equal(displayOf("page", 1), "1");
    assert.equal(displayOf("access_level", 1), "1");
    assert.equal(displayOf("aspect_ratio", 1), "1");
    assert.equal(displayOf("level_id", 1), "1");
    assert.equal(displayOf("level", 0.9999), ">99.9%");
    assert.equal(displayOf("level", 0.0001), "<0.1%");
  });
});

describe("displayOf: money", () => {
  test("two decimals with grouping under a key naming money", () => {
    assert.equal(displayOf("price", 129), "129.00");
    assert.equal(displayOf("price", 24.5), "24.50");
    assert.equal(displayOf("amount", 39), "39.00");
    assert.equal(displayOf("balance", 1249.5), "1,249.50");
    for (const key of ["cost", "subtotal", "fee", "tax", "refund"]) assert.equal(displayOf(key, 5), "5.00", key);
    for (const key of ["unit_price", "shipping_cost", "refund_amount", "unitPrice"]) assert.equal(displayOf(key, 5), "5.00", key);
    assert.equal(displayOf("order_total", 1249.5), "1,249.50");
  });

  test("never lie: a negative stays negative, extra decimals stay", () => {
    assert.equal(displayOf("price", -3), "-3.00");
    assert.equal(displayOf("price", 0.125), "0.125");
    assert.equal(displayOf("price", 0.00012345), "0.00012345");
  });

  test("a total is money only beside money or a currency, or with cents", () => {
    assert.equal(displayOf("total", 3, { total: 3, items: [] }), "3"); // a count of results
    assert.equal(displayOf("total", 108, { subtotal: 100, tax: 8, total: 108 }), "108.00");
    assert.equal(displayOf("total", 108, { total: 108, currency: "USD" }), "$108.00");
    assert.equal(displayOf("total", 10.5), "10.50");
  });

  test("with an ISO 4217 currency beside it, in that currency (en-US)", () => {
    assert.equal(displayOf("price", 129, { currency: "USD" }), "$129.00");
    assert.equal(displayOf("price", 1249.5, { currency: "EUR" }), "€1,249.50");
    assert.equal(displayOf("price", -3, { currency: "usd" }), "-$3.00");
    assert.equal(displayOf("price", 129, { currency: "JPY" }), "¥129");
    assert.equal(displayOf("price", 0.125, { currency: "USD" }), "$0.125");
  });

  test("a currency that is no ISO 4217 code is ignored", () => {
    assert.equal(displayOf("price", 129, { currency: "dollars" }), "129.00");
    assert.equal(displayOf("price", 129, { currency: 840 }), "129.00");
    assert.equal(displayOf("price", 129, null), "129.00");
  });
});

describe("displayOf: dates", () => {
  test("an ISO 8601 date-time with an offset, in the given time zone, named", () => {
    assert.equal(spaces(displayOf("eta", "2026-12-04T10:00:00Z", {}, { timeZone: "UTC" })), "Dec 4, 2026, 10:00 AM UTC");
    assert.equal(spaces(displayOf("eta", "2026-12-04T10:00:00+02:00", {}, { timeZone: "UTC" })), "Dec 4, 2026, 8:00 AM UTC");
    assert.equal(spaces(displayOf("eta", "2026-12-04T23:30:00-0100", {}, { timeZone: "UTC" })), "Dec 5, 2026, 12:30 AM UTC");
    assert.equal(spaces(displayOf("at", "2026-12-04T10:00:30.5Z", {}, { timeZone: "UTC" })), "Dec 4, 2026, 10:00:30 AM UTC");
    assert.equal(spaces(displayOf("at", "2026-12-04 10:00Z", {}, { timeZone: "America/New_York" })), "Dec 4, 2026, 5:00 AM EST");
  });

  test("a calendar date as it is written, whatever the time zone", () => {
    assert.equal(displayOf("date", "2026-11-28"), "Nov 28, 2026");
    assert.equal(displayOf("date", "2026-11-28", {}, { timeZone: "Pacific/Kiritimati" }), "Nov 28, 2026");
    assert.equal(displayOf("date", "0099-01-02"), "0099-01-02");
  });

  test("never lie: no offset, no date, or not ISO 8601: left alone", () => {
    for (const text of ["2026-12-04T10:00:00", "2026-02-30", "2026-13-01", "2026-12-04T24:00:00Z",
      "12/04/2026", "2026-12-04T10:00:00Zextra", "arrives today", "20261204"]) {
      assert.equal(displayOf("eta", text, {}, { timeZone: "UTC" }), text);
    }
  });
});

describe("argsSummary", () => {
  test("label and value per entry, joined by middle dots", () => {
    assert.equal(argsSummary({ zip_code: "92031", section: "display" }), "Zip code 92031 · Section display");
    assert.equal(argsSummary({ order_id: "1234" }), "Order ID 1234");
    assert.equal(argsSummary({ product: "headphones", in_stock: true, max_price: 200, radius_km: 5 }),
      "Product headphones · In stock yes · Max price 200.00 · Radius 5 km");
    assert.equal(argsSummary({ distance_km: "far" }), "Distance (km) far");
  });

  test("leaves out null, undefined and empty strings, keeps 0, false and empty objects", () => {
    assert.equal(argsSummary({ a: null, b: undefined, c: "", d: 0, e: false, f: {} }), "D 0 · E no · F {}");
    assert.equal(argsSummary({}), "");
    assert.equal(argsSummary(null), "");
    assert.equal(argsSummary(undefined), "");
  });

  test("objects as compact JSON, values shortened to max characters", () => {
    assert.equal(argsSummary({ filter: { color: "red", sizes: [1, 2] } }), 'Filter {"color":"red","sizes":[1,2]}');
    const summary = argsSummary({ filter: { text: "x".repeat(100) } }, 20);
    assert.equal(summary, `Filter ${'{"text":"xxxxxxxxxx'}…`);
    assert.equal(summary.length, "Filter ".length + 20);
    assert.equal(argsSummary({ note: "abcdefghij" }, 5), "Note abcd…");
    assert.equal(argsSummary({ note: "abcde" }, 5), "Note abcde");
  });

  test("arguments that are no object are shown as they are", () => {
    assert.equal(argsSummary("hello"), "hello");
    assert.equal(argsSummary([1, 2]), "[1,2]");
  });
});

describe("errorText", () => {
  test("drops a leading generic Error: or Exception:", () => {
    assert.equal(errorText("Error: not a US zip code: \"9\""), "not a US zip code: \"9\"");
    assert.equal(errorText("Exception: the store finder is down"), "the store finder is down");
  });

  test("keeps named error classes, prefixes elsewhere, and everything else", () => {
    assert.equal(errorText("TypeError: x is undefined"), "TypeError: x is undefined");
    assert.equal(errorText("ValueError: bad zip"), "ValueError: bad zip");
    assert.equal(errorText("Error: Error: twice"), "Error: twice");
    assert.equal(errorText("Network Error: timeout"), "Network Error: timeout");
    assert.equal(errorText("error: lower case"), "error: lower case");
    assert.equal(errorText("Error:no space"), "Error:no space");
    assert.equal(errorText("The user declined"), "The user declined");
  });

  test("a message that is only the prefix stays; non-strings become text", () => {
    assert.equal(errorText("Error: "), "Error: ");
    assert.equal(errorText(null), "");
    assert.equal(errorText(undefined), "");
  });
});
