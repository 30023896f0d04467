"""The OpenAI Realtime (GA) client events this gateway reads, and the items it writes.

Pure: no I/O. Client events are decoded strictly at the top level and in items (an
unknown field there is an error, as OpenAI's own server does), leniently inside
``session`` and ``response`` (the SDKs send the whole configuration, which grows with
each model release: fields this gateway has no use for are ignored). The field names
follow the ``openai`` package's types (``openai.types.realtime``), but for the
gateway's own extension, ``session.gateway`` (``GatewayOptions``), which is ours and
so strict, as v1's messages are.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import UNSET, UnsetType

from gateway.wire.v1 import SessionUpdate as CoreUpdate

__all__ = [
    "CLIENT_EVENT_TYPES",
    "UNSUPPORTED_EVENTS",
    "WEBRTC_ONLY",
    "AudioAppend",
    "AudioClear",
    "AudioCommit",
    "AudioConfig",
    "AudioFormat",
    "ClientEvent",
    "ContentPart",
    "FunctionTool",
    "GatewayOptions",
    "Item",
    "ItemCreate",
    "ItemTruncate",
    "NamedChoice",
    "Refused",
    "ResponseCancel",
    "ResponseCreate",
    "ResponseParams",
    "SessionConfig",
    "SessionUpdate",
    "decode_event",
    "output_value",
    "response_options",
    "session_update",
    "tool_choice",
    "tool_spec",
    "user_texts",
    "why_invalid",
]

WEBRTC_ONLY = "output_audio_buffer.clear"
"""OpenAI's client event for WebRTC and SIP only: on a WebSocket the client plays the audio
and stops it itself."""
UNSUPPORTED_EVENTS = frozenset({"conversation.item.delete", "conversation.item.retrieve"})
"""Client events of the GA protocol this gateway does not serve (its history is the
session core's, which items cannot edit)."""


class Refused(Exception):
    """A client event the codec answers with an ``error`` itself (``code``, ``message``)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


class ClientEvent(msgspec.Struct, tag_field="type", kw_only=True, forbid_unknown_fields=True):
    event_id: str | None = None
    """The client's id for the event; an ``error`` it causes names it."""


class FunctionTool(msgspec.Struct, kw_only=True):
    type: str = "function"
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None


class NamedChoice(msgspec.Struct, kw_only=True):
    """``tool_choice`` forcing one tool: ``{"type": "function", "name": ...}``."""

    type: str
    name: str | None = None


class GatewayOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``session.gateway``: not in OpenAI's protocol, so no unmodified client sends it.
    The gateway's own options; absent fields stay as they are."""

    segments: bool | None = None
    """Voice: also send the answers' text as ``response.output_text.segment`` events
    (v1 ``segments``)."""


class AudioFormat(msgspec.Struct, kw_only=True):
    type: str = "audio/pcm"
    rate: int | None = None


class InputAudioConfig(msgspec.Struct, kw_only=True):
    format: AudioFormat | None = None
    transcription: dict[str, Any] | UnsetType | None = UNSET
    turn_detection: dict[str, Any] | UnsetType | None = UNSET
    noise_reduction: dict[str, Any] | UnsetType | None = UNSET


class OutputAudioConfig(msgspec.Struct, kw_only=True):
    format: AudioFormat | None = None
    voice: str | dict[str, Any] | None = None
    speed: float | None = None


class AudioConfig(msgspec.Struct, kw_only=True):
    """``session.audio`` as a client sends it: absent fields keep their value; ``null``
    turns ``transcription``, ``turn_detection`` or ``noise_reduction`` off."""

    input: InputAudioConfig | None = None
    output: OutputAudioConfig | None = None


class SessionConfig(msgspec.Struct, kw_only=True):
    type: str = "realtime"
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: str | NamedChoice | None = None
    output_modalities: list[str] | None = None
    audio: AudioConfig | None = None
    gateway: GatewayOptions | None = None


class SessionUpdate(ClientEvent, tag="session.update"):
    session: SessionConfig


class ContentPart(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    type: str | None = None
    text: str | None = None
    audio: str | None = None
    transcript: str | None = None
    image_url: str | None = None
    detail: str | None = None


class Item(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Any conversation item a client may create; the codec checks which it is."""

    type: str
    id: str | None = None
    object: str | None = None
    status: str | None = None
    role: str | None = None
    content: list[ContentPart] | None = None
    call_id: str | None = None
    output: str | None = None
    name: str | None = None
    arguments: str | None = None


class ItemCreate(ClientEvent, tag="conversation.item.create"):
    item: Item
    previous_item_id: str | None = None
    """Accepted and ignored: items always go at the end of the conversation."""


class ItemTruncate(ClientEvent, tag="conversation.item.truncate"):
    item_id: str
    content_index: Annotated[int, msgspec.Meta(ge=0)]
    audio_end_ms: Annotated[int, msgspec.Meta(ge=0)]
    text_end_chars: Annotated[int, msgspec.Meta(ge=0)] | None = None
    """Not in OpenAI's protocol: how many characters of the item's text the user saw or
    heard; when present it wins over ``audio_end_ms``."""


class ResponseParams(msgspec.Struct, kw_only=True):
    conversation: str | None = None
    input: list[Any] | None = None
    output_modalities: list[str] | None = None
    tool_choice: str | NamedChoice | None = None
    tools: list[FunctionTool] | None = None


class ResponseCreate(ClientEvent, tag="response.create"):
    response: ResponseParams | None = None


class ResponseCancel(ClientEvent, tag="response.cancel"):
    response_id: str | None = None


class AudioAppend(ClientEvent, tag="input_audio_buffer.append"):
    audio: str
    """Base64: PCM16 at 24 kHz, or G.711 at 8 kHz, as the session's input format says."""


class AudioCommit(ClientEvent, tag="input_audio_buffer.commit"):
    pass


class AudioClear(ClientEvent, tag="input_audio_buffer.clear"):
    pass


_EVENT_CLASSES = (
    SessionUpdate,
    ItemCreate,
    ItemTruncate,
    ResponseCreate,
    ResponseCancel,
    AudioAppend,
    AudioCommit,
    AudioClear,
)
_Events = (
    SessionUpdate
    | ItemCreate
    | ItemTruncate
    | ResponseCreate
    | ResponseCancel
    | AudioAppend
    | AudioCommit
    | AudioClear
)
_decoder = msgspec.json.Decoder(_Events)
CLIENT_EVENT_TYPES = frozenset(str(cls.__struct_config__.tag) for cls in _EVENT_CLASSES)

decode_event = _decoder.decode
"""Decode a client frame. Raises ``msgspec.ValidationError``/``DecodeError``."""


def why_invalid(text: str, detail: str) -> tuple[str | None, Refused]:
    """The ``event_id`` to name and the refusal, for a frame the typed decoder refused
    (``detail``): read again as plain JSON only to say what is wrong and which event."""
    try:
        raw = msgspec.json.decode(text)
    except (msgspec.DecodeError, RecursionError):
        return None, Refused("invalid_message", f"invalid JSON: {detail}")
    if not isinstance(raw, dict):
        return None, Refused("invalid_message", "an event must be a JSON object")
    event_id = raw.get("event_id") if isinstance(raw.get("event_id"), str) else None
    kind = raw.get("type")
    if not isinstance(kind, str):
        return event_id, Refused("invalid_message", "missing string field 'type'")
    if kind == WEBRTC_ONLY:
        why = "on a WebSocket, stop playing at input_audio_buffer.speech_started, then send"
        return event_id, Refused(
            "unsupported", f"{kind} is for WebRTC: {why} conversation.item.truncate"
        )
    if kind in UNSUPPORTED_EVENTS:
        return event_id, Refused("unsupported", f"{kind} is not supported by this gateway")
    if kind not in CLIENT_EVENT_TYPES:
        return event_id, Refused("unknown_type", f"unknown event type {kind[:64]!r}")
    return event_id, Refused("invalid_message", f"invalid {kind}: {detail}")


def tool_spec(tool: FunctionTool) -> dict[str, Any]:
    """A v1 client function (``ToolSpec``, checked when the core message is built) from
    an OpenAI function tool. OpenAI's description is optional, v1's is not: the name
    stands in for it."""
    if tool.type != "function":
        raise Refused("unsupported", f"only function tools are supported, not {tool.type!r}")
    if not tool.name:
        raise Refused("invalid_message", "a function tool needs a name")
    return {
        "name": tool.name,
        "description": tool.description or tool.name,
        "input_schema": tool.parameters or {"type": "object", "properties": {}},
    }


def tool_choice(choice: str | NamedChoice) -> str:
    """v1's ``tool_choice`` (a mode, or the name of the one tool to call) from OpenAI's."""
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            expected = "expected auto, none, required or {type: function, name}"
            raise Refused("invalid_message", f"tool_choice {choice[:64]!r}: {expected}")
        return choice
    if choice.type != "function" or not choice.name:
        raise Refused("unsupported", "tool_choice may name a function only")
    return choice.name


def session_update(event: SessionUpdate) -> tuple[CoreUpdate, dict[str, Any]]:
    """The core's ``session.update`` for an OpenAI one (its ``id`` left to the caller),
    and the changes to the session object that its ``session.updated`` confirms."""
    config = event.session
    if config.type != "realtime":
        raise Refused("unsupported", f"only realtime sessions are served, not {config.type!r}")
    raw: dict[str, Any] = {}
    changes: dict[str, Any] = {}
    if config.instructions is not None:
        raw["instructions"] = changes["instructions"] = config.instructions
    if config.tools is not None:
        specs = raw["client_functions"] = [tool_spec(tool) for tool in config.tools]
        changes["tools"] = [
            {
                "type": "function",
                "name": spec["name"],
                "description": spec["description"],
                "parameters": spec["input_schema"],
            }
            for spec in specs
        ]
    if config.tool_choice is not None:
        raw["tool_choice"] = tool_choice(config.tool_choice)
        changes["tool_choice"] = msgspec.to_builtins(config.tool_choice)
    if config.gateway is not None and config.gateway.segments is not None:
        raw["segments"] = config.gateway.segments
        changes["gateway"] = {"segments": config.gateway.segments}
    try:
        return msgspec.convert(raw, CoreUpdate), changes
    except msgspec.ValidationError as exc:
        raise Refused("invalid_message", f"invalid session.update: {exc}") from exc


def user_texts(item: Item) -> list[str]:
    """The text parts of a user message item (at least one); audio and images refused."""
    texts: list[str] = []
    for part in item.content or []:
        if part.type == "input_audio":
            why = "audio in items is not supported: send it with input_audio_buffer.append"
            raise Refused("unsupported", why)
        if part.type != "input_text" or part.text is None:
            raise Refused("unsupported", f"content {part.type!r}: send input_text")
        texts.append(part.text)
    if not texts:
        raise Refused("invalid_message", "a user message needs an input_text part")
    return texts


def output_value(item: Item) -> Any:
    """A ``function_call_output``'s output for the core: its JSON value when it is JSON,
    else the string itself."""
    assert item.output is not None
    try:
        return msgspec.json.decode(item.output)
    except msgspec.DecodeError:
        return item.output


def response_options(params: ResponseParams | None) -> tuple[str | None, list[str] | None]:
    """``tool_choice`` and the tool names a ``response.create`` asks for its response."""
    if params is None:
        return None, None
    if params.conversation == "none" or params.input is not None:
        why = "out-of-band responses (conversation 'none', input) are not supported"
        raise Refused("unsupported", why)
    choice = tool_choice(params.tool_choice) if params.tool_choice is not None else None
    tools = [tool_spec(tool)["name"] for tool in params.tools] if params.tools is not None else None
    return choice, tools
