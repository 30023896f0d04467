/**
 * @file The browser client SDK of the conversation gateway: one conversation over one
 * resilient WebSocket (protocol `gateway.v1`, see docs/protocol.md). It mirrors the Python
 * SDK (`client_sdk/client.py`): client functions, streamed replies, and a socket that
 * survives drops. Dependency-free ES modules with no build step: they run unchanged in
 * browsers, and in Node with an injected WebSocket class (`options.WebSocketImpl`). This
 * module is the entry: it re-exports the public API, which the app imports from here only.
 *
 * ```js
 * import { GatewayClient, SessionClosed } from "./gateway-client.js";
 *
 * const conv = new GatewayClient("ws://127.0.0.1:8000/v1/realtime");
 * conv.clientFunction("get_battery_level", async () => ({ level: 0.82, charging: false }), {
 *   description: "Read the device's battery level (0 to 1) and whether it is charging.",
 *   timeout: 15,
 * });
 * conv.on("connection", ({ state, reconnects }) => console.log(state, reconnects));
 * conv.on("tool.status", (event) => console.log(event.tool, event.status));
 *
 * await conv.connect();
 * for await (const delta of conv.say("what's my battery level?")) {
 *   output.textContent += delta;
 * }
 * await conv.close(); // code 1000: the gateway ends the session at once
 * ```
 *
 * - **Events.** `conv.on(type, listener)` receives every server event of that type (or of
 *   every known type with `"*"`), in order and once each: events are checked by `seq`, so a
 *   replay after a reconnect never hands a duplicate to the app. The connection-level events
 *   `session.resumed`, `session.attached`, `session.snapshot`, `session.going_away` and the
 *   `resume_gap` error (they have no `seq`) are delivered too. `conv.on("connection", ...)` reports the socket's state.
 * - **Client functions.** `conv.clientFunction(name, handler, options)` declares a function
 *   in `session.start` (or `session.update` when registered later). When the model calls
 *   it, `handler(args, { signal, call })` runs, concurrently with the other calls of the
 *   batch, and its value (or a Promise of it) is sent back as the result. A thrown error
 *   becomes an error result (`"TypeError: ..."`; a plain `Error`'s message alone); a handler
 *   still running at the call's deadline gets an error result too, and `signal` is aborted.
 *   Each call id runs once.
 * - **Manual tool mode.** With `toolMode: "manual"` (per session, or per message in `say()`
 *   and `post()`), every tool call the model asks for comes to the client, the gateway's
 *   server tools included (`tool.calls` with `kind: "server"`). `conv.onServerTool(handler)`
 *   decides: `handler(call, { signal })` returns the call's output (or a Promise of it),
 *   throws for an error result, or returns `RUN_ON_GATEWAY` (or `new RunOnGateway(args)`,
 *   edited arguments) to have the gateway run the tool (`tool.run`), whose outcome becomes
 *   the call's result. Without a handler every server-kind call runs on the gateway, as in
 *   auto mode. A server-kind call never goes to the client functions.
 * - **Confirmation.** A call of a tool marked `confirm` waits for the user's approval: the
 *   gateway sends `tool.confirm`, and `conv.onConfirm(handler)` asks the user:
 *   `handler(item, { signal })` returns `true` (approve), `false` (decline),
 *   `{ approved: true, args }` (approve with edited arguments) or
 *   `{ approved: false, reason }` (decline; the model hears why), or a Promise of one. It
 *   runs within the item's timeout (then `signal` aborts and the call is declined, saying
 *   so). Without a handler every such call is declined ("this client cannot ask the user"):
 *   the SDK never approves by itself.
 * - **Widgets.** A widget tool's call (`tool.calls` with a `widget`: a choice, a yes/no
 *   question or a form) is answered by the user. Unless a client function of its name is
 *   registered, `conv.onWidget(handler)` shows it: `handler(call, { signal })` returns the
 *   user's answer (`{ choice }`, `{ confirmed }` or the form's values), which is the call's
 *   output. A throw is an error result; `signal` aborts at the call's deadline, on close, or
 *   when a `tool.status` ends the call first (`cancelled`, `expired`, `failed`), and then nothing
 *   is sent. Without either handler the call gets the usual "no function" error result.
 * - **Reconnects.** A socket that drops with a code other than 1000, 1008, 4001, 4003, 4004, 4008
 *   or 4009 is resumed with exponential backoff and full jitter (50 ms, doubling, up to
 *   `maxReconnectDelay`). A first connect that fails, and a start whose socket drops before
 *   `session.created` (nothing is lost yet: `session.start` goes again on a new socket), are
 *   retried the same way. Each attempt must be answered within `attemptTimeout` of its dial
 *   (or its socket is closed with 4000 and it counts as failed); after `giveUpAfter` of
 *   failed attempts in a row the conversation ends with `SessionClosed` 1006 ("could not
 *   reach the gateway for 120 s"). `conv.retryNow()` cuts the wait between two attempts short
 *   (the browser is `online` again, the user clicked "Retry now"). `close()` between attempts
 *   ends the gateway's session all the same, with a short-lived socket. Results and `tool.run` requests the gateway has not
 *   confirmed, and user messages (options included) and `session.update` messages it has not
 *   answered, are sent again (the gateway applies each once), and so are `tool.confirmation`
 *   answers no `tool.status` (or `tool.calls`) has confirmed yet. Calls that opened while the
 *   client was away are run, and confirmations still open (`open_confirmations`) are asked,
 *   once each. When the gateway no longer has every missed event, pending `say()` iterators
 *   throw `ResumeGap`, whose `snapshot` holds the transcript to rebuild from. Every socket
 *   that resumes a session (a reconnect, `resume()`, the one `close()` ends it with) adds
 *   `session=<session_id>` to the URL's query (see `resumeUrl`), so that a load balancer
 *   routing by session (deploy/nginx.conf) sends it to the node that drives the session.
 * - **Going away.** `session.going_away` (the gateway will close the socket soon: it drains,
 *   the session moved to another node, or the socket reached its maximum age) reaches the
 *   listeners like any event. The SDK resumes on a second socket at once; when the gateway
 *   answers (`session.resumed`, delivered too), that socket is the session's and the first
 *   is closed with 4000, never 1000. Events come once each across the switch (by `seq`), the
 *   unconfirmed messages go again, `state` stays `open` and `reconnects` counts it. A refused
 *   early resume (a node going away closes new sockets with 1012, and a load balancer may
 *   send one there) is tried again with the reconnects' backoff for up to the notice's
 *   `time_left` (at least once). Meanwhile user messages (`say()`, `post()`) wait for the new
 *   socket, so no response starts on the node going away; tool results and the rest go at
 *   once. Should every attempt fail, whatever the close code, the first socket serves on
 *   (the held messages go on it then); when it closes, the usual reconnects follow.
 * - **Several devices.** A session may have several sockets, one per device: another device
 *   joins it with the `join: { sessionId, resumeToken }` option (the starter's
 *   `session.session_id` and `session.resume_token`); `start()` then sends `session.attach`
 *   with its client functions instead of `session.start`. Every device gets every event;
 *   the calls of a client function go to the devices that declared it, the first result
 *   wins, and a device still running a call another device answered (a `tool.status` ends
 *   it) stops it: its handler's `signal` aborts and nothing is sent. Each resume names this
 *   device (`conv.deviceId`) and its functions, so a reconnect never takes the others'
 *   sockets over; `close()` ends the session only on its last device (a device that joined
 *   and has no socket at the time just stops: no DELETE, which would end it for all).
 * - **Voice.** `audio` in the options (or `conv.setAudio(settings)` later) opts the session
 *   in to audio on the same socket. `conv.sendAudio(pcm16)` sends microphone audio as a binary
 *   frame (dropped while disconnected); the answer's audio comes as `audio` events
 *   (`{responseId, seq, offsetMs, last, pcm}`, not replayed after a resume).
 *   `commitAudio()`, `clearAudio()` and `truncateAudio(ms)` send `input_audio.commit`,
 *   `input_audio.clear` and `response.truncate`. microphone.js has the microphone
 *   (`MicrophoneCapture`) and player.js the player (`AudioPlayer`, wired with `attachAudio`).
 * - **Errors.** Everything the SDK throws derives from `ClientError`: `ServerError` (the
 *   gateway answered with an `error` event), `SessionClosed` (the session cannot go on),
 *   `ResumeGap` (events were lost across a reconnect).
 *
 * The modules, most mirroring the Python SDK's module of their name (each imports only
 * modules below it in this list):
 * - `client.js`: `GatewayClient` and `connect`, the public API and its documentation.
 * - `conversation.js`: the machinery behind it: start, resume, close; the session's events,
 *   each handed over once, in order, and what each settles.
 * - `options.js`: the client's options, a message's options, the session defaults.
 * - `resume.js`: the session's socket, and the reconnect loop that gets it another.
 * - `calls.js`: tool calls and confirmations, each handled once per call id.
 * - `functions.js`, `server-tools.js`, `confirm.js`, `widgets.js`: what answers a client
 *   function's call, a server tool's (manual mode), a confirmation, a widget.
 * - `handler.js`: an app's handler run within a deadline; its value as JSON.
 * - `outbox.js`: what was sent and not confirmed, to go again after a resume.
 * - `events.js`: the listeners of `on()`, the queues of `say()` and `events()`.
 * - `connection.js`: one socket: dialing, `resumeUrl`, sending, ending a session without one.
 * - `microphone.js`, `player.js`: voice: the microphone sent as binary frames
 *   (`MicrophoneCapture`, its worklet in `audio-worklets.js`), the answer's audio played
 *   (`AudioPlayer`, `attachAudio`).
 * - `audio.js`: the audio frames and samples (`parseAudioFrame`, `StreamResampler`...).
 * - `protocol.js`: the wire vocabulary (event types, subprotocols, decoding, message ids).
 * - `errors.js`: `ClientError` and its subclasses.
 *
 * @module gateway-client
 */

export { StreamResampler, floatTo16, int16ToFloat, parseAudioFrame, rms } from "./audio.js";
export { GatewayClient, connect } from "./client.js";
export { SESSION_PARAM, resumeUrl } from "./connection.js";
export { MicrophoneCapture } from "./microphone.js";
export { AudioPlayer, attachAudio } from "./player.js";
export { ClientError, ResumeGap, ServerError, SessionClosed } from "./errors.js";
export { SUBPROTOCOL, TOKEN_SUBPROTOCOL_PREFIX } from "./protocol.js";
export { RUN_ON_GATEWAY, RunOnGateway } from "./server-tools.js";

// The types the app names (`import("./gateway-client.js").ClientCall`), from where they live.
/** @typedef {import("./protocol.js").ToolInfo} ToolInfo */
/** @typedef {import("./protocol.js").Limits} Limits */
/** @typedef {import("./protocol.js").ClientCall} ClientCall */
/** @typedef {import("./protocol.js").WidgetField} WidgetField */
/** @typedef {import("./protocol.js").Widget} Widget */
/** @typedef {import("./protocol.js").ConfirmItem} ConfirmItem */
/** @typedef {import("./protocol.js").TranscriptEntry} TranscriptEntry */
/** @typedef {import("./protocol.js").Usage} Usage */
/** @typedef {import("./protocol.js").SessionCreated} SessionCreated */
/** @typedef {import("./protocol.js").SessionUpdated} SessionUpdated */
/** @typedef {import("./protocol.js").SessionResumed} SessionResumed */
/** @typedef {import("./protocol.js").SessionAttached} SessionAttached */
/** @typedef {import("./protocol.js").SessionGoingAway} SessionGoingAway */
/** @typedef {import("./protocol.js").JoinedSession} JoinedSession */
/** @typedef {import("./protocol.js").SessionSnapshot} SessionSnapshot */
/** @typedef {import("./protocol.js").AgentTransferred} AgentTransferred */
/** @typedef {import("./protocol.js").TextSegment} TextSegment */
/** @typedef {import("./protocol.js").ResponseTruncated} ResponseTruncated */
/** @typedef {import("./protocol.js").ResponseCreated} ResponseCreated */
/** @typedef {import("./protocol.js").ResponseRetrying} ResponseRetrying */
/** @typedef {import("./protocol.js").TextDelta} TextDelta */
/** @typedef {import("./protocol.js").TextDone} TextDone */
/** @typedef {import("./protocol.js").ToolCalls} ToolCalls */
/** @typedef {import("./protocol.js").ToolConfirm} ToolConfirm */
/** @typedef {import("./protocol.js").ToolStatus} ToolStatus */
/** @typedef {import("./protocol.js").ResponseDone} ResponseDone */
/** @typedef {import("./protocol.js").ErrorEvent} ErrorEvent */
/** @typedef {import("./protocol.js").Pong} Pong */
/** @typedef {import("./protocol.js").ServerEvent} ServerEvent */
/** @typedef {import("./connection.js").ConnectionState} ConnectionState */
/** @typedef {import("./connection.js").ConnectionEvent} ConnectionEvent */
/** @typedef {import("./functions.js").ToolSpec} ToolSpec */
/** @typedef {import("./functions.js").ClientFunctionOptions} ClientFunctionOptions */
/** @typedef {import("./functions.js").ClientFunctionHandler} ClientFunctionHandler */
/** @typedef {import("./server-tools.js").ServerToolHandler} ServerToolHandler */
/** @typedef {import("./confirm.js").ConfirmAnswer} ConfirmAnswer */
/** @typedef {import("./confirm.js").ConfirmHandler} ConfirmHandler */
/** @typedef {import("./widgets.js").WidgetHandler} WidgetHandler */
/** @typedef {import("./options.js").ToolMode} ToolMode */
/** @typedef {import("./options.js").GatewayClientOptions} GatewayClientOptions */
/** @typedef {import("./options.js").JoinOptions} JoinOptions */
/** @typedef {import("./options.js").MessageOptions} MessageOptions */
/** @typedef {import("./options.js").SessionDefaults} SessionDefaults */
/** @typedef {import("./audio.js").AudioFrame} AudioFrame */
