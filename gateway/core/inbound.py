"""What a client asks of a session: the session core's inbound vocabulary.

Each request is a msgspec Struct tagged with its ``type``. Protocol v1 sends them as they
are (``gateway.wire.v1`` decodes its frames into them); another wire protocol translates
its own frames into them (``gateway.wire.codec``). Strict: unknown fields are rejected.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from gateway.core.audio import AudioRequest

__all__ = [
    "CLIENT_MESSAGE_TYPES",
    "Ack",
    "CallStatus",
    "ClientId",
    "ClientMsg",
    "DecodeFailure",
    "DeviceId",
    "Inbound",
    "InputAudioClear",
    "InputAudioCommit",
    "MaxSteps",
    "Ping",
    "ResponseCancel",
    "ResponseStatus",
    "ResponseTruncate",
    "SessionAttach",
    "SessionResume",
    "SessionStart",
    "SessionUpdate",
    "ToolChoice",
    "ToolConfirmation",
    "ToolMode",
    "ToolName",
    "ToolNames",
    "ToolResult",
    "ToolResults",
    "ToolRun",
    "ToolSpec",
    "UserMessage",
    "Widget",
    "WidgetField",
]


DeviceId = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
"""One device's id among a session's sockets (``session.created``, ``session.attached``)."""
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
    audio: AudioRequest | None = None
    """Voice: audio on the socket both ways (docs/voice.md)."""


class SessionResume(ClientMsg, tag="session.resume"):
    """Reattach to a live session after a disconnect; the first message on the new socket."""

    session_id: Annotated[str, msgspec.Meta(max_length=128)]
    resume_token: Annotated[str, msgspec.Meta(max_length=256)]
    last_seq: Annotated[int, msgspec.Meta(ge=0)]
    """The highest ``seq`` the client has; every later event is replayed."""
    device_id: DeviceId | None = None
    """Resume as this device (``session.created``'s or ``session.attached``'s id): the new
    socket replaces only that device's, and the session's other devices stay attached.
    Without it the resume takes the whole session over (every other socket closes 4009)."""
    client_functions: Annotated[list[ToolSpec], msgspec.Meta(max_length=128)] | None = None
    """With ``device_id``: the functions this device offers now (declared again at every
    reconnect; the node the session moved to knows them from this alone)."""


class SessionAttach(ClientMsg, tag="session.attach"):
    """Join a live session as one more device, alongside the sockets attached to it; the
    first message on the new socket (``session.attached`` answers it)."""

    session_id: Annotated[str, msgspec.Meta(max_length=128)]
    resume_token: Annotated[str, msgspec.Meta(max_length=256)]
    last_seq: Annotated[int, msgspec.Meta(ge=0)] = 0
    """The highest ``seq`` this device has (0: all the log still holds is replayed)."""
    client_functions: Annotated[list[ToolSpec], msgspec.Meta(max_length=128)] = []
    """The functions this device offers: calls of them come to it (and to any other
    device that declared the same)."""


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
    audio: AudioRequest | bool | None = None
    """Voice: turn audio on, or change its settings (the fields given); ``false``: off."""


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
    heard_chars: Annotated[int, msgspec.Meta(ge=0)] | None = None
    audio_end_ms: Annotated[int, msgspec.Meta(ge=0)] | None = None
    """Instead of ``heard_chars``: how much of the response's audio was played, in ms
    (the text it said is derived from the segments spoken)."""


class InputAudioCommit(ClientMsg, tag="input_audio.commit"):
    """Voice: the user's turn ends now (``manual`` turn detection; any mode may send it)."""


class InputAudioClear(ClientMsg, tag="input_audio.clear"):
    """Voice: drop the audio of the user's turn in progress."""


class Ping(ClientMsg, tag="ping"):
    """Application-level ping, answered by ``pong`` with the same ``ts``."""

    ts: float | None = None


Inbound = (
    SessionStart
    | SessionResume
    | SessionAttach
    | SessionUpdate
    | Ack
    | UserMessage
    | ToolResults
    | ToolRun
    | ToolConfirmation
    | ResponseCancel
    | ResponseTruncate
    | InputAudioCommit
    | InputAudioClear
    | Ping
)
CLIENT_MESSAGE_TYPES: frozenset[str] = frozenset(
    str(cls.__struct_config__.tag)
    for cls in (
        SessionStart,
        SessionResume,
        SessionAttach,
        SessionUpdate,
        Ack,
        UserMessage,
        ToolResults,
        ToolRun,
        ToolConfirmation,
        ResponseCancel,
        ResponseTruncate,
        InputAudioCommit,
        InputAudioClear,
        Ping,
    )
)


class DecodeFailure(msgspec.Struct, frozen=True, kw_only=True):
    """A client frame that did not decode (or was refused unread, ``rate_limited``); the
    session answers it with an ``error``."""

    code: Literal[
        "invalid_message", "unknown_type", "rate_limited", "invalid_audio", "message_too_large"
    ]
    message: str
    in_reply_to: str | None = None
    retryable: bool = False
    msg_type: str | None = None
    """The known ``type`` the frame claimed, when it named one (a broken ``session.resume``
    must not open a new session)."""
