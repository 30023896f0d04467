"""Gemini Live (``BidiGenerateContent``, v1beta) behind the ``Upstream`` interface.

One WebSocket per session, camelCase JSON both ways (the service answers in binary frames;
text frames are read too). What maps to what:

=====================================================  ========================================
gateway -> Gemini                                      how
=====================================================  ========================================
``open(setup)``                                        ``setup`` (model, voice, instructions,
                                                       tools, both transcriptions, VAD silence,
                                                       ``sessionResumption``), wait for
                                                       ``setupComplete``; then the history as
                                                       one ``clientContent`` (``turnComplete``
                                                       false), unless a handle resumes it
``send_audio`` / ``commit_audio``                      ``realtimeInput.audio`` (16 kHz) /
                                                       ``realtimeInput.audioStreamEnd``
``send_user_text``, ``send_context`` + ``respond``     buffered, then one ``clientContent``
                                                       with ``turnComplete`` true (nothing
                                                       buffered: a bare ``turnComplete``; right
                                                       after tool outputs: nothing at all)
``send_tool_output``                                   ``toolResponse.functionResponses``
=====================================================  ========================================

=====================================================  ========================================
Gemini -> gateway                                      event
=====================================================  ========================================
``serverContent.inputTranscription``                   gathered; ``UserTranscript`` when the
                                                       model's turn starts (or completes)
first ``modelTurn`` / ``outputTranscription``          ``TurnStarted``
``modelTurn.parts[].inlineData`` (audio/pcm)           ``AudioDelta`` (24 kHz)
``outputTranscription.text``, ``parts[].text``         ``TextDelta``
``toolCall.functionCalls[]``                           ``CallRequested`` each, then
                                                       ``TurnDone("completed")``: Gemini waits
                                                       for the outputs, then starts a new turn
``serverContent.interrupted``                          ``SpeechStarted`` (at the audio sent so
                                                       far; not when ``respond`` cut the turn),
                                                       ``TurnDone("cancelled")``
``serverContent.turnComplete`` (+ ``usageMetadata``)   ``TurnDone("completed", usage)``
``toolCallCancellation.ids``                           ``CallsCancelled``
``goAway.timeLeft``                                    ``GoingAway``
``sessionResumptionUpdate`` (resumable)                ``Resumable``
``error`` (aimock; the real service closes instead)    ``TurnDone("failed")`` in a turn, else
                                                       logged
the socket closing                                     ``Closed`` (``expired`` after a
                                                       ``goAway``), and ``events`` ends
=====================================================  ========================================

What Gemini cannot do, so these are no-ops: ``clear_audio`` (its VAD owns the audio it got),
``cancel`` (there is no response.cancel: a response ends when the user speaks over it or a new
``clientContent`` arrives), ``truncate`` (it keeps what it generated, heard or not). It sends
no speech started/stopped events and no commit: the only ``SpeechStarted`` is the one an
interruption implies. Gemini answers the user's speech by itself (its VAD ends the turn):
``respond`` is for text and context; after tool outputs it goes on by itself too.
"""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import AsyncIterator, Iterable
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import msgspec
import structlog
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from gateway.core.transcript import (
    AssistantTurn,
    ContextNote,
    Item,
    ToolOutcome,
    UserTurn,
    completion_note,
)
from gateway.errors import ProviderError
from gateway.providers.realtime.upstream import (
    AudioDelta,
    CallRequested,
    CallsCancelled,
    Closed,
    GoingAway,
    Resumable,
    SpeechStarted,
    TextDelta,
    TurnDone,
    TurnStarted,
    UpstreamEvent,
    UpstreamSetup,
    UpstreamUsage,
    UserTranscript,
)

__all__ = ["DEFAULT_URL", "GeminiLiveUpstream", "history_turns"]

DEFAULT_URL = (
    "wss://generativelanguage.googleapis.com/ws/"
    "google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent"
)

JSON = dict[str, Any]

log = structlog.get_logger("gateway.providers.realtime")

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*s?\s*$")


class GeminiLiveUpstream:
    """One Gemini Live session; see the module docstring for the mapping."""

    input_rate = 16000
    output_rate = 24000
    answers_speech = True  # its VAD ends the turn and the model answers it

    def __init__(
        self, *, url: str, model: str, api_key: str | None, connect_timeout: float = 10.0
    ) -> None:
        self.url = url
        self.model = model if model.startswith("models/") else f"models/{model}"
        self._api_key = api_key
        self.connect_timeout = connect_timeout
        self._ws: ClientConnection | None = None
        self._gone = False
        # What respond() sends: the user's texts and context notes since the last one.
        self._buffered: list[JSON] = []
        self._calls_answered = False
        self._issued: set[str] = set()
        """The calls this session asked for (their outputs go as ``toolResponse``)."""
        self._cancelled: set[str] = set()
        self._audio_bytes_sent = 0
        # The state of the model's turn, for the events Gemini leaves implicit.
        self._heard: list[str] = []
        self._turn_running = False
        self._response_asked = False
        # respond() during a turn: Gemini interrupts it for the new content, no one spoke.
        self._client_interrupts = False
        # TurnDone went out at a toolCall or an interruption: a bare turnComplete that
        # follows belongs to that turn, not to a new one.
        self._turn_ended_early = False
        self._usage: UpstreamUsage | None = None
        self._going_away = False

    # ----------------------------------------------------------------------- the socket

    async def open(self, setup: UpstreamSetup) -> None:
        try:
            self._ws = await connect(
                self._url_with_key(),
                open_timeout=self.connect_timeout,
                max_size=None,  # a model turn's audio chunk can be large
            )
        except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as failure:
            raise ProviderError(f"Gemini Live: cannot connect: {self._redact(failure)}") from None
        try:
            await self._send({"setup": self._setup_message(setup)})
            await self._wait_setup_complete()
            if setup.history and not setup.resume_handle:
                turns = history_turns(setup.history)
                if turns:
                    await self._send({"clientContent": {"turns": turns, "turnComplete": False}})
        except ProviderError:
            await self.aclose()
            raise
        log.info(
            "realtime_upstream_opened",
            provider="gemini",
            model=self.model,
            resumed=setup.resume_handle is not None,
            seeded=len(setup.history) if not setup.resume_handle else 0,
        )

    def _url_with_key(self) -> str:
        if not self._api_key:
            return self.url
        parts = urlsplit(self.url)
        query = [*parse_qsl(parts.query), ("key", self._api_key)]
        return urlunsplit(parts._replace(query=urlencode(query)))

    def _redact(self, failure: Exception) -> str:
        """The failure's text without the API key (a bad URI error quotes the whole URL)."""
        text = str(failure) or type(failure).__name__
        return text.replace(self._api_key, "***") if self._api_key else text

    def _setup_message(self, setup: UpstreamSetup) -> JSON:
        generation: JSON = {"responseModalities": ["AUDIO"]}
        if setup.voice:
            generation["speechConfig"] = {
                "voiceConfig": {"prebuiltVoiceConfig": {"voiceName": setup.voice}}
            }
        message: JSON = {"model": self.model, "generationConfig": generation}
        if setup.instructions:
            message["systemInstruction"] = {"parts": [{"text": setup.instructions}]}
        if setup.tools:
            message["tools"] = [
                {"functionDeclarations": [_declaration(tool) for tool in setup.tools]}
            ]
        message["inputAudioTranscription"] = {}
        message["outputAudioTranscription"] = {}
        message["realtimeInputConfig"] = {
            "automaticActivityDetection": {"silenceDurationMs": setup.silence_ms}
        }
        # Always asked for, so the service sends handles a replacement socket can resume with.
        resumption: JSON = {}
        if setup.resume_handle:
            resumption["handle"] = setup.resume_handle
        message["sessionResumption"] = resumption
        return message

    async def _wait_setup_complete(self) -> None:
        ws = self._socket()
        try:
            async with asyncio.timeout(self.connect_timeout):
                while True:
                    message = _decode(await ws.recv())
                    if message is None:
                        continue
                    if "setupComplete" in message:
                        return
                    if "error" in message:
                        raise ProviderError(f"Gemini Live refused the setup: {message['error']}")
                    log.warning("gemini_message_before_setup", keys=sorted(message))
        except TimeoutError:
            raise ProviderError("Gemini Live: no setupComplete in time") from None
        except ConnectionClosed as closed:
            raise ProviderError(f"Gemini Live closed at setup: {_close_text(closed)}") from None

    async def aclose(self) -> None:
        self._gone = True
        if self._ws is not None:
            await self._ws.close()

    # ------------------------------------------------------------------ what the model says

    async def events(self) -> AsyncIterator[UpstreamEvent]:
        ws = self._socket()
        while True:
            try:
                frame = await ws.recv()
            except ConnectionClosed as closed:
                reason = _close_text(closed)
                break
            message = _decode(frame)
            if message is None:
                continue
            for event in self._translate(message):
                yield event
        self._gone = True
        log.info("realtime_upstream_closed", provider="gemini", reason=reason)
        yield Closed(reason, expired=self._going_away)

    def _translate(self, message: JSON) -> list[UpstreamEvent]:
        """The events of one server message (a message may carry usage beside its content)."""
        events: list[UpstreamEvent] = []
        if isinstance(usage := message.get("usageMetadata"), dict):
            self._usage = _usage(usage)
        if isinstance(content := message.get("serverContent"), dict):
            events += self._on_content(content)
        if isinstance(tool_call := message.get("toolCall"), dict):
            events += self._on_tool_call(tool_call)
        if isinstance(cancellation := message.get("toolCallCancellation"), dict):
            ids = tuple(str(i) for i in cancellation.get("ids") or ())
            self._cancelled.update(ids)
            events.append(CallsCancelled(ids))
        if isinstance(go_away := message.get("goAway"), dict):
            self._going_away = True
            events.append(GoingAway(_seconds(go_away.get("timeLeft"))))
        if isinstance(update := message.get("sessionResumptionUpdate"), dict):
            if update.get("resumable") and update.get("newHandle"):
                events.append(Resumable(str(update["newHandle"])))
        if "error" in message:
            events += self._on_error(message["error"])
        return events

    def _on_content(self, content: JSON) -> list[UpstreamEvent]:
        events: list[UpstreamEvent] = []
        heard = (content.get("inputTranscription") or {}).get("text")
        if heard:
            self._heard.append(str(heard))
        parts = (content.get("modelTurn") or {}).get("parts") or []
        said = (content.get("outputTranscription") or {}).get("text")
        if parts or said:
            events += self._start_turn()
        for part in parts:
            blob = part.get("inlineData") or {}
            if str(blob.get("mimeType", "")).startswith("audio/pcm") and blob.get("data"):
                events.append(AudioDelta(base64.b64decode(blob["data"])))
            elif part.get("text") and not part.get("thought"):  # text-only models
                events.append(TextDelta(str(part["text"])))
        if said:
            events.append(TextDelta(str(said)))
        if content.get("interrupted"):
            if not self._client_interrupts:
                # The user spoke over the model: Gemini's only sign that its VAD heard speech.
                events.append(SpeechStarted(self._audio_ms_sent()))
            self._client_interrupts = False
            events += self._end_turn("cancelled")
        if content.get("turnComplete"):
            events += self._user_transcript()
            if not self._turn_ended_early or self._turn_running:
                events += self._end_turn("completed")
            # else: the trailing turnComplete of a turn that ended at its toolCall or its
            # interruption (aimock sends one after a toolCall): that turn is done already.
            self._turn_ended_early = self._client_interrupts = False
            self._usage = None
        return events

    def _on_tool_call(self, tool_call: JSON) -> list[UpstreamEvent]:
        events = self._start_turn()
        for call in tool_call.get("functionCalls") or []:
            name = str(call.get("name", ""))
            call_id = str(call.get("id") or name)
            args = call.get("args")
            if args is None:
                args = {}
            self._issued.add(call_id)
            if isinstance(args, dict):
                events.append(CallRequested(call_id, name, args))
            else:
                events.append(
                    CallRequested(call_id, name, {}, args_error=f"not an object: {args!r}")
                )
        # Gemini waits for every output, then answers in a new model turn.
        return events + self._end_turn("completed")

    def _on_error(self, error: Any) -> list[UpstreamEvent]:
        text = str(error.get("message") or error) if isinstance(error, dict) else str(error)
        if self._turn_running or self._response_asked:
            return self._end_turn("failed", error=text)
        log.warning("gemini_error", provider="gemini", error=text)
        return []

    def _start_turn(self) -> list[UpstreamEvent]:
        if self._turn_running:
            return []
        events = self._user_transcript()
        self._turn_running, self._response_asked, self._turn_ended_early = True, False, False
        return [*events, TurnStarted()]

    def _end_turn(self, status: str, *, error: str | None = None) -> list[UpstreamEvent]:
        """``TurnDone`` for the turn running (one asked for but silent so far is started
        first, so every ``TurnDone`` has its ``TurnStarted``); nothing if none is."""
        if not (self._turn_running or self._response_asked):
            return []
        events = self._start_turn()
        events.append(TurnDone(status, usage=self._usage, error=error))
        self._turn_running, self._turn_ended_early, self._usage = False, True, None
        return events

    def _user_transcript(self) -> list[UpstreamEvent]:
        text, self._heard = "".join(self._heard).strip(), []
        return [UserTranscript(text)] if text else []

    def _audio_ms_sent(self) -> int:
        return self._audio_bytes_sent * 1000 // (2 * self.input_rate)

    # --------------------------------------------------------------- what the gateway says

    async def send_audio(self, pcm: bytes) -> None:
        audio = {"data": base64.b64encode(pcm).decode("ascii"), "mimeType": "audio/pcm;rate=16000"}
        await self._send({"realtimeInput": {"audio": audio}})
        self._audio_bytes_sent += len(pcm)

    async def commit_audio(self) -> None:
        """The audio stream paused: Gemini ends the user's turn now instead of waiting."""
        await self._send({"realtimeInput": {"audioStreamEnd": True}})

    async def clear_audio(self) -> None:
        """No-op: Gemini has no input buffer to clear (its VAD owns what it heard)."""
        self._socket_alive()

    async def send_user_text(self, text: str) -> None:
        self._socket_alive()
        self._buffer({"text": text})

    async def send_context(self, text: str) -> None:
        self._socket_alive()
        self._buffer({"text": _as_context(text)})

    def _buffer(self, part: JSON) -> None:
        if self._buffered:
            self._buffered[0]["parts"].append(part)
        else:
            self._buffered.append({"role": "user", "parts": [part]})

    async def send_tool_output(self, call_id: str, name: str, output: Any) -> None:
        if call_id in self._cancelled:
            # Gemini withdrew the call (toolCallCancellation): an output would be a new input.
            log.info("gemini_output_of_cancelled_call_dropped", call_id=call_id, name=name)
            self._socket_alive()
            return
        if call_id not in self._issued:
            # A call of an earlier session, given as history (its call as a note, open):
            # this one never asked for it, so its outcome goes as context, with a turn.
            self._socket_alive()
            self._buffer({"text": completion_note(name, output=output)})
            return
        response = output if isinstance(output, dict) else {"output": output}
        reply = {"id": call_id, "name": name, "response": response}
        await self._send({"toolResponse": {"functionResponses": [reply]}})
        self._calls_answered = True

    async def respond(self) -> None:
        """Send the buffered texts as one user turn and ask for an answer. With nothing
        buffered right after tool outputs, nothing: Gemini goes on by itself after them.
        With nothing buffered otherwise, a bare ``turnComplete`` asks for an answer to what
        the conversation holds."""
        if not self._buffered and self._calls_answered:
            self._calls_answered = False
            self._socket_alive()
            return
        turns, self._buffered = self._buffered, []
        content: JSON = {"turns": turns, "turnComplete": True} if turns else {"turnComplete": True}
        await self._send({"clientContent": content})
        self._calls_answered = False
        self._response_asked = True
        self._client_interrupts = self._turn_running

    async def cancel(self) -> None:
        """No-op: Gemini has no response.cancel (a response stops when the user speaks over
        it, or when new ``clientContent`` arrives)."""
        self._socket_alive()

    async def truncate(self, audio_end_ms: int) -> None:
        """No-op: Gemini keeps what it generated in its context, heard or not."""
        self._socket_alive()

    async def _send(self, message: JSON) -> None:
        ws = self._socket_alive()
        try:
            # Text frames: the service takes both, and aimock ignores binary ones.
            await ws.send(msgspec.json.encode(message).decode())
        except ConnectionClosed as closed:
            self._gone = True
            raise ProviderError(f"Gemini Live socket closed: {_close_text(closed)}") from None

    def _socket(self) -> ClientConnection:
        if self._ws is None:
            raise ProviderError("Gemini Live: open() first")
        return self._ws

    def _socket_alive(self) -> ClientConnection:
        ws = self._socket()
        if self._gone:
            raise ProviderError("Gemini Live socket is closed")
        return ws


# ----------------------------------------------------------------------------- helpers


def _declaration(tool: dict[str, Any]) -> JSON:
    declaration: JSON = {"name": tool["name"]}
    if tool.get("description"):
        declaration["description"] = tool["description"]
    if tool.get("parameters"):
        declaration["parameters"] = tool["parameters"]
    return declaration


def _as_context(text: str) -> str:
    """Context the model should read as such (completion notes come wrapped already)."""
    return text if text.startswith("<context>") else f"<context>{text}</context>"


def history_turns(items: Iterable[Item]) -> list[JSON]:
    """The conversation as Gemini ``turns``, consecutive same-role contents merged.

    A call answered in the history goes as a ``functionCall`` part of its model turn and a
    ``functionResponse`` part of the next user turn; a call without its outcome, or an
    outcome without its call, as a text note (Gemini wants the two paired).
    """
    items = list(items)
    asked = {c.call_id for i in items if isinstance(i, AssistantTurn) for c in i.calls}
    answered = {i.call_id for i in items if isinstance(i, ToolOutcome)}
    paired = asked & answered
    turns: list[JSON] = []

    def add(role: str, part: JSON) -> None:
        if part.get("text") == "":
            return  # Gemini refuses empty text parts
        if turns and turns[-1]["role"] == role:
            turns[-1]["parts"].append(part)
        else:
            turns.append({"role": role, "parts": [part]})

    for item in items:
        match item:
            case UserTurn(text=text):
                add("user", {"text": text})
            case ContextNote(text=text):
                add("user", {"text": _as_context(text)})
            case AssistantTurn(text=text, calls=calls):
                add("model", {"text": text})
                for call in calls:
                    if call.call_id in paired:
                        add(
                            "model",
                            {
                                "functionCall": {
                                    "id": call.call_id,
                                    "name": call.name,
                                    "args": call.args,
                                }
                            },
                        )
                    else:
                        args = msgspec.json.encode(call.args).decode()
                        add("model", {"text": f"(I called {call.name} with {args}.)"})
            case ToolOutcome(call_id=call_id, name=name, output=output, error=error):
                if call_id in paired:
                    response = {"error": error} if error is not None else output
                    if not isinstance(response, dict):
                        response = {"output": response}
                    reply = {"id": call_id, "name": name, "response": response}
                    add("user", {"functionResponse": reply})
                else:
                    add("user", {"text": completion_note(name, output=output, error=error)})
    return turns


def _decode(frame: str | bytes) -> JSON | None:
    try:
        message = msgspec.json.decode(frame)
    except msgspec.DecodeError:
        log.warning("gemini_unreadable_frame", provider="gemini", size=len(frame))
        return None
    if not isinstance(message, dict):
        log.warning("gemini_unexpected_frame", provider="gemini", kind=type(message).__name__)
        return None
    return message


def _usage(metadata: JSON) -> UpstreamUsage:
    """Token counts by modality (other modalities, images and video, are not counted)."""

    def by_modality(details: Any) -> dict[str, int]:
        counts: dict[str, int] = {}
        for detail in details if isinstance(details, list) else []:
            modality = str(detail.get("modality", "")).upper()
            counts[modality] = counts.get(modality, 0) + int(detail.get("tokenCount") or 0)
        return counts

    prompt = by_modality(metadata.get("promptTokensDetails"))
    reply = by_modality(metadata.get("responseTokensDetails"))
    if not prompt:  # no breakdown: all counted as text
        prompt = {"TEXT": int(metadata.get("promptTokenCount") or 0)}
    if not reply:
        reply = {"TEXT": int(metadata.get("responseTokenCount") or 0)}
    return UpstreamUsage(
        input_text_tokens=prompt.get("TEXT", 0),
        input_audio_tokens=prompt.get("AUDIO", 0),
        output_text_tokens=reply.get("TEXT", 0),
        output_audio_tokens=reply.get("AUDIO", 0),
    )


def _seconds(time_left: Any) -> float:
    """A protobuf ``Duration`` as JSON (``"50s"``, ``"0.200s"``), or its object form."""
    if isinstance(time_left, int | float):
        return float(time_left)
    if isinstance(time_left, dict):
        return float(time_left.get("seconds") or 0) + float(time_left.get("nanos") or 0) / 1e9
    found = _DURATION.match(str(time_left or ""))
    return float(found.group(1)) if found else 0.0


def _close_text(closed: ConnectionClosed) -> str:
    if closed.rcvd is None:
        return "connection lost"
    return f"{closed.rcvd.code} {closed.rcvd.reason}".strip()
