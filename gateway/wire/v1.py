"""Wire protocol v1: the codec of the gateway's own protocol, and its JSON Schema.

v1 is the canonical serialization of the session core's vocabulary: the requests a client
makes (``gateway.core.inbound``, strict: unknown fields are rejected) and the domain events the
core sends (``gateway.core.outbound``, lenient: clients skip fields they do not know, so the server
can grow without breaking old clients). Its codec is the identity: frames decode into
those structs, and events encode as they are (once, for the socket and the event log).
Other wire protocols translate (``gateway.wire.codec``). Every name is re-exported here.
``docs/protocol.md`` documents each message with an example.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from gateway.core.audio import AudioRequest, AudioSettings
from gateway.core.inbound import (
    CLIENT_MESSAGE_TYPES,
    Ack,
    CallStatus,
    ClientMsg,
    DecodeFailure,
    Inbound,
    InputAudioClear,
    InputAudioCommit,
    Ping,
    ResponseCancel,
    ResponseStatus,
    ResponseTruncate,
    SessionAttach,
    SessionResume,
    SessionStart,
    SessionUpdate,
    ToolConfirmation,
    ToolResult,
    ToolResults,
    ToolRun,
    ToolSpec,
    UserMessage,
    Widget,
    WidgetField,
)
from gateway.core.outbound import (
    FIRST_DEVICE,
    PROTOCOL_VERSION,
    AgentTransferred,
    AudioDone,
    AudioFlush,
    ClientCall,
    ConfirmItem,
    Error,
    InputAudioCleared,
    InputSpeechStarted,
    InputSpeechStopped,
    InputTranscript,
    LimitHit,
    Limits,
    Outbound,
    Pong,
    ResponseCreated,
    ResponseDone,
    ResponseRetrying,
    ResponseTruncated,
    ServerMsg,
    SessionAttached,
    SessionCreated,
    SessionEnded,
    SessionGoingAway,
    SessionResumed,
    SessionSnapshot,
    SessionUpdated,
    TextDelta,
    TextDone,
    TextSegment,
    ToolCalls,
    ToolConfirm,
    ToolInfo,
    ToolStatus,
    TranscriptEntry,
    Usage,
)

__all__ = [
    "CLIENT_MESSAGE_TYPES",
    "FIRST_DEVICE",
    "PROTOCOL_VERSION",
    "SUBPROTOCOL",
    "TOKEN_SUBPROTOCOL_PREFIX",
    "Ack",
    "AgentTransferred",
    "AudioDone",
    "AudioFlush",
    "AudioRequest",
    "AudioSettings",
    "CallStatus",
    "ClientCall",
    "ClientMsg",
    "ConfirmItem",
    "DecodeFailure",
    "Error",
    "Inbound",
    "InputAudioClear",
    "InputAudioCleared",
    "InputAudioCommit",
    "InputSpeechStarted",
    "InputSpeechStopped",
    "InputTranscript",
    "LimitHit",
    "Limits",
    "Outbound",
    "Ping",
    "Pong",
    "ResponseCancel",
    "ResponseCreated",
    "ResponseDone",
    "ResponseRetrying",
    "ResponseStatus",
    "ResponseTruncate",
    "ResponseTruncated",
    "ServerMsg",
    "SessionAttach",
    "SessionAttached",
    "SessionCreated",
    "SessionEnded",
    "SessionGoingAway",
    "SessionResume",
    "SessionResumed",
    "SessionSnapshot",
    "SessionStart",
    "SessionUpdate",
    "SessionUpdated",
    "TextDelta",
    "TextDone",
    "TextSegment",
    "ToolCalls",
    "ToolConfirm",
    "ToolConfirmation",
    "ToolInfo",
    "ToolResult",
    "ToolResults",
    "ToolRun",
    "ToolSpec",
    "ToolStatus",
    "TranscriptEntry",
    "Usage",
    "UserMessage",
    "Widget",
    "WidgetField",
    "decode_client",
    "decode_server",
    "encode",
    "protocol_schema",
    "struct_schema",
    "why_refused",
]

SUBPROTOCOL = "gateway.v1"
TOKEN_SUBPROTOCOL_PREFIX = "gateway.token."
"""A client token travels as the subprotocol ``gateway.token.<token>``, offered beside
``gateway.v1`` (never chosen by the server: it stays out of responses and access logs)."""

# --------------------------------------------------------------------- codecs

_client_decoder = msgspec.json.Decoder(Inbound)
_server_decoder = msgspec.json.Decoder(Outbound)
_encoder = msgspec.json.Encoder()


encode = _encoder.encode
"""Encode any protocol message to JSON bytes (the encoder's own method: it runs for every
event sent, and a wrapper would add a call to each)."""


def decode_server(data: bytes | str) -> Outbound:
    """Decode a server event (lenient). Raises ``msgspec.ValidationError``/``DecodeError``."""
    return _server_decoder.decode(data)


_TOO_DEEP = DecodeFailure(code="invalid_message", message="invalid JSON: nested too deeply")


def decode_client(data: bytes | str) -> Inbound | DecodeFailure:
    """Decode a client frame; never raises on bad input.

    The typed decoder is the fast path. When it fails, the frame is decoded again
    as plain JSON only to say precisely what is wrong and which ``id`` to blame.
    """
    try:
        return _client_decoder.decode(data)
    except RecursionError:
        return _TOO_DEEP
    except msgspec.DecodeError as exc:
        if not isinstance(exc, msgspec.ValidationError):
            return _unreadable(data, exc)
        detail = str(exc)
    # The typed decoder stops at the first wrong value; the rest of the frame may still be
    # broken (truncated, trailing bytes, a number out of range), so this can fail too.
    try:
        raw = msgspec.json.decode(data)
    except RecursionError:
        return _TOO_DEEP
    except msgspec.DecodeError as exc:
        return _unreadable(data, exc)
    return why_refused(raw, detail)


def why_refused(raw: Any, detail: str, kind: str = "JSON") -> DecodeFailure:
    """What is wrong with a frame the typed decoder refused (``detail``), read again as
    plain data (``raw``, from JSON or MessagePack): the failure to answer, with the ``id``
    and ``type`` it names."""
    if not isinstance(raw, dict):
        return DecodeFailure(code="invalid_message", message=f"a message must be a {kind} object")
    msg_id = raw.get("id")
    in_reply_to = _usable_id(msg_id)
    msg_type = raw.get("type")
    if not isinstance(msg_type, str):
        return DecodeFailure(
            code="invalid_message", message="missing string field 'type'", in_reply_to=in_reply_to
        )
    if msg_type not in CLIENT_MESSAGE_TYPES:
        known = ", ".join(sorted(CLIENT_MESSAGE_TYPES))
        return DecodeFailure(
            code="unknown_type",
            message=f"unknown message type {msg_type[:64]!r}; expected one of: {known}",
            in_reply_to=in_reply_to,
        )
    return DecodeFailure(
        code="invalid_message",
        message=f"invalid {msg_type}: {detail}",
        in_reply_to=in_reply_to,
        msg_type=msg_type,
    )


# A \uXXXX escape of a UTF-16 surrogate half (D800-DFFF).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_LONE_SURROGATE = (
    "a string holds half of a UTF-16 surrogate pair without its other half (such as an"
    " emoji cut in two); send well-formed Unicode"
)


def _usable_id(msg_id: Any) -> str | None:
    """A frame's ``id`` as an error's ``in_reply_to``: a string of 128 characters at most."""
    return msg_id if isinstance(msg_id, str) and len(msg_id) <= 128 else None


def _readable_id(msg_id: Any) -> str | None:
    """The id to answer, unless it held a blanked-out surrogate: never echo an id the
    client did not send."""
    usable = _usable_id(msg_id)
    return usable if usable is not None and "\ufffd" not in usable else None


def _unreadable(data: bytes | str, exc: msgspec.DecodeError) -> DecodeFailure:
    """The failure for a frame that is not JSON msgspec reads. msgspec refuses a lone
    surrogate escape (``"\\ud83d"`` alone, valid JSON but not Unicode) as "truncated": with
    those escapes blanked out, the frame is read again only to say so, and to name its
    ``id`` and ``type``."""
    raw_bytes = data.encode() if isinstance(data, str) else data
    if _SURROGATE_ESCAPE.search(raw_bytes) is None:
        return DecodeFailure(code="invalid_message", message=f"invalid JSON: {exc}")
    try:
        raw = msgspec.json.decode(_SURROGATE_ESCAPE.sub(rb"\\ufffd", raw_bytes))
    except (msgspec.DecodeError, RecursionError):
        return DecodeFailure(code="invalid_message", message=f"invalid JSON: {exc}")
    if not isinstance(raw, dict):
        return DecodeFailure(code="invalid_message", message=f"invalid JSON: {_LONE_SURROGATE}")
    msg_id, msg_type = raw.get("id"), raw.get("type")
    known = msg_type if msg_type in CLIENT_MESSAGE_TYPES else None
    return DecodeFailure(
        code="invalid_message",
        message=f"invalid {known or 'message'}: {_LONE_SURROGATE}",
        in_reply_to=_readable_id(msg_id),
        msg_type=known,
    )


def struct_schema(struct_type: type[msgspec.Struct]) -> dict[str, Any]:
    """A self-contained JSON Schema with the Struct itself at the root (the form tool
    input and output schemas take), nested Structs under ``$defs``."""
    (ref,), components = msgspec.json.schema_components(
        [struct_type], ref_template="#/$defs/{name}"
    )
    root: dict[str, Any] = dict(components.pop(ref["$ref"].rsplit("/", 1)[-1]))
    root.pop("title", None)
    if components:
        root["$defs"] = components
    return root


def protocol_schema() -> dict[str, Any]:
    """The JSON Schema of every client and server message (for other-language clients)."""
    (client, server), components = msgspec.json.schema_components(
        [Inbound, Outbound], ref_template="#/$defs/{name}"
    )
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"Conversation gateway wire protocol v{PROTOCOL_VERSION}",
        "description": f"WebSocket subprotocol {SUBPROTOCOL}: JSON text frames.",
        "$defs": {**components, "ClientMessage": client, "ServerMessage": server},
        "oneOf": [{"$ref": "#/$defs/ClientMessage"}, {"$ref": "#/$defs/ServerMessage"}],
    }
