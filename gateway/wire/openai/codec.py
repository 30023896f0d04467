"""OpenAI Realtime (GA event names), text, audio and function calls, as a codec of the core.

Pure: no I/O, no clock. One ``OpenAIRealtimeCodec`` per socket of
``/v1/openai/realtime`` (``gateway.edge.openai_endpoint``) keeps what the OpenAI protocol
needs and v1 has not: item ids and output indexes, the OpenAI responses of each core
response, which client function a ``call_id`` is, the user items waiting for
``response.create``. The events are read in ``gateway.wire.openai.inbound`` and written in
``gateway.wire.openai.frames``; ``docs/openai-compat.md`` has the mapping, event by event.

Two things differ in shape. A core response that calls client functions goes on by
itself once their results are in, while an OpenAI client waits for ``response.done``
before it sends ``function_call_output``: so the codec ends the OpenAI response after
the calls, and the core response's next output opens a new one (mapped to the same core
response). And server tools, which the client need not run, appear as conversation
items only, never as a response's output that an SDK would run.

Audio (``output_modalities: ["audio"]``) runs on the session's own voice pipeline: the
client's base64 audio goes to the core as v1's binary frames would, the answer's audio frames
come back as ``response.output_audio.delta`` events, and an item's closing events wait for the
end of its audio (``gateway.wire.openai.audio``).

One extension, which unmodified clients never send: ``"gateway": {"segments": true}`` in
the session object turns on v1's ``text.segment`` events, sent as
``response.output_text.segment`` with the ids of the deltas of the same text (an event
type the ``openai`` SDK yields without failing).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from itertools import count
from typing import Any, cast

import msgspec

from gateway.wire.audio_frame import AnswerAudio, decode_answer_audio
from gateway.wire.codec import Decoded
from gateway.wire.openai.audio import (
    G711,
    Converter,
    Converters,
    OutputOrder,
    SessionAudio,
    Wait,
    audio_update,
    chunked,
    decode_audio,
)
from gateway.wire.openai.frames import (
    PENDING_OUTPUT,
    Frames,
    call_item,
    message_item,
    output_item,
    response_body,
    to_json,
)
from gateway.wire.openai.inbound import (
    AudioAppend,
    AudioClear,
    AudioCommit,
    ClientEvent,
    ItemCreate,
    ItemTruncate,
    Refused,
    ResponseCancel,
    ResponseCreate,
    SessionUpdate,
    decode_event,
    output_value,
    response_options,
    session_update,
    user_texts,
    why_invalid,
)
from gateway.wire.v1 import (
    AudioDone,
    AudioFlush,
    DecodeFailure,
    Error,
    Inbound,
    InputAudioClear,
    InputAudioCleared,
    InputAudioCommit,
    InputSpeechStarted,
    InputSpeechStopped,
    InputTranscript,
    ResponseCreated,
    ResponseDone,
    ResponseTruncated,
    ServerMsg,
    SessionCreated,
    SessionUpdated,
    TextDelta,
    TextDone,
    TextSegment,
    ToolCalls,
    ToolResult,
    ToolResults,
    ToolStatus,
    UserMessage,
)
from gateway.wire.v1 import ResponseCancel as CoreCancel
from gateway.wire.v1 import ResponseTruncate as CoreTruncate

__all__ = ["CHARS_PER_SECOND", "OpenAIRealtimeCodec"]

CHARS_PER_SECOND = 15
"""The speaking rate that turns ``conversation.item.truncate``'s ``audio_end_ms`` into
characters of text heard (about 150 words a minute), since no audio was played."""

_SERVER_CODES = frozenset(
    {
        "provider_error",
        "response_interrupted",
        "max_steps_exceeded",
        "store_unavailable",
        "speech_failed",
    }
)
"""v1 error codes that are the gateway's or the model's doing, not the client's."""
_COMMIT = "input_audio_buffer.commit"
"""What a core ``input_audio.commit`` asked, to undo its effects when the core refuses it."""
_TERMINAL = frozenset({"completed", "failed", "cancelled", "expired"})

_Messages = list[Inbound | DecodeFailure | bytes]
_Out = list[bytes | Wait]
_UNORDERED = (
    InputSpeechStarted,
    InputSpeechStopped,
    InputTranscript,
    InputAudioCleared,
    AudioFlush,
    AudioDone,
    Error,
    SessionCreated,
    SessionUpdated,
    ResponseTruncated,
)
"""Events that belong to no response: their frames never wait for a response's audio."""


@dataclass(slots=True)
class _Response:
    """An OpenAI response: a core response has one, or several when it calls client
    functions (each batch of calls ends one)."""

    id: str
    output: list[dict[str, Any]] = field(default_factory=list)


@dataclass(slots=True, eq=False)  # by identity: items are kept in sets
class _Text:
    """An assistant message item: one model step's text."""

    item_id: str
    output_index: int
    offset: int
    """Characters of the core response's text before this item (``response.truncate``
    counts from the start of the response)."""
    response: _Response
    core: str
    """The core response it is part of."""
    pieces: list[str] = field(default_factory=list)
    chars: int = 0
    segments: set[int] = field(default_factory=set)
    """Spoken: the ``seq`` of its segments whose audio is still coming."""
    segments_spoken: bool = False
    """It is spoken: its segments' audio comes (or came) in frames."""
    audio_start_ms: int | None = None
    """Spoken: where its audio starts in the core response's (its first frame)."""
    item: dict[str, Any] | None = None
    """Once closed: the item, as ``response.output`` holds it."""
    wait: Wait | None = None
    """Closed while its audio is still coming: its closing events, made when it ends."""


def _counter_ids() -> Callable[[str], str]:
    numbers = count(1)
    return lambda prefix: f"{prefix}_{next(numbers)}"


class OpenAIRealtimeCodec:
    """See the module docstring.

    Args:
        model: reported back in the session object (the gateway's agent answers,
            whatever it says).
        new_id: makes the ids of items and of the extra responses (``item_...``).
        max_pending_chars: the most characters of user text that may wait for
            ``response.create`` (the gateway's ``max_message_chars``).
        call_args: the arguments of a server tool's call, by ``call_id`` (v1's
            ``tool.status`` does not carry them); ``None`` when unknown.
        converters: G.711 to and from PCM16 (``gateway.voice.g711.converter``); ``None``:
            the gateway cannot convert, and a session may ask for PCM only.
    """

    def __init__(
        self,
        *,
        model: str,
        new_id: Callable[[str], str] | None = None,
        max_pending_chars: int = 32_000,
        call_args: Callable[[str], dict[str, Any] | None] = lambda _: None,
        converters: Converters | None = None,
    ) -> None:
        self.model = model
        self.call_args = call_args
        self._converters = converters
        self._new_id = new_id or _counter_ids()
        self._max_pending_chars = max_pending_chars
        self._frames = Frames()
        self._session_id: str | None = None
        self._held: list[bytes] = []
        """Answers to frames read before ``session.created``: they go out after it."""
        self._config: dict[str, Any] = {
            "instructions": "",
            "tools": [],
            "tool_choice": "auto",
            "gateway": {"segments": False},
        }
        """What the client configured, as the session object reports it (``gateway``:
        the gateway's own options, not in OpenAI's protocol)."""
        self._asked: dict[str, tuple[str | None, Any]] = {}
        """Core messages whose answer needs more than their id, by the id given to the
        core: the client's ``event_id`` and what to answer with."""
        self._own_ids = count(1)
        self._pending: list[str] = []
        self._pending_chars = 0
        self._continue_due = False
        """Function outputs came since the last ``response.create``: the next one asks
        for the core response that goes on by itself."""
        self._last_item: str | None = None
        self._core: str | None = None
        """The running core response."""
        self._core_spoken = False
        """It speaks (the session's audio was on when it began)."""
        self._latest_core: str | None = None
        self._core_chars = 0
        self._response: _Response | None = None
        self._text: _Text | None = None
        self._openai_ids: dict[str, str] = {}
        """The OpenAI response ids of the running core response, to the core's."""
        self._latest_items: dict[str, _Text] = {}
        """The assistant messages of the latest core response (only it can be truncated)."""
        self._failure: dict[str, Any] | None = None
        self._client_calls: dict[str, str] = {}
        """Client-function calls not settled yet: ``call_id`` to the function's name."""
        self._server_calls: dict[str, str] = {}
        self._async_calls: dict[str, str] = {}
        # Audio (gateway.wire.openai.audio)
        self._voices: tuple[str, ...] = ()
        self._audio = SessionAudio()
        """The session's audio as the core confirmed it."""
        self._audio_asked = self._audio
        """As the latest ``session.update`` asked: the client's audio is read by it."""
        self._order = OutputOrder()
        self._made_wait = False
        self._early: list[AnswerAudio] = []
        """Audio of the running response that came before any of its text."""
        self._segments: dict[int, _Text] = {}
        """Spoken segments whose audio is still coming, by ``seq``, to their item."""
        self._converted: dict[tuple[str, bool], Converter] = {}
        """G.711 converters in use, by law and direction (inbound or not)."""
        self._user_item: str | None = None
        """The item of the user's spoken turn in progress (speech started)."""
        self._speech_ms = [0, 0]
        """Where the user's speech in this turn started and stopped, in ms of their audio."""
        self._transcribing: str | None = None
        """The item of the user's turn committed and not yet transcribed."""
        self._turn_due = False
        """A spoken turn was committed: the core answers it by itself, so the client's
        ``response.create`` after it asks for that answer."""
        self._create_absorbed = False
        """A ``response.create`` was taken as asking for the committed turn's answer."""
        self._interrupted: set[str] = set()
        """Core responses the user spoke over (a barge-in): they end ``turn_detected``."""

    # ----------------------------------------------------------------- client -> core

    def decode(self, text: str) -> Decoded:
        """See ``gateway.wire.codec.Codec.decode``."""
        try:
            event = decode_event(text)
        except msgspec.ValidationError as exc:
            event_id, refused = why_invalid(text, str(exc))
            return self._reply([], [self._refusal(event_id, refused)])
        except (msgspec.DecodeError, RecursionError) as exc:
            refused = Refused("invalid_message", f"invalid JSON: {exc or 'nested too deeply'}")
            return self._reply([], [self._refusal(None, refused)])
        try:
            return self._reply(*self._take(event))
        except Refused as refused:
            return self._reply([], [self._refusal(event.event_id, refused)])

    def _reply(self, messages: _Messages, frames: list[bytes]) -> Decoded:
        if self._session_id is None:
            self._held += frames
            return Decoded(messages, [])
        return Decoded(messages, frames)

    def _refusal(self, event_id: str | None, refused: Refused) -> bytes:
        return self._frames.error(event_id, "invalid_request_error", refused.code, refused.message)

    def _take(self, event: ClientEvent) -> tuple[_Messages, list[bytes]]:
        match event:
            case ItemCreate():
                return self._item_create(event)
            case ResponseCreate():
                return self._response_create(event)
            case SessionUpdate():
                update, changes = session_update(event)
                audio, update.audio = audio_update(
                    self._audio_asked,
                    event.session.output_modalities,
                    event.session.audio,
                    voices=self._voices,
                    g711=self._converters is not None,
                )
                if audio != self._audio_asked:
                    self._audio_asked = changes["audio"] = audio
                update.id = self._ask(event.event_id, changes)
                return [update], []
            case ResponseCancel(response_id=None):
                return [CoreCancel(id=event.event_id)], []
            case ResponseCancel(response_id=str(openai_id)):
                core = self._openai_ids.get(openai_id)
                # Not running (any more): nothing to cancel, and no error, as in v1.
                return ([CoreCancel(id=event.event_id, response_id=core)] if core else []), []
            case ItemTruncate():
                return [self._truncate(event)], []
            case AudioAppend():
                return self._append(event), []
            case AudioCommit():
                self._audio_on()
                # Committed once the core has the turn: at the end of the speech it cut
                # (speech_stopped), or with its transcript (manual turns).
                self._turn_due = True
                return [InputAudioCommit(id=self._ask(event.event_id, _COMMIT))], []
            case AudioClear():
                self._audio_on()
                return [InputAudioClear(id=self._ask(event.event_id, None))], []
        raise AssertionError(f"unhandled event {event!r}")  # every decoded type is above

    def _item_create(self, event: ItemCreate) -> tuple[_Messages, list[bytes]]:
        item = event.item
        item_id = item.id or self._new_id("item")
        if item.type == "message" and item.role == "user":
            texts = user_texts(item)
            text = "\n".join(texts)
            if self._pending_chars + len(text) > self._max_pending_chars:
                limit = self._max_pending_chars
                why = f"the user text waiting for response.create would pass {limit} characters"
                raise Refused("message_too_large", why)
            self._pending.append(text)
            self._pending_chars += len(text)
            parts = [{"type": "input_text", "text": t} for t in texts]
            return [], self._item(message_item(item_id, "user", "completed", parts))
        if item.type == "function_call_output":
            if item.call_id is None or item.output is None:
                raise Refused("invalid_message", "a function_call_output needs call_id and output")
            tool = self._client_calls.get(item.call_id)
            self._continue_due |= tool is not None
            # An unknown call is the core's to refuse (unknown_call).
            result = ToolResult(call_id=item.call_id, tool=tool or "", output=output_value(item))
            echoed = self._item(output_item(item_id, item.call_id, item.output))
            return [ToolResults(id=event.event_id, results=[result])], echoed
        kind = f"{item.role} message" if item.type == "message" else item.type
        why = "send user messages and function_call_output items"
        raise Refused("unsupported", f"items of type {kind!r} cannot be created: {why}")

    def _response_create(self, event: ResponseCreate) -> tuple[_Messages, list[bytes]]:
        choice, tools = response_options(event.response)
        asked = event.response.output_modalities if event.response is not None else None
        if asked is not None and asked != self._audio_asked.modalities:
            now = self._audio_asked.modalities
            why = f"this session's output is {now}: change it with session.update"
            raise Refused("unsupported", f"output_modalities {asked!r} per response: {why}")
        if self._turn_due and not self._pending:
            # The core answers a committed spoken turn by itself, once it is transcribed.
            self._turn_due, self._create_absorbed = False, True
            return [], []
        if self._pending:
            text = "\n\n".join(self._pending)
            self._pending, self._pending_chars, self._continue_due = [], 0, False
            message = UserMessage(id=event.event_id, text=text, tool_choice=choice, tools=tools)
            return [message], []
        if self._continue_due:
            self._continue_due = False
            if self._core is not None:
                return [], []  # the core response's next output opens the answer
            # It went on and ended already; the client still gets a response to its ask.
            return [], self._empty_response()
        busy = " (a response is in progress)" if self._core is not None else ""
        why = f"nothing to answer: add a user message with conversation.item.create first{busy}"
        raise Refused("invalid_message", why)

    def _truncate(self, event: ItemTruncate) -> CoreTruncate:
        text = self._latest_items.get(event.item_id)
        if text is None or self._latest_core is None:
            why = "is not an assistant message of the latest response: only those can be cut"
            raise Refused("invalid_message", f"item {event.item_id[:64]!r} {why}")
        if event.content_index != 0:
            raise Refused("invalid_message", "content_index must be 0: a message has one part")
        answer = (event.item_id, event.content_index, event.audio_end_ms)
        msg_id = self._ask(event.event_id, answer)
        heard = event.text_end_chars
        if heard is None and text.segments_spoken:
            if text.audio_start_ms is not None:  # its audio played: to the ms, in the core
                end_ms = text.audio_start_ms + event.audio_end_ms
                return CoreTruncate(id=msg_id, response_id=self._latest_core, audio_end_ms=end_ms)
            heard = 0  # none of its audio came: none of it was heard
        if heard is None:
            heard = event.audio_end_ms * CHARS_PER_SECOND // 1000
        heard_chars = text.offset + min(heard, text.chars)
        return CoreTruncate(id=msg_id, response_id=self._latest_core, heard_chars=heard_chars)

    def _audio_on(self) -> SessionAudio:
        audio = self._audio_asked
        if not audio.spoken:
            why = "this session's audio is off: set output_modalities ['audio'] in session.update"
            raise Refused("invalid_audio", why)
        return audio

    def _append(self, event: AudioAppend) -> _Messages:
        """The client's audio, for the core: PCM16 at the session's rate, in pieces."""
        audio = self._audio_on()
        data = decode_audio(event.audio)
        rate = audio.core_rate(audio.input_format)
        law = G711.get(audio.input_format)
        if law is not None:
            data = self._converter(law, rate, inbound=True).feed(data)
        elif len(data) % 2:
            why = f"audio/pcm is PCM16: whole 2-byte samples, got {len(data)} bytes"
            raise Refused("invalid_audio", why)
        return list(chunked(data, rate))

    def _converter(self, law: str, rate: int, *, inbound: bool) -> Converter:
        assert self._converters is not None  # a G.711 format is refused without them
        key = (law, inbound)
        if key not in self._converted:
            self._converted[key] = self._converters(law, rate, inbound)
        return self._converted[key]

    def _committed(self) -> list[bytes]:
        """The user's spoken turn is committed (at the end of their speech, or by the
        client): its item, which its transcript completes."""
        item_id = self._user_item or self._new_id("item")
        self._user_item, self._transcribing, self._turn_due = None, item_id, True
        previous, self._last_item = self._last_item, item_id
        parts = [{"type": "input_audio", "transcript": None}]
        item = message_item(item_id, "user", "in_progress", parts)
        return [
            self._frames.event(
                "input_audio_buffer.committed", previous_item_id=previous, item_id=item_id
            ),
            self._frames.event("conversation.item.added", previous_item_id=previous, item=item),
        ]

    def _ask(self, event_id: str | None, answer: Any) -> str:
        """The id to give a core message whose answer needs ``answer``: the client's own
        when it has one not in use, else one of ours (never shown to the client)."""
        msg_id = event_id
        while msg_id is None or msg_id in self._asked:
            msg_id = f"openai-compat:{next(self._own_ids)}"
        self._asked[msg_id] = (event_id, answer)
        return msg_id

    def _item(self, item: dict[str, Any]) -> list[bytes]:
        """A conversation item added whole (not a response's output)."""
        previous, self._last_item = self._last_item, item["id"]
        return self._frames.item(item, previous)

    # ----------------------------------------------------------------- core -> client

    def encode(self, msg: ServerMsg, data: bytes) -> list[bytes]:
        """See ``gateway.wire.codec.Codec.encode``."""
        if isinstance(msg, _UNORDERED):
            return self._unordered(msg)
        out: _Out = []
        match msg:
            case TextDelta():
                self._on_delta(msg, out)
            case TextSegment():
                self._on_segment(msg, out)
            case TextDone() if self._text is not None:
                self._close_text("completed", out, msg.text)
            case ToolStatus():
                self._on_status(msg, out)
            case ToolCalls():
                self._on_calls(msg, out)
            case ResponseCreated():
                self._core = self._latest_core = msg.response_id
                self._core_chars, self._latest_items, self._failure = 0, {}, None
                self._core_spoken, self._create_absorbed = self._audio.spoken, False
                self._early = []
                self._open(msg.response_id, out)
            case ResponseDone():
                self._on_done(msg, out)
            case _:
                pass  # no OpenAI counterpart (docs/openai-compat.md)
        if not self._made_wait and not self._order:
            return cast(list[bytes], out)  # the usual case: nothing waits for audio
        self._made_wait = False
        frames: list[bytes] = []
        self._order.put(out, frames)
        return frames

    def _unordered(self, msg: ServerMsg) -> list[bytes]:
        """The frames of an event that belongs to no response."""
        out: list[bytes] = []
        match msg:
            case Error():
                self._on_error(msg, out)
            case InputSpeechStarted():
                self._user_item = self._user_item or self._new_id("item")
                self._speech_ms = [msg.offset_ms, msg.offset_ms]
                out.append(
                    self._frames.event(
                        "input_audio_buffer.speech_started",
                        audio_start_ms=msg.offset_ms,
                        item_id=self._user_item,
                    )
                )
            case InputSpeechStopped():
                self._user_item = self._user_item or self._new_id("item")
                self._speech_ms[1] = msg.offset_ms
                out.append(
                    self._frames.event(
                        "input_audio_buffer.speech_stopped",
                        audio_end_ms=msg.offset_ms,
                        item_id=self._user_item,
                    )
                )
                out += self._committed()
            case InputTranscript(final=True):
                self._on_transcript(msg, out)
            case InputAudioCleared():
                self._asked.pop(msg.in_reply_to or "", None)
                self._user_item = None
                out.append(self._frames.event("input_audio_buffer.cleared"))
            case AudioFlush():
                self._interrupted.add(msg.response_id)
            case AudioDone():
                interrupted = msg.status == "interrupted"
                for text in {t for t in self._segments.values() if t.core == msg.response_id}:
                    self._audio_ended(text, out, interrupted=interrupted)
            case SessionCreated():
                self._session_id = msg.session_id
                self._voices = tuple(msg.voices)
                voice = self._voices[0] if self._voices else None
                self._audio = self._audio_asked = replace(self._audio, voice=voice)
                out.append(self._frames.event("session.created", session=self._session()))
                out += self._held
                self._held = []
            case SessionUpdated():
                self._on_updated(msg, out)
            case ResponseTruncated():
                _, answer = self._asked.pop(msg.in_reply_to or "", (None, None))
                if answer is not None:
                    item_id, index, audio_end_ms = answer
                    out.append(
                        self._frames.event(
                            "conversation.item.truncated",
                            item_id=item_id,
                            content_index=index,
                            audio_end_ms=audio_end_ms,
                        )
                    )
            case _:
                pass  # a partial transcript: OpenAI's deltas only ever add to the text
        return out

    def _on_updated(self, msg: SessionUpdated, out: list[bytes]) -> None:
        _, changes = self._asked.pop(msg.in_reply_to or "", (None, {}))
        audio: SessionAudio | None = changes.pop("audio", None)
        if audio is not None:
            voice = msg.audio.voice if msg.audio is not None else audio.voice
            self._audio = replace(audio, voice=voice)
            if not audio.spoken:  # nothing more of any answer will be heard
                for text in set(self._segments.values()):
                    self._audio_ended(text, out, interrupted=True)
        options = {**self._config["gateway"], **changes.pop("gateway", {})}
        self._config.update(changes, gateway=options)
        out.append(self._frames.event("session.updated", session=self._session()))

    def _on_transcript(self, msg: InputTranscript, out: list[bytes]) -> None:
        """What the user said: their item, complete. Unless it is empty, the core's
        answer to it follows."""
        if self._transcribing is None:  # committed by the core alone (the turn's cap)
            out += self._committed()
        item_id, self._transcribing = self._transcribing, None
        out.append(
            self._frames.event(
                "conversation.item.input_audio_transcription.completed",
                item_id=item_id,
                content_index=0,
                transcript=msg.text,
                usage={
                    "type": "duration",
                    "seconds": (self._speech_ms[1] - self._speech_ms[0]) / 1000,
                },
            )
        )
        self._speech_ms = [0, 0]
        parts = [{"type": "input_audio", "transcript": msg.text}]
        out.append(
            self._frames.event(
                "conversation.item.done",
                item=message_item(item_id or "", "user", "completed", parts),
            )
        )
        if msg.message_id is None:  # nothing was said: no answer comes
            self._turn_due = False
            if self._create_absorbed:  # the client asked for one: it gets an empty one
                self._create_absorbed = False
                out += self._empty_response()

    def encode_audio(self, frame: bytes) -> list[bytes]:
        """See ``gateway.wire.codec.Codec.encode_audio``: ``response.output_audio.delta``
        for the item whose segment the frame speaks; the item's closing events once its
        last segment's last frame is out."""
        return self._audio_frames(decode_answer_audio(frame))

    def _audio_frames(self, audio: AnswerAudio) -> list[bytes]:
        text = self._segments.get(audio.seq)
        if text is None and self._text is not None and self._text.core == audio.response_id:
            # Audio ahead of its segment's text: a speech-to-speech model's, which speaks
            # and transcribes at once. It belongs to the message being written.
            text = self._text
            text.segments_spoken = True
        if text is None and audio.response_id == self._core:
            self._early.append(audio)  # before any of its text: it opens the message
            return []
        if text is None:
            return []  # audio of a segment this socket never saw (it is not spoken here)
        if text.audio_start_ms is None:
            text.audio_start_ms = audio.offset_ms
        out: list[bytes] = []
        pcm = audio.pcm
        fmt = self._audio.output_format
        if (law := G711.get(fmt)) is not None:
            pcm = self._converter(law, self._audio.core_rate(fmt), inbound=False).feed(
                pcm, last=audio.last
            )
        if pcm:
            response = text.response
            out.append(self._frames.audio_delta(response.id, text.item_id, text.output_index, pcm))
        if audio.last:
            self._segments.pop(audio.seq, None)
            text.segments.discard(audio.seq)
            if not text.segments and text.wait is not None:
                self._order.release(text.wait, out)
        return out

    def _audio_ended(self, text: _Text, out: list[bytes], *, interrupted: bool) -> None:
        """No more of ``text``'s audio comes: it closes (``incomplete`` when cut short)."""
        for seq in text.segments:
            self._segments.pop(seq, None)
        text.segments.clear()
        if interrupted and text.item is not None:
            text.item["status"] = "incomplete"
        if text.wait is not None:
            self._order.release(text.wait, out)

    def _on_delta(self, msg: TextDelta, out: _Out) -> None:
        response = self._ensure_response(out)
        if response is None:
            return
        spoken = self._core_spoken
        text = self._text
        if text is None:
            assert self._core is not None
            text = self._text = _Text(
                self._new_id("item"), len(response.output), self._core_chars, response, self._core
            )
            self._latest_items[text.item_id] = text
            item = message_item(text.item_id, "assistant", "in_progress", [])
            previous, self._last_item = self._last_item, text.item_id
            out += self._frames.text_started(
                response.id, text.output_index, item, previous, spoken=spoken
            )
            if self._early:  # a speech-to-speech model's audio came first
                early, self._early = self._early, []
                for audio in early:
                    out += self._audio_frames(audio)
        text.pieces.append(msg.delta)
        text.chars += len(msg.delta)
        self._core_chars += len(msg.delta)
        out.append(
            self._frames.text_delta(
                response.id, text.item_id, text.output_index, msg.delta, spoken=spoken
            )
        )

    def _on_segment(self, msg: TextSegment, out: _Out) -> None:
        text, response = self._text, self._response
        # The core sends a step's segments after the deltas they are made of and before
        # its text.done: the step's message item is open.
        if text is None or response is None:
            return
        if self._core_spoken:  # its audio comes later, in frames that name its seq
            text.segments_spoken = True
            text.segments.add(msg.seq)
            self._segments[msg.seq] = text
        if self._config["gateway"]["segments"]:
            out.append(
                self._frames.text_segment(response.id, text.item_id, text.output_index, msg.text)
            )

    def _close_text(self, status: str, out: _Out, full: str | None = None) -> None:
        text, response = self._text, self._response
        assert text is not None
        assert response is not None
        self._text = None
        full = "".join(text.pieces) if full is None else full
        if not self._core_spoken:
            parts = [{"type": "output_text", "text": full}]
            item = message_item(text.item_id, "assistant", status, parts)
            response.output.append(item)
            out += self._frames.text_done(response.id, text.output_index, item, full)
            return
        parts = [{"type": "output_audio", "transcript": full}]
        item = text.item = message_item(text.item_id, "assistant", status, parts)
        response.output.append(item)

        def closing() -> list[bytes]:
            return self._frames.audio_done(response.id, text.output_index, item, full)

        if not text.segments:  # its audio is all out already (or it had none)
            out += closing()
            return
        text.wait = Wait(closing)
        self._made_wait = True
        out.append(text.wait)

    def _on_calls(self, msg: ToolCalls, out: _Out) -> None:
        response = self._ensure_response(out)
        if response is None:
            return
        if self._text is not None:  # the core ends a step's text before its calls
            self._close_text("completed", out)
        for call in msg.calls:
            self._client_calls[call.call_id] = call.tool
            item_id, index = self._new_id("item"), len(response.output)
            done = call_item(item_id, call.call_id, call.tool, to_json(call.args), "completed")
            response.output.append(done)
            previous, self._last_item = self._last_item, item_id
            out += self._frames.function_call(response.id, index, done, previous)
        # An OpenAI client sends function_call_output only once the response is done.
        self._put_done(out, response, "completed")
        self._response = None

    def _on_status(self, msg: ToolStatus, out: _Out) -> None:
        call_id, status = msg.call_id, msg.status
        if msg.duplicate or status in ("progress", "requested"):
            return
        if call_id in self._client_calls:  # the client has its output already
            if status in _TERMINAL:
                del self._client_calls[call_id]
            return
        if status in ("running", "pending"):
            (self._server_calls if status == "running" else self._async_calls)[call_id] = msg.tool
            self._ensure_response(out)
            self._call_item(call_id, msg.tool, out)
            if status == "pending":
                out += self._item(output_item(self._new_id("item"), call_id, PENDING_OUTPUT))
            return
        if (name := self._async_calls.pop(call_id, None)) is not None:
            # Its result comes later, maybe between responses: an item to show, no output.
            outcome = (
                f"{name} completed: {to_json(msg.result)}"
                if status == "completed"
                else f"{name} failed: {msg.error or status}"
            )
            parts = [{"type": "input_text", "text": outcome}]
            out += self._item(message_item(self._new_id("item"), "system", "completed", parts))
            return
        self._ensure_response(out)
        if self._server_calls.pop(call_id, None) is None:  # refused before it ran
            self._call_item(call_id, msg.tool, out)
        result = msg.result if status == "completed" else {"error": msg.error or status}
        out += self._item(output_item(self._new_id("item"), call_id, to_json(result)))

    def _call_item(self, call_id: str, name: str, out: _Out) -> None:
        args = self.call_args(call_id)
        arguments = "{}" if args is None else to_json(args)
        out += self._item(call_item(self._new_id("item"), call_id, name, arguments, "completed"))

    def _on_done(self, msg: ResponseDone, out: _Out) -> None:
        if self._text is not None:
            self._close_text("incomplete", out)
        response = self._ensure_response(out)
        if response is not None:
            details: dict[str, Any] | None = {"type": msg.status}
            if msg.status == "cancelled":
                spoken_over = msg.response_id in self._interrupted
                reason = "turn_detected" if spoken_over else "client_cancelled"
                details = {"type": "cancelled", "reason": reason}
            elif msg.status == "failed" and self._failure is not None:
                details = {"type": "failed", "error": self._failure}
            elif msg.status == "completed":
                details = None
            usage = (msg.usage.input_tokens, msg.usage.output_tokens) if msg.usage else (0, 0)
            self._put_done(out, response, msg.status, usage, details)
        self._interrupted.discard(msg.response_id)
        self._response, self._core, self._openai_ids = None, None, {}
        if self._transcribing is None:  # no committed turn waits for its answer
            self._turn_due = False

    def _on_error(self, msg: Error, out: list[bytes]) -> None:
        event_id = msg.in_reply_to
        if event_id is not None and event_id in self._asked:
            event_id, answer = self._asked.pop(event_id)
            if isinstance(answer, dict) and "audio" in answer:  # refused: as it was
                self._audio_asked = self._audio
            elif answer is _COMMIT:  # nothing to commit: no turn, no answer
                self._turn_due = self._create_absorbed = False
        kind = "server_error" if msg.code in _SERVER_CODES else "invalid_request_error"
        if msg.response_id is not None and msg.response_id == self._core:
            self._failure = {"type": kind, "code": msg.code, "message": msg.message}
        out.append(self._frames.error(event_id, kind, msg.code, msg.message))

    def _ensure_response(self, out: _Out) -> _Response | None:
        """The open OpenAI response of the running core response: a new one when the
        last ended with client calls."""
        if self._response is None and self._core is not None:
            self._open(self._new_id("resp"), out)
        return self._response

    def _open(self, response_id: str, out: _Out) -> None:
        assert self._core is not None
        self._response = _Response(response_id)
        self._openai_ids[response_id] = self._core
        body = response_body(response_id, "in_progress", [], spoken=self._core_spoken)
        out.append(self._frames.event("response.created", response=body))

    def _put_done(
        self,
        out: _Out,
        response: _Response,
        status: str,
        usage: tuple[int, int] = (0, 0),
        details: dict[str, Any] | None = None,
    ) -> None:
        """``response.done`` after what is in ``out``: made when it goes, when the
        response speaks (an item cut short by the user is ``incomplete`` by then)."""
        if not self._core_spoken:
            out.append(self._done(response, status, usage, details))
            return
        out.append(Wait(lambda: [self._done(response, status, usage, details)], ready=True))
        self._made_wait = True

    def _empty_response(self) -> list[bytes]:
        """A response with nothing in it, for a ``response.create`` whose answer came
        already, or will not come."""
        response_id = self._new_id("resp")
        body = response_body(response_id, "in_progress", [], spoken=self._audio.spoken)
        done = response_body(response_id, "completed", [], (0, 0), spoken=self._audio.spoken)
        return [
            self._frames.event("response.created", response=body),
            self._frames.event("response.done", response=done),
        ]

    def _done(
        self,
        response: _Response,
        status: str,
        usage: tuple[int, int] = (0, 0),
        details: dict[str, Any] | None = None,
    ) -> bytes:
        """``response.done``. A core response's usage goes on its last OpenAI response;
        the ones its client calls ended before report 0 tokens."""
        body = response_body(
            response.id, status, response.output, usage, details, spoken=self._core_spoken
        )
        return self._frames.event("response.done", response=body)

    def _session(self) -> dict[str, Any]:
        return {
            "type": "realtime",
            "object": "realtime.session",
            "id": self._session_id,
            "model": self.model,
            **self._config,
            "output_modalities": self._audio.modalities,
            "audio": self._audio.report(),
        }
