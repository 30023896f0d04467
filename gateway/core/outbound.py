"""What the session core tells a client: its domain events.

Each event is a msgspec Struct tagged with its ``type``. Protocol v1 is their canonical
serialization: it sends them as they are, encoded once for the socket and the session's
event log both (``gateway.wire.v1.encode``); another wire protocol translates them into
its own frames (``gateway.wire.codec``: ``gateway.wire.openai.codec``), and decodes the logged ones
to replay. Lenient: clients skip fields they do not know, so events can grow.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from gateway.core.audio import AudioSettings
from gateway.core.inbound import CallStatus, ResponseStatus, Widget

__all__ = [
    "FIRST_DEVICE",
    "PROTOCOL_VERSION",
    "AgentTransferred",
    "AudioDone",
    "AudioFlush",
    "ClientCall",
    "ConfirmItem",
    "Error",
    "InputAudioCleared",
    "InputSpeechStarted",
    "InputSpeechStopped",
    "InputTranscript",
    "LimitHit",
    "Limits",
    "Outbound",
    "Pong",
    "ResponseCreated",
    "ResponseDone",
    "ResponseRetrying",
    "ResponseTruncated",
    "ServerMsg",
    "SessionAttached",
    "SessionCreated",
    "SessionEnded",
    "SessionGoingAway",
    "SessionResumed",
    "SessionSnapshot",
    "SessionUpdated",
    "TextDelta",
    "TextDone",
    "TextSegment",
    "ToolCalls",
    "ToolConfirm",
    "ToolInfo",
    "ToolStatus",
    "TranscriptEntry",
    "Usage",
]

PROTOCOL_VERSION = 1
"""The version of this vocabulary and of v1, its canonical serialization: bumped when a
field changes type or a message goes (STYLE.md, "Wire protocol")."""


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
    audio: AudioSettings | None = None
    """The session's audio, when ``session.start`` turned it on (docs/voice.md)."""
    voices: list[str] = []
    """The voices the gateway speaks in, its default first; none: it cannot turn audio on."""
    device_id: str | None = None
    """The id of the device that started the session (``FIRST_DEVICE``): it resumes as
    that device (``session.resume``'s ``device_id``), leaving other devices attached."""


FIRST_DEVICE = "dev_1"
"""The device id of a session's first socket; the devices that join it get others
(``session.attached``). Ids tell a session's devices apart, nothing more: the resume token
is the credential."""


class SessionUpdated(ServerMsg, tag="session.updated"):
    """The answer to ``session.update``: the session's tools now, and its audio."""

    tools: list[ToolInfo] = []
    in_reply_to: str | None = None
    audio: AudioSettings | None = None
    """The audio in force (``None``: off), every field as applied."""


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
    device_id: str | None = None
    """The device this socket is (the resume's ``device_id``), when it named one."""


class SessionAttached(ServerMsg, tag="session.attached"):
    """The answer to ``session.attach``: this socket joined the session as one more
    device; the replayed events follow, then live ones, as after ``session.resumed``.

    Connection-level: it has no ``seq`` (0, omitted) and is never replayed itself.
    """

    session_id: str
    device_id: str
    """This device's id: it resumes with it after a drop (``session.resume``)."""
    replayed_from: int
    last_seq: int
    agent: str | None = None
    open_calls: list[ClientCall] = []
    """Calls of this device's functions still waiting for a result."""
    open_confirmations: list[ConfirmItem] = []
    devices: int = 1
    """Sockets attached to the session now, this one included."""


class SessionGoingAway(ServerMsg, tag="session.going_away"):
    """The gateway will close this socket for its own reasons in ``time_left`` seconds: open
    the next socket now and resume there (``session.resume``), so the close loses nothing.

    Connection-level: it has no ``seq`` (0, omitted) and is never replayed.
    """

    reason: Literal["shutdown", "session_moved", "max_socket_age"]
    """``shutdown``: this node is draining; ``session_moved``: another node drives the
    session now; ``max_socket_age``: the socket reached the gateway's maximum age."""
    time_left: float
    """Seconds until the close (0: now)."""


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
    device_id: str | None = None
    """The socket's device, after a ``session.attach`` or a resume that named one (the
    snapshot answers them in place of ``session.attached`` or ``session.resumed``)."""


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
    (``gateway.core.segments``). A step's segments joined are its text; the last comes just
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
    input_audio_tokens: int = 0
    """Of ``input_tokens``, those of audio: a speech-to-speech model hears and speaks."""
    output_audio_tokens: int = 0
    cached_input_tokens: int = 0
    """Of ``input_tokens``, those the provider read from its prompt cache."""
    cost: float | None = None
    """What the response's model steps cost, in the currency of the gateway's price table;
    ``null`` when unknown (a step's model has no price): never 0 for unknown."""


class LimitHit(msgspec.Struct, frozen=True, kw_only=True):
    """The usage limit that refused a model step (``error rate_limited`` or
    ``budget_exceeded``)."""

    scope: str
    """``key`` (the app's API key, all its users), ``end_user`` or ``agent``."""
    name: str
    """``tokens_per_minute``, ``requests_per_minute``, ``cost_per_day``, ``cost_per_month``."""
    value: float


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
    retry_after: float | None = None
    """Seconds after which the same request may succeed (``rate_limited``,
    ``budget_exceeded``)."""
    limit: LimitHit | None = None
    """With ``rate_limited`` and ``budget_exceeded``: the limit that was hit."""


class Pong(ServerMsg, tag="pong"):
    ts: float | None = None


class InputSpeechStarted(ServerMsg, tag="input_audio.speech_started"):
    """The user started speaking, ``offset_ms`` into the session's input audio."""

    offset_ms: int


class InputSpeechStopped(ServerMsg, tag="input_audio.speech_stopped"):
    """The user stopped speaking (the end of their turn), ``offset_ms`` into the audio."""

    offset_ms: int


class InputTranscript(ServerMsg, tag="input_audio.transcript"):
    """What the user said: a partial (``final`` false) that may change, or the final text,
    which becomes their message ``message_id`` (``response.created.in_reply_to``)."""

    text: str
    final: bool
    message_id: str | None = None


class InputAudioCleared(ServerMsg, tag="input_audio.cleared"):
    """The answer to ``input_audio.clear``: the turn's audio so far is dropped."""

    in_reply_to: str | None = None


class AudioFlush(ServerMsg, tag="audio.flush"):
    """Barge-in: stop playing ``response_id`` now and drop what is buffered of it, then
    say how much was played (``response.truncate`` with ``audio_end_ms``)."""

    response_id: str


class AudioDone(ServerMsg, tag="audio.done"):
    """Every audio frame of ``response_id`` was sent (``completed``), or its audio stopped
    at a barge-in (``interrupted``): ``audio_ms`` of it in all."""

    response_id: str
    audio_ms: int
    status: Literal["completed", "interrupted"] = "completed"


Outbound = (
    SessionCreated
    | SessionUpdated
    | SessionResumed
    | SessionAttached
    | SessionGoingAway
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
    | InputSpeechStarted
    | InputSpeechStopped
    | InputTranscript
    | InputAudioCleared
    | AudioFlush
    | AudioDone
)
