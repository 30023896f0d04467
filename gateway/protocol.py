"""Wire protocol v1: every message as a msgspec Struct, and the decoders.

Client messages are strict (unknown fields are rejected); server messages are
lenient (clients skip fields they do not know), so the server can grow without
breaking old clients. ``docs/protocol.md`` documents each message with an example.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec

__all__ = [
    "CLIENT_MESSAGE_TYPES",
    "PROTOCOL_VERSION",
    "SUBPROTOCOL",
    "TOKEN_SUBPROTOCOL_PREFIX",
    "Ack",
    "AgentTransferred",
    "CallStatus",
    "ClientCall",
    "ClientMsg",
    "ConfirmItem",
    "DecodeFailure",
    "Error",
    "Inbound",
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
    "SessionCreated",
    "SessionEnded",
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
]

PROTOCOL_VERSION = 1
SUBPROTOCOL = "gateway.v1"
TOKEN_SUBPROTOCOL_PREFIX = "gateway.token."
"""A client token travels as the subprotocol ``gateway.token.<token>``, offered beside
``gateway.v1`` (never chosen by the server: it stays out of responses and access logs)."""

ToolName = Annotated[str, msgspec.Meta(pattern=r"^[a-z][a-z0-9_]*$", max_length=64)]
ClientId = Annotated[str, msgspec.Meta(max_length=128)]
CallStatus = Literal[
    "requested", "running", "pending", "progress", "completed", "failed", "cancelled", "expired"
]
ResponseStatus = Literal["completed", "cancelled", "failed", "incomplete"]


def _object_schema() -> dict[str, Any]:
    return {"type": "object", "properties": {}}


# --------------------------------------------------------------------- client -> server


class ClientMsg(msgspec.Struct, tag_field="type", kw_only=True, forbid_unknown_fields=True):
    """Client -> server. Strict: unknown fields are an error."""

    id: ClientId | None = None
    """Optional client-chosen id; an ``error`` caused by this message names it."""


class WidgetField(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """One field of a ``form`` widget."""

    name: Annotated[str, msgspec.Meta(pattern=r"^[a-z][a-z0-9_]{0,63}$")]
    label: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    type: Literal["text", "number"] = "text"
    required: bool = True


class Widget(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """How the user answers a widget tool's call: the client shows it in the conversation,
    and the user's answer is the call's result (``choice``: ``{"choice": ...}``;
    ``confirm``: ``{"confirmed": true|false}``; ``form``: ``{field: value, ...}``)."""

    type: Literal["choice", "confirm", "form"]
    prompt: Annotated[str, msgspec.Meta(min_length=1, max_length=500)]
    """What the user is asked; ``{arg}`` is filled in from the call's arguments."""
    options: Annotated[
        list[Annotated[str, msgspec.Meta(min_length=1, max_length=100)]],
        msgspec.Meta(max_length=20),
    ] = []
    """``choice``: the options to pick from."""
    options_arg: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    """``choice``: the argument (a list of strings) that holds the options instead; in a
    ``tool.calls`` it is resolved into ``options``."""
    fields: Annotated[list[WidgetField], msgspec.Meta(max_length=10)] = []
    """``form``: the fields to fill in."""


class ToolSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A function the client can run locally, declared in ``session.start``."""

    name: ToolName
    description: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]
    input_schema: dict[str, Any] = msgspec.field(default_factory=_object_schema)
    output_schema: dict[str, Any] | None = None
    display_name: Annotated[str, msgspec.Meta(min_length=1, max_length=128)] | None = None
    timeout: Annotated[float, msgspec.Meta(gt=0, le=3600)] | None = None
    """Seconds the client has to answer a call; the gateway's default when absent."""
    widget: Widget | None = None
    """A widget tool: the user answers its calls through this widget (docs/tools.md)."""


ToolChoice = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
"""Which tools the model may call: ``auto`` (its choice, the default), ``none`` (no tool),
``required`` (at least one), or one tool's name (that tool). A forced choice (``required``
or a name) holds for the first model step of a response; the steps after it are ``auto``."""

MaxSteps = Annotated[int, msgspec.Meta(ge=1, le=1000)]
"""Model steps a response may take (each tool round is a step); at most the gateway's
``max_steps`` (``session.created`` ``limits``)."""

ToolMode = Literal["auto", "manual"]
"""``auto``: the gateway runs server tools; ``manual``: every tool call the model asks for,
server tools included, goes to the client in ``tool.calls`` (Genkit's
``returnToolRequests``); the client answers it, or has the gateway run it (``tool.run``)."""

ToolNames = Annotated[
    list[Annotated[str, msgspec.Meta(max_length=64)]], msgspec.Meta(max_length=128)
]


class SessionStart(ClientMsg, tag="session.start"):
    """Open the session; the first message on a new socket."""

    agent: str | None = None
    instructions: Annotated[str, msgspec.Meta(max_length=32_000)] | None = None
    """Added after the agent's own instructions for this session."""
    client_functions: Annotated[list[ToolSpec], msgspec.Meta(max_length=128)] = []
    metadata: dict[str, Any] = {}
    tool_choice: ToolChoice | None = None
    """The session's default ``tool_choice`` (``auto`` when absent)."""
    max_steps: MaxSteps | None = None
    """The session's default ``max_steps`` (the gateway's when absent)."""
    tool_mode: ToolMode | None = None
    """The session's default tool mode (``auto`` when absent)."""
    segments: bool | None = None
    """Voice: also send the answers' text as speakable ``text.segment`` events."""
    time_zone: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z][A-Za-z0-9_+\-/]{0,63}$")] | None = (
        None
    )
    """The user's IANA time zone (``Europe/Paris``), for tools that tell the time."""


class SessionResume(ClientMsg, tag="session.resume"):
    """Reattach to a live session after a disconnect; the first message on the new socket."""

    session_id: Annotated[str, msgspec.Meta(max_length=128)]
    resume_token: Annotated[str, msgspec.Meta(max_length=256)]
    last_seq: Annotated[int, msgspec.Meta(ge=0)]
    """The highest ``seq`` the client has; every later event is replayed."""


class SessionUpdate(ClientMsg, tag="session.update"):
    """Change the session's declarations mid-session; absent fields stay as they are."""

    client_functions: Annotated[list[ToolSpec], msgspec.Meta(max_length=128)] | None = None
    """Replaces every client function declared so far (the agent's stay)."""
    instructions: Annotated[str, msgspec.Meta(max_length=32_000)] | None = None
    """Replaces the extra instructions given in ``session.start``."""
    tool_choice: ToolChoice | None = None
    """Replaces the session's default ``tool_choice``."""
    max_steps: MaxSteps | None = None
    """Replaces the session's default ``max_steps``."""
    tool_mode: ToolMode | None = None
    """Replaces the session's default tool mode."""
    segments: bool | None = None
    """Voice: turn ``text.segment`` events on or off for the responses that start after."""


class Ack(ClientMsg, tag="ack"):
    """The client has every event up to ``seq``; the server may forget them."""

    seq: Annotated[int, msgspec.Meta(ge=0)]


class UserMessage(ClientMsg, tag="user.message"):
    """A user turn. Queued when a response is already running."""

    text: Annotated[str, msgspec.Meta(min_length=1)]
    tool_choice: ToolChoice | None = None
    """For this message's response only; the session's default when absent."""
    tools: ToolNames | None = None
    """The only tools the model may use for this message's response (a subset of the
    session's, by name); all of them when absent."""
    max_steps: MaxSteps | None = None
    """For this message's response only; the session's default when absent."""
    tool_mode: ToolMode | None = None
    """For this message's response only; the session's default when absent."""


class ToolResult(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The answer to one client-function call: exactly one of ``output`` or ``error``."""

    call_id: Annotated[str, msgspec.Meta(max_length=128)]
    tool: str
    display_name: str | None = None
    output: Any = msgspec.UNSET
    error: str | msgspec.UnsetType = msgspec.UNSET


class ToolResults(ClientMsg, tag="tool.results"):
    """Answers to the calls of a ``tool.calls`` batch (any subset, any order)."""

    results: Annotated[list[ToolResult], msgspec.Meta(min_length=1, max_length=128)]


class ToolRun(ClientMsg, tag="tool.run"):
    """Manual tool mode: run on the gateway a server tool the model asked for (offered in
    ``tool.calls`` with ``kind: server``), as auto mode would have; its outcome is the
    call's result."""

    call_id: Annotated[str, msgspec.Meta(max_length=128)]
    args: dict[str, Any] | None = None
    """Arguments to run it with instead of the model's (checked against its schema)."""


class ToolConfirmation(ClientMsg, tag="tool.confirmation"):
    """The user's answer to a call in ``tool.confirm``: approve it (as it is, or with edited
    ``args``) or decline it (the model gets ``reason``)."""

    call_id: Annotated[str, msgspec.Meta(max_length=128)]
    approved: bool
    args: dict[str, Any] | None = None
    """With ``approved``: run it with these arguments instead (checked against its schema)."""
    reason: Annotated[str, msgspec.Meta(max_length=1000)] | None = None
    """With a decline: why, in the user's words; the model sees it."""


class ResponseCancel(ClientMsg, tag="response.cancel"):
    """Barge-in: stop the running response (only that one, when ``response_id`` is given)."""

    response_id: str | None = None


class ResponseTruncate(ClientMsg, tag="response.truncate"):
    """Voice barge-in: the user heard only the first ``heard_chars`` characters of the
    latest response's text (its deltas joined, counted in code points). The running
    response stops first; the history keeps only what was heard."""

    response_id: str
    heard_chars: Annotated[int, msgspec.Meta(ge=0)]


class Ping(ClientMsg, tag="ping"):
    """Application-level ping, answered by ``pong`` with the same ``ts``."""

    ts: float | None = None


Inbound = (
    SessionStart
    | SessionResume
    | SessionUpdate
    | Ack
    | UserMessage
    | ToolResults
    | ToolRun
    | ToolConfirmation
    | ResponseCancel
    | ResponseTruncate
    | Ping
)
CLIENT_MESSAGE_TYPES: frozenset[str] = frozenset(
    str(cls.__struct_config__.tag)
    for cls in (
        SessionStart,
        SessionResume,
        SessionUpdate,
        Ack,
        UserMessage,
        ToolResults,
        ToolRun,
        ToolConfirmation,
        ResponseCancel,
        ResponseTruncate,
        Ping,
    )
)


class DecodeFailure(msgspec.Struct, frozen=True, kw_only=True):
    """A client frame that did not decode (or was refused unread, ``rate_limited``); the
    session answers it with an ``error``."""

    code: Literal["invalid_message", "unknown_type", "rate_limited"]
    message: str
    in_reply_to: str | None = None
    retryable: bool = False
    msg_type: str | None = None
    """The known ``type`` the frame claimed, when it named one (a broken ``session.resume``
    must not open a new session)."""


# --------------------------------------------------------------------- server -> client


class ServerMsg(msgspec.Struct, tag_field="type", kw_only=True, omit_defaults=True):
    """Server -> client. Lenient: clients ignore fields they do not know."""

    seq: int = 0
    """Strictly increasing from 1 per session; set by the session when sent."""


class ToolInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A tool of the session, as listed in ``session.created``."""

    name: str
    kind: Literal["client", "server"]
    execution: Literal["sync", "async"] = "sync"
    delivery: Literal["when_idle", "interrupt", "silent"] | None = None
    """For async tools: how their result reaches the model."""
    display_name: str = ""
    description: str = ""


class Limits(msgspec.Struct, kw_only=True):
    """Limits in force for the session, so a client can stay inside them."""

    max_message_chars: int
    max_queued_messages: int
    max_steps: int
    ws_max_size: int
    client_call_timeout: float
    max_messages_per_second: float | None = None
    """Frames the socket may send per second on average (``None``: no limit); a ``ping``
    sent after the previous ``pong`` is free."""
    max_message_burst: int | None = None
    """Frames the socket may send at once above that rate."""
    max_tool_result_size: int | None = None
    """Bytes of JSON a client result's ``output`` or ``error`` may have (``None``: no
    limit); a larger one gets ``error invalid_result`` and fails its call."""


class SessionCreated(ServerMsg, tag="session.created"):
    session_id: str
    resume_token: str
    """Secret for ``session.resume``; keep it like a password, for this session only."""
    agent: str
    protocol_version: int
    tools: list[ToolInfo] = []
    limits: Limits | None = None


class SessionUpdated(ServerMsg, tag="session.updated"):
    """The answer to ``session.update``: the session's tools now."""

    tools: list[ToolInfo] = []
    in_reply_to: str | None = None


class SessionResumed(ServerMsg, tag="session.resumed"):
    """The socket is attached again; the replayed events follow, then live ones.

    Connection-level: it has no ``seq`` (0, omitted) and is never replayed itself.
    """

    session_id: str
    replayed_from: int
    """The first ``seq`` replayed (``last_seq`` + 1)."""
    last_seq: int
    """The session's newest ``seq``; the replay ends with it."""
    agent: str | None = None
    """The agent the session is with now (another after ``agent.transferred``)."""
    open_calls: list[ClientCall] = []
    """Client-function calls still waiting for a result; answer them (once) if not done."""
    open_confirmations: list[ConfirmItem] = []
    """Calls still waiting for the user's approval; answer them (once) if not done."""


class TranscriptEntry(msgspec.Struct, kw_only=True):
    role: Literal["user", "assistant"]
    text: str


class SessionSnapshot(ServerMsg, tag="session.snapshot"):
    """After ``error resume_gap``: the state to rebuild from; live events follow.

    Connection-level: no ``seq`` of its own.
    """

    session_id: str
    last_seq: int
    agent: str | None = None
    """The agent the session is with now."""
    transcript: list[TranscriptEntry] = []
    open_calls: list[ClientCall] = []
    open_confirmations: list[ConfirmItem] = []


class SessionEnded(ServerMsg, tag="session.ended"):
    """The agent ended the session (its ``end_session`` tool), after its last answer; the
    socket then closes with 1000 and the reason ``session ended``."""

    reason: str


class AgentTransferred(ServerMsg, tag="agent.transferred"):
    """The agent handed the conversation to another (its ``transfer_to_agent`` tool): the
    new agent answers from the next model step on, with the history kept, its own
    instructions, model and tools, and the client's functions."""

    agent: str
    """The agent the session is with now."""
    previous_agent: str
    tools: list[ToolInfo] = []
    """The session's tools now (the new agent's and the client's functions)."""
    reason: str | None = None
    """Why, in the previous agent's words."""
    response_id: str | None = None
    """The response in which it happened (the new agent goes on with it)."""


class ResponseCreated(ServerMsg, tag="response.created"):
    response_id: str
    in_reply_to: str | None = None
    """The ``id`` of the ``user.message`` this response answers."""
    call_id: str | None = None
    """Set instead when the response tells the user an async tool's result."""


class ResponseTruncated(ServerMsg, tag="response.truncated"):
    """The answer to ``response.truncate``: the history keeps only what was heard."""

    response_id: str
    heard_chars: int
    in_reply_to: str | None = None


class ResponseRetrying(ServerMsg, tag="response.retrying"):
    """The model request failed before the model said anything; the gateway sends it
    again after ``delay`` seconds. Nothing of the response is lost or repeated."""

    response_id: str
    attempt: int
    """Which retry this is: 1 for the first."""
    delay: float
    """Seconds before the request is sent again."""
    reason: str
    """Why the last attempt failed, in a few words (``HTTP 429``, ``ConnectError``...)."""


class TextDelta(ServerMsg, tag="text.delta"):
    response_id: str
    delta: str


class TextSegment(ServerMsg, tag="text.segment"):
    """Voice sessions (``segments``): a speakable piece of the answer's text, a whole
    sentence or clause, for a speech synthesizer, as soon as it is complete
    (``gateway.segments``). A step's segments joined are its text; the last comes just
    before its ``text.done``."""

    response_id: str
    text: str


class TextDone(ServerMsg, tag="text.done"):
    response_id: str
    text: str


class ClientCall(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One client-function call of a ``tool.calls`` batch."""

    call_id: str
    tool: str
    display_name: str
    args: dict[str, Any]
    deadline: float
    """Unix time (seconds) by which the result must arrive."""
    timeout: float
    """The same deadline as seconds from when the call was made (for skewed clocks)."""
    kind: Literal["client", "server"] = "client"
    """``server``: a server tool offered to the client in manual tool mode; answer it with
    ``tool.results``, or have the gateway run it with ``tool.run``."""
    widget: Widget | None = None
    """A widget tool's call: show the widget; the user's answer is the result."""


class ConfirmItem(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A tool call waiting for the user's approval before it runs (``tool.confirm``)."""

    call_id: str
    tool: str
    display_name: str
    args: dict[str, Any]
    prompt: str
    """A sentence to ask the user, e.g. ``Cancel order 1234?``."""
    deadline: float
    """Unix time (seconds) by which the answer must arrive; then the call expires."""
    timeout: float
    """The same deadline as seconds from when it was asked (for skewed clocks)."""
    kind: Literal["client", "server"] = "client"
    """Where the call runs once approved: the client (a client function) or the gateway."""


class ToolConfirm(ServerMsg, tag="tool.confirm"):
    """Ask the user to approve these calls (``tool.confirmation``); the response waits."""

    response_id: str
    calls: list[ConfirmItem]


class ToolCalls(ServerMsg, tag="tool.calls"):
    response_id: str
    calls: list[ClientCall]


class ToolStatus(ServerMsg, tag="tool.status"):
    call_id: str
    tool: str
    status: CallStatus
    response_id: str | None = None
    result: Any = msgspec.UNSET
    """The output of a completed server tool."""
    progress: Any = msgspec.UNSET
    """What a running async tool reported, with ``status: progress``."""
    error: str | None = None
    code: str | None = None
    """Why a failed call failed, when it has a code: ``forbidden`` (the user may not run
    it: a scope missing, or the tool refused them)."""
    duplicate: bool = False
    """True when this repeats the stored outcome of a call that was already settled."""


class Usage(msgspec.Struct, kw_only=True):
    input_tokens: int = 0
    output_tokens: int = 0


class ResponseDone(ServerMsg, tag="response.done"):
    response_id: str
    status: ResponseStatus
    turn_completed: bool = False
    usage: Usage | None = None


class Error(ServerMsg, tag="error"):
    code: str
    message: str
    in_reply_to: str | None = None
    call_id: str | None = None
    response_id: str | None = None
    """The response the error ended or belongs to, if any."""
    retryable: bool = False
    fatal: bool = False


class Pong(ServerMsg, tag="pong"):
    ts: float | None = None


Outbound = (
    SessionCreated
    | SessionUpdated
    | SessionResumed
    | SessionSnapshot
    | SessionEnded
    | AgentTransferred
    | ResponseCreated
    | ResponseRetrying
    | ResponseTruncated
    | TextDelta
    | TextSegment
    | TextDone
    | ToolCalls
    | ToolConfirm
    | ToolStatus
    | ResponseDone
    | Error
    | Pong
)

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
    if not isinstance(raw, dict):
        return DecodeFailure(code="invalid_message", message="a message must be a JSON object")
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
