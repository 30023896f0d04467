// The event inspector: one row per protocol event (seq, type, a compact preview; click for the
// whole JSON), and the life of each tool call by call id (requested → running → completed...).
// It survives a reload of the tab with the conversation (saved.js): `saved()` is what to keep,
// `restore()` draws it again.

import { $, compact, el, pretty } from "./cards.js";

const MAX_EVENT_ROWS = 1000;
/** Events kept across a reload (the newest): enough to debug, small enough for sessionStorage. */
const KEPT_EVENTS = 400;
const PREVIEW_FIRST = ["delta", "text", "tool", "status", "code", "message", "progress", "result", "error", "calls"];

/** Events with a real `seq`; the SDK gives connection-level events (session.resumed...) seq 0. */
export const hasSeq = (event) => typeof event.seq === "number" && event.seq > 0;

const inspector = $("#inspector");
const scroller = $("#inspector-scroll");
const callList = $("#call-list");
/** The events drawn, newest last (what a reload draws again). */
const logged = [];
const lifecycles = new Map(); // call_id -> the <ol> of its steps
let eventCount = 0;

function showCount() {
  $("#event-count").textContent = `${eventCount} event${eventCount === 1 ? "" : "s"}`;
}

/** One row per protocol event: seq (– for connection-level events), type, compact JSON; expand for all of it. */
export function logEvent(event) {
  const seq = hasSeq(event) ? String(event.seq) : "–";
  const { type, seq: _seq, ...fields } = event;
  // The preview leads with what differs between events; ids and empty fields come last or not at all.
  const rest = {};
  for (const key of PREVIEW_FIRST) if (fields[key] != null) rest[key] = fields[key];
  for (const [key, value] of Object.entries(fields)) if (value != null && !(key in rest) && !key.endsWith("_id")) rest[key] = value;
  for (const [key, value] of Object.entries(fields)) if (value != null && !(key in rest)) rest[key] = value;
  const body = el("pre", { class: "event-json" });
  const details = el("details", {},
    el("summary", {},
      el("span", { class: "event-seq" }, seq),
      el("span", { class: "event-type" }, type),
      el("code", { class: "event-preview" }, compact(rest, 160))),
    body);
  // Pretty JSON is rendered on first expand only: text deltas are many.
  details.addEventListener("toggle", () => { if (details.open && !body.textContent) body.textContent = pretty(event); });
  const stick = scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 60;
  inspector.append(el("li", { class: "event", "data-seq": seq, "data-type": type }, details));
  while (inspector.childElementCount > MAX_EVENT_ROWS) inspector.firstElementChild.remove();
  logged.push(event);
  if (logged.length > MAX_EVENT_ROWS) logged.splice(0, logged.length - MAX_EVENT_ROWS);
  eventCount += 1;
  showCount();
  if (stick) scroller.scrollTop = scroller.scrollHeight;
}

/** A step in the life of a tool call: requested → running/pending → progress… → completed. */
export function addStep(callId, tool, step, detail) {
  let steps = lifecycles.get(callId);
  if (!steps) {
    steps = el("ol", { class: "steps" });
    callList.append(el("li", { class: "call", "data-call-id": callId },
      el("div", { class: "call-head" }, el("strong", {}, tool ?? "tool"), " ", el("code", {}, callId)), steps));
    lifecycles.set(callId, steps);
    $(".call-empty").hidden = true;
  }
  steps.append(el("li", { class: "step", "data-step": step, title: detail ?? undefined },
    step, detail ? el("span", { class: "step-detail" }, ` ${detail}`) : null));
}

/** Empty both lists (a new chat). */
export function clearInspector() {
  clearEvents();
  callList.replaceChildren();
  lifecycles.clear();
  $(".call-empty").hidden = false;
}

function clearEvents() {
  inspector.replaceChildren();
  logged.length = 0;
  eventCount = 0;
  showCount();
}

/** What to keep for a reload: the newest events, the count, the call lifecycles as drawn. */
export function saved() {
  return { events: logged.slice(-KEPT_EVENTS), count: eventCount, calls: callList.innerHTML };
}

/** Draw what `saved()` kept (before any event of the new page). */
export function restore(kept) {
  if (!kept) return;
  for (const event of kept.events ?? []) logEvent(event);
  eventCount = Math.max(eventCount, Number(kept.count) || 0);
  showCount();
  callList.innerHTML = kept.calls ?? ""; // our own markup, saved by this page
  for (const call of callList.querySelectorAll("li.call[data-call-id]")) {
    const steps = $("ol.steps", call);
    if (steps) lifecycles.set(call.dataset.callId, steps);
  }
  $(".call-empty").hidden = lifecycles.size > 0;
}

export function bindInspector() {
  $("#clear-events").addEventListener("click", clearEvents);
}
