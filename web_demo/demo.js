// Web demo of the conversation gateway: a chat over one WebSocket (through the browser SDK),
// client functions that act on this page, server tools, an event inspector and a tools panel.
// No framework and no build step: plain DOM code, served by the gateway under /demo/.

import {
  $, answerOnWidget, askOnCard, compact, confirmCard, confirmOutcome, el, jsonDetails, kvCard, settleCard,
  settleWidget, widgetCard,
} from "./cards.js";
import { ConnectionBanner } from "./banner.js";
import { ChatFollower } from "./follow.js";
import { argsSummary, errorText } from "./format.js";
import { addStep as drawStep, bindInspector, clearInspector, hasSeq, logEvent, restore as restoreInspector, saved as inspectorSaved } from "./inspector.js";
import { renderMarkdown } from "./markdown.js";
import { forget, keepToken, loadSaved, save } from "./saved.js";
import { ToolsPanel } from "./tools-panel.js";
import { VOICE_EVENTS, VoiceControl } from "./voice.js";

const WS_URL = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/v1/realtime`;
const SDK_URL = "/sdk/gateway-client.js";

// ---- Credential: a client token from the page's URL (?token=, minted by your backend with
// POST /v1/sessions), else a development token from POST /v1/dev/token (served only by a
// gateway started with --no-auth). The URL's token is removed from the address bar at once,
// so it stays out of the history and of Referer headers; it is kept in sessionStorage (this
// tab only), so that a reload can resume the session.

const URL_TOKEN = new URLSearchParams(location.search).get("token");
const PAGE_TOKEN = keepToken(URL_TOKEN);
if (URL_TOKEN !== null) {
  const url = new URL(location.href);
  url.searchParams.delete("token");
  history.replaceState(history.state, "", url);
}

/** A fresh development token, or null when the gateway serves none (auth is on). */
async function devToken() {
  const response = await fetch("/v1/dev/token", { method: "POST", headers: { accept: "application/json" } });
  if (response.status === 404) return null;
  const data = await response.json().catch(() => ({}));
  if (!response.ok || typeof data.token !== "string") throw new Error(data.error ?? `HTTP ${response.status}`);
  return data.token;
}

/** The token to connect with now: the page's, else a fresh dev token (null: none). */
async function currentToken() {
  return PAGE_TOKEN ?? (await devToken());
}

let httpHeaders = null;
/** Headers carrying a token for the HTTP endpoints (GET /v1/agent and /v1/tools need one when
 * auth is on); one token for the page's first requests. */
function authHeaders() {
  httpHeaders ??= currentToken().then((token) => (token ? { authorization: `Bearer ${token}` } : {}), () => ({}));
  return httpHeaders;
}

// The demo's store directory: the same five stores as client_sdk/device.py (zip -> store).
const STORES = [
  { zip: 10001, name: "Midtown", address: "350 5th Ave, New York, NY" },
  { zip: 60601, name: "Loop", address: "233 S Wacker Dr, Chicago, IL" },
  { zip: 92031, name: "Vista", address: "1 Main St, Vista, CA" },
  { zip: 94103, name: "SoMa", address: "500 Howard St, San Francisco, CA" },
  { zip: 98101, name: "Downtown", address: "1420 5th Ave, Seattle, WA" },
];

// Inputs prefilled in the tools panel, and a chat prompt that makes the demo's model call each
// tool (offered only when the agent suggests that very prompt: another agent has other phrases).
const TOOL_EXAMPLES = {
  check_stock: { product: "headphones" }, check_order_status: { order_id: "1234" }, cancel_order: { order_id: "1234" },
};
const TOOL_PROMPTS = {
  open_settings: "open the settings",
  get_battery_level: "what's my battery level?",
  get_nearest_store: "nearest store to 92031",
  check_stock: "do you have headphones in stock?",
  check_order_status: "where is my order 1234?",
  cancel_order: "cancel my order 1234",
};
const SETTINGS_SECTIONS = ["display", "sound", "privacy", "network"];
const CONNECTION_LABELS = {
  connecting: "Connecting…", open: "Connected", reconnecting: "Reconnecting…", closed: "Disconnected", offline: "Offline",
};
const DONE_NOTES = { cancelled: "Stopped", incomplete: "Incomplete: the reply was cut short", failed: "Failed" };

// ---- State -------------------------------------------------------------------------------------

let conv = null;          // the GatewayClient
let sdk = null;           // the SDK module (for its error classes)
let session = null;       // the session.created event
let highestSeq = 0;       // events at or below it were handled already (defensive de-duplication)
const toolInfo = new Map();    // tool name -> ToolInfo (from session.created or GET /v1/tools)
const responses = new Map();   // response_id -> { bubble, body, text, sep, status }
const calls = new Map();       // call_id -> { id, tool, display, kind, isAsync, node, responseId }
const running = new Set();     // response ids that have not ended
const clientOutputs = new Map(); // call_id -> what our handler returned, shown with the ✓
const confirms = new Map();    // call_id -> the card asking the user to approve that call
const widgets = new Map();     // call_id -> the card of a widget tool's call (the user answers it)

const settings = { theme: "system", inspector: true, chime: false, battery: true, deltas: false, side: "tools" };
let agentInfo = null;     // GET /v1/agent: { agent, provider, model, suggestions }
const darkQuery = window.matchMedia ? window.matchMedia("(prefers-color-scheme: dark)") : null;

const messages = $("#messages");
const chatScroll = $("#chat-scroll");
const composer = $("#composer");
const stopButton = $("#stop");
const settingsPanel = $("#settings-panel");

const displayName = (tool) => toolInfo.get(tool)?.display_name || tool.replace(/_/g, " ");

// ---- Settings: persisted in localStorage, applied at once --------------------------------------

function loadSettings() {
  try { Object.assign(settings, JSON.parse(localStorage.getItem("gateway-demo-settings") || "{}")); } catch { /* defaults */ }
}

function saveSettings() {
  try { localStorage.setItem("gateway-demo-settings", JSON.stringify(settings)); } catch { /* private mode */ }
}

function applySettings() {
  const dark = settings.theme === "dark" || (settings.theme === "system" && Boolean(darkQuery?.matches));
  document.documentElement.dataset.theme = dark ? "dark" : "light";
  for (const radio of document.querySelectorAll('input[name="theme"]')) radio.checked = radio.value === settings.theme;
  $("#set-inspector").checked = settings.inspector;
  $("#set-chime").checked = settings.chime;
  $("#set-battery").checked = settings.battery;
  $("#show-deltas").checked = settings.deltas;
  $("#inspector").classList.toggle("hide-deltas", !settings.deltas);
  $("#inspector-panel").hidden = !settings.inspector;
  $("#tab-inspector").hidden = !settings.inspector;
  $("#side-tab-inspector").hidden = !settings.inspector;
  if (!settings.inspector && $("#layout").dataset.view === "inspector") showView("chat");
  showSide(settings.inspector ? settings.side : "tools");
}

function bindSettings() {
  for (const radio of document.querySelectorAll('input[name="theme"]')) {
    radio.addEventListener("change", () => { settings.theme = radio.value; saveSettings(); applySettings(); });
  }
  const bindCheck = (id, key) => $(id).addEventListener("change", (e) => { settings[key] = e.target.checked; saveSettings(); applySettings(); });
  bindCheck("#set-inspector", "inspector");
  bindCheck("#set-chime", "chime");
  bindCheck("#set-battery", "battery");
  bindCheck("#show-deltas", "deltas");
  darkQuery?.addEventListener?.("change", applySettings);
  $("#open-settings").addEventListener("click", () => (settingsPanel.hidden ? openSettings(null, { focus: true }) : closeSettings()));
  $("#settings-close").addEventListener("click", closeSettings);
}

/** Show the settings panel, scrolled to `section` when it names one. Focus moves only when the user asked. */
function openSettings(section, { focus = false } = {}) {
  settingsPanel.hidden = false;
  $("#open-settings").setAttribute("aria-expanded", "true");
  refreshNetworkInfo();
  for (const node of settingsPanel.querySelectorAll(".highlight")) node.classList.remove("highlight");
  const name = typeof section === "string" ? section.trim().toLowerCase() : "";
  const target = SETTINGS_SECTIONS.includes(name) ? $(`#settings-${name}`) : null;
  if (target) {
    target.classList.add("highlight");
    target.scrollIntoView({ block: "nearest" });
  }
  if (focus) ((target && $("input", target)) || $("#settings-close")).focus();
}

function closeSettings() {
  const hadFocus = settingsPanel.contains(document.activeElement);
  settingsPanel.hidden = true;
  $("#open-settings").setAttribute("aria-expanded", "false");
  if (hadFocus) $("#open-settings").focus();
}

function refreshNetworkInfo() {
  if (settingsPanel.hidden) return;
  $("#net-url").textContent = WS_URL;
  $("#net-session").textContent = session?.session_id ?? "–";
  $("#net-model").textContent = agentInfo ? modelName(agentInfo) : "–";
  $("#net-reconnects").textContent = String(conv?.reconnects ?? 0);
  $("#net-seq").textContent = String(conv?.lastSeq ?? (highestSeq || "–"));
}

let audio = null;
/** A short chime when a reply finishes (Settings › Sound). */
function chime() {
  if (!settings.chime) return;
  try {
    audio ??= new AudioContext();
    const [osc, gain, now] = [audio.createOscillator(), audio.createGain(), audio.currentTime];
    osc.frequency.value = 880;
    gain.gain.setValueAtTime(0.06, now);
    gain.gain.exponentialRampToValueAtTime(0.0001, now + 0.3);
    osc.connect(gain).connect(audio.destination);
    osc.start();
    osc.stop(now + 0.3);
  } catch { /* no audio: stay silent */ }
}

// ---- Client functions: they really act on this page --------------------------------------------

function nearestStore(zipCode) {
  const zip = String(zipCode ?? "");
  if (!/^\d{5}$/.test(zip)) throw new Error(`not a US zip code: ${JSON.stringify(zipCode)}`);
  const wanted = Number(zip);
  let best = STORES[0];
  for (const store of STORES) if (Math.abs(store.zip - wanted) < Math.abs(best.zip - wanted)) best = store;
  const distance = Math.round(Math.abs(best.zip - wanted) * 0.8 * 10) / 10;
  return { name: best.name, address: best.address, distance_km: distance };
}

async function batteryLevel() {
  if (!settings.battery) throw new Error("The user has turned off battery access in this app's privacy settings");
  if (typeof navigator.getBattery !== "function") throw new Error("The Battery API is not available in this browser");
  const battery = await navigator.getBattery();
  return { level: Number(battery.level), charging: Boolean(battery.charging) };
}

/** Wrap a handler so the chat can show what it returned (by call id) once the gateway confirms it. */
function tracked(handler) {
  return async (args, context) => {
    const output = await handler(args ?? {});
    const callId = context?.call?.call_id; // the SDK passes { signal, call } as a second argument
    if (callId) clientOutputs.set(callId, output);
    return output;
  };
}

function registerClientFunctions() {
  conv.clientFunction("open_settings", tracked((args) => {
    openSettings(args.section);
    return { opened: true };
  }), { description: "Open the app's settings panel on the user's device.", timeout: 15 });
  conv.clientFunction("get_battery_level", tracked(batteryLevel),
    { description: "Read the device's battery level (0 to 1) and whether it is charging.", timeout: 15 });
  conv.clientFunction("get_nearest_store", tracked((args) => nearestStore(args.zip_code)),
    { description: "Find the shop's store nearest to a US zip code, using the device's store finder.", timeout: 15 });
}

// ---- Conversation rendering --------------------------------------------------------------------

// The view follows the conversation as it grows (follow.js): nothing here scrolls by itself.
const follower = new ChatFollower(chatScroll, messages, $("#to-latest"));

/** Add `node` at the end of the conversation. */
function place(node) {
  messages.append(node);
}

/**
 * Add a part to a response where it happened (a tool row, an async chip, an error): after the
 * text so far; the model's next step writes below it. Without a known response, on its own line.
 */
function addPart(responseId, node) {
  const r = responseId ? responses.get(responseId) : null;
  if (!r) {
    place(el("li", { class: "msg orphan" }, node));
    return;
  }
  clearStatus(r);
  flushText(r);
  r.body.append(node);
  r.text = null; // the next text starts a new block, below this part
}

function addUserBubble(text) {
  const bubble = el("li", { class: "msg user" }, el("p", { class: "msg-text" }, text));
  place(bubble);
  return bubble;
}

const recentNotes = new Map(); // text -> time, so one problem reported twice shows once

/**
 * A centred line in the conversation for what belongs to it: an error the gateway sent about
 * no reply in particular, say. The connection's ups and downs go to the banner instead.
 */
function addNote(text, { kind = "info" } = {}) {
  const now = Date.now();
  if (now - (recentNotes.get(text) ?? 0) < 2000) return;
  recentNotes.set(text, now);
  place(el("li", { class: `msg system ${kind}` }, el("span", {}, text)));
}

/** Buttons inside the conversation, named (not bound) so that a conversation redrawn after a
 * reload still has them. */
const MESSAGE_ACTIONS = {
  copy: (button) => copyReply(button),
};

/** The assistant message of a response, created on response.created (or lazily on a stray delta). */
function ensureResponse(responseId, created = {}) {
  let r = responses.get(responseId);
  if (r) return r;
  const body = el("div", { class: "msg-body" });
  const bubble = el("li", {
    class: "msg assistant", "data-response-id": responseId, "data-state": "streaming", "aria-busy": "true",
    "data-in-reply-to": created.in_reply_to, "data-call-id": created.call_id,
  }, el("span", { class: "avatar", "aria-hidden": "true" }, "◉"), body);
  if (created.call_id) {
    // A response started by an async tool's result, not by a user message.
    const call = calls.get(created.call_id);
    bubble.classList.add("async-update");
    body.append(el("span", { class: "msg-label" }, `↻ Async update · ${call ? call.display : "tool result"}`));
  }
  place(bubble);
  r = { bubble, body, text: null, sep: false, status: null, dirty: false };
  responses.set(responseId, r);
  running.add(responseId); // until its response.done
  updateStop();
  return r;
}

// ---- Text: each model step's text is Markdown, kept raw in data-md and drawn safely ---------------

const dirty = new Set(); // responses whose text changed since it was last drawn
let drawScheduled = false;

/**
 * Add a delta to the response's current text block. The block is drawn again from its whole
 * Markdown at the next frame (a delta may end mid-word or mid-marker, and the next one may
 * close a list or a code fence), and at once when the step or the reply ends.
 */
function appendDelta(responseId, delta) {
  const r = ensureResponse(responseId);
  clearStatus(r);
  if (!r.text) r.body.append((r.text = el("div", { class: "msg-text md", "data-md": "" })));
  let raw = r.text.dataset.md ?? "";
  // A new model step (after text.done) starts with a space, so steps do not run together.
  if (r.sep && raw && !/\s$/.test(raw)) raw += " ";
  r.sep = false;
  r.text.dataset.md = raw + delta;
  dirty.add(r);
  if (!drawScheduled) {
    drawScheduled = true;
    requestAnimationFrame(drawDirty);
  }
}

function drawDirty() {
  drawScheduled = false;
  for (const r of dirty) flushText(r);
}

/** Draw the response's current text block from its Markdown now (no HTML from the model). */
function flushText(r) {
  if (!dirty.delete(r) || !r.text) return;
  r.text.replaceChildren(renderMarkdown(r.text.dataset.md ?? ""));
}

/** The reply's text as the model wrote it (Markdown): every block of it, in order. */
function replyMarkdown(bubble) {
  return [...bubble.querySelectorAll(".msg-text[data-md]")].map((node) => node.dataset.md.trim()).filter(Boolean).join("\n\n");
}

/** Copy a reply's Markdown; the button says it worked. */
async function copyReply(button) {
  const bubble = button.closest(".msg.assistant");
  if (!bubble) return;
  const text = replyMarkdown(bubble);
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    // no Clipboard API (an http page that is not localhost): the old way
    const area = el("textarea", { class: "visually-hidden", "aria-hidden": "true" });
    area.value = text;
    document.body.append(area);
    area.select();
    document.execCommand("copy");
    area.remove();
  }
  button.dataset.copied = "true";
  button.textContent = "✓ Copied";
  setTimeout(() => { button.textContent = "Copy"; delete button.dataset.copied; }, 1500);
}

/** A discreet line under the response (the model is being retried); gone with the next part. */
function setStatus(r, text) {
  clearStatus(r);
  r.status = el("p", { class: "msg-retry", role: "status" }, text);
  r.body.append(r.status);
}

function clearStatus(r) {
  r.status?.remove();
  r.status = null;
}

function onRetrying(event) {
  const r = ensureResponse(event.response_id);
  const delay = Math.max(0, Math.round(Number(event.delay) || 0));
  const reason = event.reason ? `${event.reason}: ` : "";
  setStatus(r, `↻ The model did not answer (${reason}trying again in ${delay} s, retry ${event.attempt}).`);
}

/** An error event: in the response it ended when it names one, else a line of its own. */
function onError(event) {
  if (event.in_reply_to) sentQueued(event.in_reply_to);
  const r = event.response_id ? responses.get(event.response_id) : null;
  if (!r) {
    addNote(`${event.code}: ${event.message}`, { kind: "error" });
    return;
  }
  addPart(event.response_id, el("p", { class: "msg-error", role: "alert", title: event.code }, `⚠ ${event.message}`));
}

function finishResponse(event) {
  const r = ensureResponse(event.response_id);
  clearStatus(r);
  flushText(r); // drawn before the state says "done"
  const state = event.status === "completed" ? "done" : String(event.status || "done");
  if (!r.body.querySelector(".msg-text, .activity, .chip, .confirm, .widget, .msg-error")) r.bubble.classList.add("empty");
  if (DONE_NOTES[state]) r.body.append(el("span", { class: "msg-status" }, DONE_NOTES[state]));
  if (replyMarkdown(r.bubble)) {
    r.body.append(el("div", { class: "msg-actions" },
      el("button", { class: "btn btn-ghost btn-small msg-copy", type: "button", "data-action": "copy", title: "Copy the reply (Markdown)" }, "Copy")));
  }
  r.bubble.dataset.state = state;
  r.bubble.setAttribute("aria-busy", "false");
  running.delete(event.response_id);
  updateStop();
  chime();
  saveConversation();
}

function updateStop() {
  stopButton.disabled = running.size === 0;
}

/** A tool row: what was called, where it runs, its arguments and, once known, its result as a card. */
function addActivity(call, args) {
  const icon = call.kind === "client" ? "⚙" : "☁";
  const where = call.kind === "client" ? "in this page" : "on the gateway";
  call.node = el("div", {
    class: `activity ${call.kind}`, "data-call-id": call.id, "data-tool": call.tool, "data-status": "running",
    title: `${call.tool}: runs ${where}`,
  },
  el("div", { class: "activity-head" },
    el("span", { class: "activity-icon", "aria-hidden": "true" }, icon),
    el("span", { class: "activity-name" }, call.display),
    el("span", { class: "activity-where" }, where),
    el("span", { class: "activity-state" }, "running…")),
  args === undefined || Object.keys(args).length === 0 ? null : el("div", { class: "activity-args" }, argsLine(args)),
  el("div", { class: "activity-result" }));
  if (args !== undefined) call.args = args;
  addPart(call.responseId, call.node);
}

/** A call's arguments on one line, as people read them: "Zip code 92031 · Section display". */
function argsLine(args) {
  return argsSummary(args, 60);
}

/**
 * An approved call runs on its confirmation card: one card whose state changes (asking →
 * approved → running → done, with the result), not a second, near-identical tool row.
 */
function adoptCard(call, card) {
  call.node = card;
  call.isAsync = false; // the card shows pending and progress as a tool row does
  call.onCard = true;
  if (!$(".activity-state", card)) $(".confirm-head", card).append(el("span", { class: "activity-state" }, "running…"));
  if (!$(".activity-result", card)) card.append(el("div", { class: "activity-result" }));
  card.dataset.run = "running";
}

function updateActivity(call, event) {
  const state = $(".activity-state", call.node);
  const result = $(".activity-result", call.node);
  const status = event.status;
  if (status === "running" || status === "pending") return;
  if (status === "progress") {
    state.textContent = `… ${event.progress?.stage ?? compact(event.progress, 50)}`;
    return;
  }
  // A confirmation card keeps data-status "approved" (its question's fate); the run's is data-run.
  call.node.dataset[call.onCard ? "run" : "status"] = status;
  const raw = {};
  if (call.args !== undefined) raw.args = call.args;
  if (status === "completed") {
    const output = call.kind === "client" ? clientOutputs.get(call.id) : event.result;
    clientOutputs.delete(call.id);
    state.textContent = "✓ done";
    if (output !== undefined) {
      result.replaceChildren(kvCard(output));
      raw.result = output;
    }
  } else {
    state.textContent = status === "expired" ? "⏱ expired" : status === "cancelled" ? "⊘ cancelled" : "✗ failed";
    if (event.error) result.replaceChildren(el("p", { class: "activity-error" }, errorText(event.error)));
    raw.error = event.error ?? status;
  }
  call.node.append(jsonDetails(raw));
}

/** The chip of an async server tool: pending (spinner) → progress (stage) → completed / failed. */
function addAsyncChip(call) {
  call.node = el("div", { class: "chip async", "data-call-id": call.id, "data-tool": call.tool, "data-status": "pending" },
    el("span", { class: "chip-icon spinner", "aria-hidden": "true" }),
    el("span", { class: "chip-title" }, call.display),
    el("span", { class: "chip-detail" }, "checking…"));
  addPart(call.responseId, call.node);
}

function updateAsyncChip(call, event) {
  const icon = $(".chip-icon", call.node);
  const title = $(".chip-title", call.node);
  const detail = $(".chip-detail", call.node);
  if (event.status === "pending") return;
  if (event.status === "progress") {
    call.node.dataset.status = "progress";
    detail.textContent = `${event.progress?.stage ?? compact(event.progress, 60)}…`;
    return;
  }
  icon.classList.remove("spinner");
  if (event.status === "completed") {
    const result = event.result ?? {};
    // The demo's order lookup reads best as "Order 1234 · on its way · arrives in 2 days".
    if (result && typeof result === "object" && "order_id" in result) title.textContent = `Order ${result.order_id}`;
    const parts = result && typeof result === "object" ? [result.status, result.eta].filter((p) => typeof p === "string") : [];
    detail.textContent = parts.length ? parts.join(" · ") : compact(event.result, 80);
    icon.textContent = "✓";
    call.node.dataset.status = "completed";
  } else {
    // failed (also cancelled or expired, which the gateway does not send for async calls today)
    detail.textContent = `${event.status}: ${errorText(event.error ?? "no result")}`;
    icon.textContent = "✗";
    call.node.dataset.status = "failed";
  }
}

// ---- Confirmation: a tool marked `confirm` runs only once the user clicks Approve ---------------

/** tool.confirm: a card per call, in the response that asked (the SDK's onConfirm then asks on it). */
function onConfirmRequest(event) {
  for (const item of event.calls ?? []) {
    if (confirms.has(item.call_id)) continue; // asked again after a resume: the card is there
    const card = confirmCard(item);
    confirms.set(item.call_id, card);
    addPart(event.response_id, card);
    addStep(item.call_id, item.tool, "confirm", item.prompt);
  }
}

/**
 * The SDK's confirmation handler: the card's buttons answer it. The card exists already when
 * tool.confirm drew it; one offered again after a reload or a snapshot (open_confirmations) may
 * have none, and gets one of its own.
 */
async function askUser(item, { signal }) {
  let card = confirms.get(item.call_id);
  if (!card?.isConnected || !["asking", "answered"].includes(card.dataset.status)) {
    card = confirmCard(item);
    confirms.set(item.call_id, card);
    addPart(null, card);
  }
  const approved = await askOnCard(card, signal);
  addStep(item.call_id, item.tool, "answered", approved ? "approve" : "decline");
  return approved;
}

/**
 * The first news of a call the user was asked about settles its card: approved (it runs, shown
 * as a tool row under the card), declined, expired or cancelled. Returns true when the card
 * says it all (the call never ran): no tool row then, also for a repeated (duplicate) status.
 */
function settleConfirm(callId, event) {
  const card = confirms.get(callId);
  if (!card) return false;
  if (card.dataset.status === "asking" || card.dataset.status === "answered") {
    const outcome = event ? confirmOutcome(event) : "approved";
    settleCard(card, outcome, outcome === "approved" ? null : errorText(event?.error ?? ""));
  }
  return card.dataset.status !== "approved";
}

/** The confirmation card of an approved call, which the call then runs on; else null. */
function approvedCard(callId) {
  const card = confirms.get(callId);
  return card?.isConnected && card.dataset.status === "approved" ? card : null;
}

// ---- Widgets: a widget tool's call is answered by the user, on a card in the reply ------------

/** The card of a widget call: the one drawn already (also one restored after a reload), or none. */
function widgetCardOf(callId) {
  const card = widgets.get(callId);
  if (card?.isConnected) return card;
  const drawn = [...messages.querySelectorAll("div.widget")].find((node) => node.dataset.callId === callId);
  if (drawn) widgets.set(callId, drawn);
  return drawn ?? null;
}

/** tool.calls brought a widget call: its card where the tool's row would be. */
function addWidget(c, responseId) {
  if (widgetCardOf(c.call_id)) return; // offered again after a resume or a reload
  const card = widgetCard(c);
  widgets.set(c.call_id, card);
  addPart(responseId, card);
  addStep(c.call_id, c.tool, "widget", c.widget?.prompt ?? null);
}

/**
 * The SDK's widget handler: the card's controls answer it. A call offered again with no card
 * (after a snapshot) gets one of its own; one answered already is not asked again.
 */
async function answerWidget(c, { signal }) {
  let card = widgetCardOf(c.call_id);
  if (!card || card.dataset.status !== "asking") {
    card = widgetCard(c);
    widgets.set(c.call_id, card);
    addPart(null, card);
  }
  const output = await answerOnWidget(card, c.widget ?? {}, signal);
  addStep(c.call_id, c.tool, "answered", compact(output, 60));
  saveConversation();
  return output;
}

/** A tool.status of a widget call: the card shows how it ended. True when it was one. */
function settleWidgetCall(event) {
  const card = widgetCardOf(event.call_id);
  if (!card) return false;
  addStep(event.call_id, event.tool, event.status, event.duplicate ? "duplicate" : event.error ?? null);
  const ended = ["completed", "failed", "expired", "cancelled"].includes(event.status);
  if (ended && !event.duplicate && ["asking", "answered"].includes(card.dataset.status)) {
    settleWidget(card, event.status, event.error ? errorText(event.error) : null);
  }
  return true;
}

// ---- Protocol events ---------------------------------------------------------------------------

function handleEvent(event) {
  if (!event || typeof event.type !== "string") return;
  if (hasSeq(event)) {
    if (event.seq <= highestSeq) return; // already handled (e.g. session.created from both start() and "*")
    highestSeq = event.seq;
  }
  logEvent(event);
  try {
    switch (event.type) {
      case "session.created": onSession(event); break;
      case "response.created":
        if (event.in_reply_to) sentQueued(event.in_reply_to);
        ensureResponse(event.response_id, event);
        if (event.call_id) addStep(event.call_id, null, "delivered", event.response_id);
        break;
      case "text.delta": appendDelta(event.response_id, event.delta ?? ""); break;
      case "text.done": {
        const r = ensureResponse(event.response_id);
        if (!r.text && event.text) appendDelta(event.response_id, event.text); // deltas were missed
        flushText(r);
        r.sep = true;
        break;
      }
      case "tool.calls": for (const call of event.calls ?? []) onClientCall(call, event.response_id); break;
      case "tool.confirm": onConfirmRequest(event); break;
      case "tool.status": onToolStatus(event); break;
      case "response.retrying": onRetrying(event); break;
      case "response.done": finishResponse(event); break;
      case "error": onError(event); break;
      case "session.resumed": onResumed(event); break;
      case "session.snapshot": onSnapshot(event); break;
      case "agent.transferred": onTransfer(event); break;
      case "session.updated": voice.onUpdated(event); break;
      default:
        if (VOICE_EVENTS.includes(event.type)) voice.onEvent(event);
        break;
    }
  } catch (err) {
    console.error("demo: could not render", event, err);
  }
  refreshNetworkInfo();
}

function onSession(created) {
  if (session?.session_id === created.session_id) return;
  voice.onSession(created);
  session = created;
  for (const tool of created.tools ?? []) if (!toolInfo.has(tool.name)) toolInfo.set(tool.name, tool);
  toolsPanel.onSession(created);
}

/** The agent handed the conversation to another: say so in the answer, show its tools. */
function onTransfer(event) {
  const why = event.reason ? ` (${event.reason})` : "";
  addPart(event.response_id, el("p", { class: "msg-transfer", "data-agent": event.agent }, `⇄ Now with the ${event.agent} agent${why}.`));
  for (const tool of event.tools ?? []) if (!toolInfo.has(tool.name)) toolInfo.set(tool.name, tool);
  currentAgent = event.agent;
  showAgent(currentAgent);
  toolsPanel.load(currentAgent);
}

/** A call of a client function (tool.calls stands for "requested"). */
function onClientCall(c, responseId) {
  if (calls.has(c.call_id)) return; // offered again after a resume: already shown
  settleConfirm(c.call_id, null); // an approved client function's call
  if (c.widget) { // none of the page's client functions is a widget tool: onWidget answers it
    addWidget(c, responseId);
    return;
  }
  const call = { id: c.call_id, tool: c.tool, display: c.display_name || displayName(c.tool), kind: "client", responseId };
  calls.set(c.call_id, call);
  const card = approvedCard(c.call_id);
  if (card) {
    call.args = c.args ?? {};
    adoptCard(call, card);
  } else addActivity(call, c.args ?? {});
  addStep(c.call_id, c.tool, "requested", compact(c.args ?? {}, 60));
}

function onToolStatus(event) {
  if (settleWidgetCall(event)) return;
  if (settleConfirm(event.call_id, event)) {
    addStep(event.call_id, event.tool, event.status, event.duplicate ? "duplicate" : event.error ?? null);
    return;
  }
  let call = calls.get(event.call_id);
  if (!call) {
    const info = toolInfo.get(event.tool);
    const kind = info?.kind === "client" ? "client" : "server";
    const isAsync = event.status === "pending" || info?.execution === "async";
    call = { id: event.call_id, tool: event.tool, display: displayName(event.tool), kind, isAsync, responseId: event.response_id };
    calls.set(event.call_id, call);
    const card = approvedCard(event.call_id);
    if (card) adoptCard(call, card);
    else if (kind === "server" && isAsync) addAsyncChip(call);
    else addActivity(call, undefined); // server tools' arguments are not sent to the client
  }
  const detail = event.status === "progress" ? (event.progress?.stage ?? compact(event.progress, 40))
    : event.duplicate ? "duplicate" : event.error ?? null;
  addStep(event.call_id, event.tool, event.status, detail);
  if (event.duplicate) return; // a repeat of an outcome already shown
  if (call.isAsync) updateAsyncChip(call, event);
  else updateActivity(call, event);
}

function onResumed(event) {
  if (event.agent && event.agent !== currentAgent) {
    showAgent((currentAgent = event.agent));
    toolsPanel.load(currentAgent);
  }
  const missed = Math.max(0, (event.last_seq ?? 0) - (event.replayed_from ?? 0) + 1);
  if (reloaded) banner.restored();
  else banner.back(missed);
  sentQueued(); // the outbox went out again on the new socket
  for (const c of event.open_calls ?? []) addStep(c.call_id, c.tool, "offered again", `${Math.round(c.timeout ?? 0)} s left`);
  for (const c of event.open_confirmations ?? []) addStep(c.call_id, c.tool, "asked again", `${Math.round(c.timeout ?? 0)} s left`);
}

/** Events were lost for good: redraw the conversation from the snapshot's transcript. */
function onSnapshot(event) {
  if (event.agent) showAgent((currentAgent = event.agent));
  responses.clear();
  calls.clear();
  confirms.clear(); // the calls still open are asked again (open_confirmations), each on a new card
  widgets.clear(); // open widget calls come again in open_calls, each on a new card
  messages.replaceChildren();
  for (const entry of event.transcript ?? []) {
    if (entry.role === "user") addUserBubble(entry.text);
    else {
      place(el("li", { class: "msg assistant", "data-state": "done" },
        el("span", { class: "avatar", "aria-hidden": "true" }, "◉"),
        el("div", { class: "msg-body" }, el("div", { class: "msg-text md", "data-md": entry.text }, renderMarkdown(entry.text)))));
    }
  }
  if (typeof event.last_seq === "number") highestSeq = event.last_seq;
  running.clear();
  updateStop();
  banner.warn("Some events could not be replayed: the conversation was redrawn from the gateway's transcript (text only).");
  saveConversation();
}

/** A step in the life of a tool call, in the inspector's call list. */
function addStep(callId, tool, step, detail) {
  drawStep(callId, tool ?? calls.get(callId)?.tool, step, detail);
}

// ---- The agent (GET /v1/agent) and its tools (the tools panel: tools-panel.js) -----------------

// The demo's own: what the panel prefills, and the chat prompt it offers (only when the agent
// suggests that very prompt: another agent has other phrases).
const toolsPanel = new ToolsPanel({
  authHeaders,
  toolInfo,
  session: () => session,
  example: (tool) => TOOL_EXAMPLES[tool.name] ?? null,
  tryPrompt: (tool) => (agentInfo?.suggestions?.includes(TOOL_PROMPTS[tool.name]) ? TOOL_PROMPTS[tool.name] : null),
  tryInChat: (prompt) => { composer.value = prompt; showView("chat"); composer.focus(); },
});

/** GET /v1/agent: the agent's name, its provider and model, its suggested prompts. */
async function loadAgent() {
  try {
    const response = await fetch("/v1/agent", { headers: { accept: "application/json", ...(await authHeaders()) } });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    renderAgent(await response.json());
  } catch {
    renderAgent(null); // an older gateway: no suggestions rather than another agent's
  }
}

/** "scripted (deterministic rules, not an LLM)" or "openai · gpt-4o-mini". */
function modelName(info) {
  if (info.provider === "scripted") return "scripted (deterministic rules, not an LLM)";
  return info.model ? `${info.provider} · ${info.model}` : info.provider;
}

function renderAgent(info) {
  agentInfo = info;
  const prompts = info?.suggestions ?? [];
  const row = $("#suggestions");
  row.replaceChildren(...prompts.map((text) => {
    const chip = el("button", { class: "suggestion", type: "button" }, text);
    chip.addEventListener("click", () => send(text));
    return chip;
  }));
  row.hidden = prompts.length === 0;
  fadeChips();
  showAgent(currentAgent ?? info?.agent);
  $("#model-note").textContent = info ? `Model: ${modelName(info)}.${prompts.length ? " Try the suggestions below." : ""}` : "";
  toolsPanel.redraw();
  refreshNetworkInfo();
}

/** Mark the side(s) of the chip row with more chips to scroll to: the CSS fades them out. */
function fadeChips() {
  const row = $("#suggestions");
  const left = row.scrollLeft > 1;
  const right = row.scrollLeft + row.clientWidth < row.scrollWidth - 1;
  if (left || right) row.dataset.more = left && right ? "both" : left ? "left" : "right";
  else delete row.dataset.more;
}

function bindChips() {
  const row = $("#suggestions");
  row.addEventListener("scroll", fadeChips, { passive: true });
  new ResizeObserver(fadeChips).observe(row);
}

let currentAgent = null; // the agent the session is with, once it is not the gateway's own

/** Name the agent the page talks to in its header. */
function showAgent(agent) {
  $("#agent-name").textContent = agent ? `the ${agent} agent` : "the agent";
}

// ---- Connection: the pill in the header, and one banner while it is not simply fine -------------

let socketState = "connecting"; // what the SDK says of the WebSocket
let socketReconnects = 0;
let online = navigator.onLine !== false; // what the browser says of the network

// The microphone button (voice.js): shown once session.created says the gateway has audio.
const voice = new VoiceControl($("#mic"), {
  addUserBubble,
  note: addNote,
  changed: saveConversation,
});

const banner = new ConnectionBanner($("#banner"), { retry: retryNow, restart: newChat });

function setConnection({ state, reconnects, error } = {}) {
  const previous = socketState;
  socketState = state in CONNECTION_LABELS ? state : "closed";
  socketReconnects = Number(reconnects ?? conv?.reconnects ?? 0) || 0;
  renderPill();
  if (socketState === "reconnecting" && previous !== "reconnecting") {
    if (online) banner.reconnecting();
    else banner.offline();
  }
  if (socketState === "closed" && previous !== "closed") {
    forget(); // nothing left to resume on a reload
    const why = error?.message ? ` (${error.message})` : "";
    banner.closed(`This conversation has ended: the connection to the gateway is closed${why}.`);
  }
}

/** The pill: the socket's state, except "Offline" while the browser has no network (a socket
 * can look open for a while after the network went: the browser knows first). */
function renderPill() {
  const pill = $("#connection");
  const state = online || socketState === "closed" ? socketState : "offline";
  pill.dataset.state = state;
  pill.dataset.reconnects = String(socketReconnects);
  $(".pill-label", pill).textContent = CONNECTION_LABELS[state];
  pill.title = `${CONNECTION_LABELS[state]}${socketReconnects ? ` · resumed ${socketReconnects}×` : ""}: the WebSocket to the gateway; a dropped socket is resumed without losing events`;
  refreshNetworkInfo();
}

/** Try to reconnect at once (the banner's Retry now, the network back, the tab shown again). */
function retryNow() {
  if (typeof conv?.retryNow === "function") conv.retryNow();
}

function bindNetwork() {
  window.addEventListener("offline", () => {
    online = false;
    renderPill();
    if (socketState !== "closed") banner.offline();
  });
  window.addEventListener("online", () => {
    online = true;
    renderPill();
    if (socketState === "open") banner.back(0); // the socket held: nothing was missed
    else if (socketState === "reconnecting") banner.reconnecting();
    retryNow(); // no point waiting out the backoff: the network is back now
  });
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible") retryNow();
  });
}

// ---- Messages sent while the connection is down: queued, then sent -------------------------------

const QUEUED_NOTE = "Queued: it goes out when the connection is back";

/** Mark a user message that could not go out yet (the SDK keeps it and sends it on resume). */
function markQueued(bubble) {
  bubble.dataset.queued = "true";
  bubble.append(el("span", { class: "msg-status msg-queued" }, `◷ ${QUEUED_NOTE}`));
}

/** The connection is back and the SDK sent its outbox again: nothing is queued any more. */
function sentQueued(messageId = null) {
  const selector = messageId ? `.msg.user[data-message-id="${CSS.escape(messageId)}"][data-queued]` : ".msg.user[data-queued]";
  for (const bubble of messages.querySelectorAll(selector)) {
    delete bubble.dataset.queued;
    $(".msg-queued", bubble)?.remove();
  }
}

// ---- Composer, suggestions, keyboard -----------------------------------------------------------

function describeError(err) {
  if (sdk?.SessionClosed && err instanceof sdk.SessionClosed) return `The session is closed (${err.message}).`;
  if (sdk?.ResumeGap && err instanceof sdk.ResumeGap) return `Events were lost while reconnecting (${err.message}).`;
  if (sdk?.ServerError && err instanceof sdk.ServerError) return `The gateway refused: ${err.code ? `${err.code}: ` : ""}${err.message}`;
  return err?.message ?? String(err);
}

async function send(raw) {
  const text = String(raw ?? "").trim();
  if (!text) return;
  const bubble = addUserBubble(text);
  follower.toBottom(); // sending always shows the newest message
  try {
    const client = await ready;
    const id = await client.post(text);
    if (id) bubble.dataset.messageId = id;
    if (!online || client.state !== "open") markQueued(bubble);
  } catch (err) {
    bubble.dataset.state = "failed";
    bubble.append(el("span", { class: "msg-status" }, "Not sent"));
    addNote(describeError(err), { kind: "error" });
  }
}

async function stop() {
  if (!conv || running.size === 0) return;
  try { await conv.cancel(); } catch (err) { addNote(`Could not stop: ${describeError(err)}`, { kind: "error" }); }
}

function autosize() {
  composer.style.height = "auto";
  composer.style.height = `${Math.min(composer.scrollHeight, 160)}px`;
}

function bindComposer() {
  $("#composer-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = composer.value;
    composer.value = "";
    autosize();
    send(text);
  });
  composer.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $("#composer-form").requestSubmit();
    }
  });
  composer.addEventListener("input", autosize);
  stopButton.addEventListener("click", stop);
  messages.addEventListener("click", (e) => {
    const button = e.target.closest?.("[data-action]");
    const action = button ? MESSAGE_ACTIONS[button.dataset.action] : null;
    if (action) action(button);
  });
  document.addEventListener("keydown", (e) => {
    if (e.key !== "Escape" || e.defaultPrevented) return;
    if (!settingsPanel.hidden) closeSettings();
    else if (running.size) stop();
  });
}

// ---- Tabs (small screens): chat / tools / inspector, with arrow keys inside the tab list -------

const TABS = { chat: "#tab-chat", tools: "#tab-tools", inspector: "#tab-inspector" };
const SIDE_TABS = { tools: "#side-tab-tools", inspector: "#side-tab-inspector" };

/** Mark the tab of `current` selected (and the only one in the tab order). */
function selectTab(tabs, current) {
  for (const [name, selector] of Object.entries(tabs)) {
    const tab = $(selector);
    tab.setAttribute("aria-selected", String(name === current));
    tab.tabIndex = name === current ? 0 : -1;
  }
}

/** Small screens: one view at a time (chat, tools or inspector). */
function showView(view) {
  $("#layout").dataset.view = view;
  selectTab(TABS, view);
  if (view in SIDE_TABS) showSide(view);
}

/** Wide screens: the side shows one panel at a time, at full height. */
function showSide(panel) {
  $("#layout").dataset.side = panel;
  selectTab(SIDE_TABS, panel);
  if (settings.side !== panel) {
    settings.side = panel;
    saveSettings();
  }
}

/** Click to choose; arrow keys move along the visible tabs. */
function bindTabList(list, tabs, show) {
  const names = Object.keys(tabs);
  for (const name of names) $(tabs[name]).addEventListener("click", () => show(name));
  $(list).addEventListener("keydown", (e) => {
    if (e.key !== "ArrowLeft" && e.key !== "ArrowRight") return;
    const visible = names.filter((n) => !$(tabs[n]).hidden);
    const at = visible.findIndex((n) => $(tabs[n]).getAttribute("aria-selected") === "true");
    const next = visible[(at + (e.key === "ArrowRight" ? 1 : visible.length - 1)) % visible.length];
    show(next);
    $(tabs[next]).focus();
  });
}

function bindTabs() {
  bindTabList(".tabs", TABS, showView);
  bindTabList(".side-tabs", SIDE_TABS, showSide);
}

// ---- Reload: the conversation and its session survive it (see saved.js) -----------------------

let reloaded = false; // this page resumed the session of the page before it

/** Keep the conversation as drawn, with its cursor and the inspector, for a reload of this tab. */
function saveConversation() {
  if (!session || socketState === "closed") return;
  save({
    session,
    last_seq: highestSeq,
    html: messages.innerHTML,
    responses: [...responses].map(([id, r]) => ({ id, sep: r.sep })),
    calls: [...calls.values()].map(({ node, ...call }) => call),
    inspector: inspectorSaved(),
  });
}

/** Draw the saved conversation again, and rebuild what the event handlers look up. */
function restoreConversation(saved) {
  messages.innerHTML = saved.html; // this page's own markup (the model's text in it is escaped)
  for (const { id, sep } of saved.responses ?? []) {
    const bubble = messages.querySelector(`.msg.assistant[data-response-id="${CSS.escape(id)}"]`);
    if (!bubble) continue;
    const body = $(".msg-body", bubble);
    const last = body.lastElementChild;
    // A reply still streaming goes on in its last text block.
    const text = last?.classList.contains("msg-text") && last.dataset.md !== undefined ? last : null;
    $(".msg-retry", body)?.remove();
    responses.set(id, { bubble, body, text, sep, status: null });
    if (bubble.dataset.state === "streaming") running.add(id);
  }
  for (const call of saved.calls ?? []) {
    const id = CSS.escape(call.id);
    const node = call.onCard
      ? messages.querySelector(`.confirm[data-call-id="${id}"]`)
      : messages.querySelector(`[data-call-id="${id}"]:not(.msg):not(.confirm)`);
    if (node) calls.set(call.id, { ...call, node });
  }
  // Cards still waiting: their buttons wait for the new SDK to ask again (open_confirmations).
  for (const card of messages.querySelectorAll(".confirm[data-call-id]")) {
    confirms.set(card.dataset.callId, card);
    for (const button of card.querySelectorAll(".confirm-actions .btn")) button.disabled = true;
  }
  restoreInspector(saved.inspector);
  session = saved.session;
  highestSeq = saved.last_seq;
  updateStop();
  follower.toBottom();
}

/** Back to an empty page: the saved session could not be resumed, or a new chat starts. */
function clearConversation() {
  messages.replaceChildren();
  responses.clear();
  calls.clear();
  confirms.clear();
  widgets.clear();
  clientOutputs.clear();
  running.clear();
  dirty.clear();
  clearInspector();
  session = null;
  highestSeq = 0;
  updateStop();
  follower.toBottom();
}

// ---- New chat: end this session on the gateway, start a fresh one in the same page ----------------

function newChat() {
  const old = conv;
  conv = null; // from now on nothing of the old session is drawn (see newClient)
  forget();
  banner.clear();
  clearConversation();
  setConnection({ state: "connecting", reconnects: 0 });
  if (currentAgent !== null) {
    currentAgent = null; // a new session starts with the gateway's own agent again
    showAgent(agentInfo?.agent);
    toolsPanel.load();
  }
  composer.value = "";
  autosize();
  composer.focus();
  // Set at once: a message sent from now on waits for the new session, never the old one.
  ready = (async () => {
    await old?.close().catch(() => { /* it ends on the gateway after its session_ttl */ });
    return sdk ? startSession() : boot();
  })();
  ready.catch(() => { /* said in the banner */ });
}

// ---- Boot: the page works (settings, tools panel) even if the SDK or the socket fails ----------

let tokenSource; // what the SDK asks a token of, before every connect and resume

async function boot() {
  try {
    sdk = await import(SDK_URL);
  } catch (err) {
    setConnection({ state: "closed", reconnects: 0 });
    banner.closed(`Could not load the browser SDK from ${SDK_URL}: ${err.message}`);
    throw err;
  }
  // The SDK asks for a token before every connect and resume: dev tokens are short-lived.
  let token;
  try {
    token = (await currentToken()) ?? undefined;
  } catch (err) {
    setConnection({ state: "closed", reconnects: 0 });
    banner.closed(`Could not get a token from /v1/dev/token: ${err.message}`);
    throw err;
  }
  if (token === undefined) {
    addNote("This gateway requires a client token: open the page with ?token=… (minted by your backend with POST /v1/sessions).", { kind: "warn" });
  }
  tokenSource = PAGE_TOKEN === null && token !== undefined ? async () => (await devToken()) ?? "" : token;
  const saved = loadSaved();
  if (saved) {
    // A reload: draw the conversation as it was and resume its session from there.
    restoreConversation(saved);
    const client = newClient();
    try {
      reloaded = true;
      await client.resume(saved.session, saved.last_seq);
      voice.onSession(saved.session);
      return client;
    } catch (err) {
      forget();
      clearConversation();
      banner.warn(`The previous conversation could not be resumed (${describeError(err)}): this is a new one.`);
    } finally {
      reloaded = false;
    }
  }
  return startSession();
}

/** Connect a new client and start a new session. */
async function startSession() {
  const client = newClient();
  try {
    await client.connect();
    const created = await client.start();
    // "*" may have delivered session.created already; otherwise handle the one start() returns.
    if (conv === client && !session && created) handleEvent({ type: "session.created", ...created });
  } catch (err) {
    if (conv !== client) throw err; // a new chat replaced it meanwhile
    setConnection({ state: "closed", reconnects: client.reconnects ?? 0 });
    banner.closed(`Could not start a session: ${describeError(err)}`);
    throw err;
  }
  return client;
}

/** A GatewayClient for this page; it becomes `conv`, and only its events are drawn. */
function newClient() {
  // Reconnect attempts back off up to 2 s: a page has one user, who is waiting.
  const client = new sdk.GatewayClient(WS_URL, { reconnect: true, token: tokenSource, maxReconnectDelay: 2000 });
  conv = client;
  registerClientFunctions();
  // Calls of tools marked confirm are asked on a card (with an SDK without onConfirm they expire).
  if (typeof client.onConfirm === "function") client.onConfirm(askUser);
  // Calls of widget tools (a choice, Yes / No, a form) are answered on a card too.
  if (typeof client.onWidget === "function") client.onWidget(answerWidget);
  const draw = (event) => { if (conv === client) handleEvent(event); };
  client.on("*", draw);
  // Newer than some SDKs, which hand it only to listeners that name it (seq de-duplicates).
  client.on("response.retrying", draw);
  // Voice: the microphone and the answers' audio follow this client; its voice events are drawn.
  voice.attach(client, sdk);
  for (const type of VOICE_EVENTS) client.on(type, draw);
  // A saved session the gateway refuses is not "over" for the user: a new one starts at once.
  client.on("connection", (change) => { if (conv === client && !(reloaded && change.state === "closed")) setConnection(change); });
  return client;
}

loadSettings();
applySettings();
bindChips();
bindSettings();
bindInspector();
bindComposer();
bindTabs();
bindNetwork();
renderPill();
loadAgent();
toolsPanel.load();
window.addEventListener("pagehide", saveConversation);
$("#new-chat").addEventListener("click", () => newChat());
// Ready to type at once, as in every chat (a touch screen shows no keyboard for it without a tap).
composer.focus({ preventScroll: true });
let ready = boot();
ready.catch(() => { /* said in the banner */ });
