"""A session's whole state as one value: what a store persists and any node restores.

Part of the pure session core. A ``Session`` holds its ``SessionState`` and changes it in
place as events come; ``Session.state()`` returns it (a view with the parts its
collaborators keep put back: ``seq``, ``calls``, ``history``), and
``Session.restore(settings, state)`` takes one over, in this process or another.
Continuing from a restored state behaves exactly as if the session had never been
persisted (tests/test_state.py checks it over random event sequences).

What is *not* here is what a node brings itself: the agent's instructions and server
tools, the limits in force (``SessionSettings``), the clock, and the running work (model
streams, server tools), which lives in the driver. The resume token is not here either:
only its hash is stored, in the session record.

Encoded with MessagePack (``encode_state``/``decode_state``): compact and fast, and the
same values round-trip (JSON-compatible tool arguments and outputs, strings, numbers).
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec

from gateway.core.audio import AudioSettings, SpokenAudio
from gateway.core.call import Call
from gateway.core.inbound import ToolSpec, UserMessage
from gateway.core.model import ModelToolCall
from gateway.core.outbound import Usage
from gateway.core.principal import Principal
from gateway.core.transcript import ContextNote, Item

__all__ = [
    "STATE_VERSION",
    "PendingNote",
    "Phase",
    "ResponseState",
    "SessionState",
    "decode_items",
    "decode_state",
    "encode_item",
    "encode_state",
    "new_state",
]

STATE_VERSION = 1
"""Bumped when a change to ``SessionState`` cannot read what an older gateway wrote."""


class Phase(enum.Enum):
    NEW = "new"
    OPEN = "open"
    CLOSED = "closed"


class PendingNote(msgspec.Struct, frozen=True, kw_only=True):
    """Context waiting for the model's next step; ``announce`` makes it start a response."""

    note: ContextNote
    announce: bool


class ResponseState(msgspec.Struct, kw_only=True):
    """The response in progress."""

    response_id: str
    steps: int = 0
    step_id: str | None = None
    """The model step streaming now, if any."""
    text: list[str] = msgspec.field(default_factory=list)
    """The text of this step so far."""
    requested: list[ModelToolCall] = msgspec.field(default_factory=list)
    """The tool calls this step asked for so far (started when the step finishes)."""
    calls: list[Call] = msgspec.field(default_factory=list)
    """Calls of the latest step; the next step starts when none of them blocks. The same
    objects as the ledger's (``Session.restore`` links them again)."""
    usage: Usage = msgspec.field(default_factory=Usage)
    cost_unknown: bool = False
    """A step of the response had no price: its ``usage.cost`` is reported unknown."""
    unconfirmed: str = ""
    """Text the client already has from a step that was cut when its node stopped: the
    step runs again and this much of its new text is not sent twice (see
    ``Session.adopt``)."""
    tool_choice: str = "auto"
    """The response's ``tool_choice`` (``gateway.core.tool_choice``)."""
    tools: list[str] | None = None
    """The only tools its message lets the model use; ``None``: all the session's."""
    max_steps: int | None = None
    """Its message's (or the session's) ``max_steps``; ``None``: the gateway's limit."""
    tool_mode: str = "auto"
    """``manual``: the model's tool calls go to the client, server tools included."""
    segmented: int = 0
    """Voice sessions: characters of this step's text already sent in ``text.segment``."""
    segments: int = 0
    """Voice sessions: ``text.segment`` events this response sent so far."""
    voice: bool = False
    """The session asked for segments (or audio) when this response started (a change
    applies to the responses after it)."""
    spoken: bool = False
    """The session's audio was on when this response started: its segments are spoken."""
    in_reply_to: str | None = None
    """The id of the user message it answers (``None``: an async result's response)."""


class SessionState(msgspec.Struct, kw_only=True):
    """Everything a session is, as data."""

    version: int = STATE_VERSION
    session_id: str
    phase: Phase
    principal: Principal
    instructions: str
    """The instructions in force: the agent's plus what the client added."""
    client_functions: list[ToolSpec]
    """The client's own functions (those the agent does not declare), as accepted."""
    metadata: dict[str, Any]
    seq: int
    """The ``seq`` of the last event sent."""
    history: list[Item]
    turn_starts: list[int]
    """Where each turn of ``history`` starts (``gateway.core.history``)."""
    notes: list[PendingNote]
    queue: list[UserMessage]
    message_ids: list[str]
    """Ids of recent user messages, oldest first (a repeated id counts once)."""
    response: ResponseState | None
    calls: list[Call]
    """The ledger: open calls and the most recent settled ones, oldest first."""
    tool_choice: str = "auto"
    """The session's default ``tool_choice``."""
    max_steps: int | None = None
    """The session's default ``max_steps``; ``None``: the gateway's limit."""
    tool_mode: str = "auto"
    """The session's default tool mode."""
    time_zone: str | None = None
    """The user's time zone, from ``session.start``."""
    ending: str | None = None
    """Why the agent ends the session once the running response is done."""
    agent: str | None = None
    """The agent the session is with (``None``: the gateway's own, in older states)."""
    client_instructions: str | None = None
    """What the client added to the agent's instructions (``instructions`` has both)."""
    latest_response: str | None = None
    """The id of the latest response (``response.truncate``)."""
    segments: bool = False
    """Voice: the session sends ``text.segment`` events."""
    audio: AudioSettings | None = None
    """Voice: the session's audio, when it is on."""
    spoken: SpokenAudio | None = None
    """Voice: the audio of the latest response that had some (``response.truncate``)."""


def new_state(
    *, session_id: str, principal: Principal, instructions: str, agent: str
) -> SessionState:
    """The state of a session that has not started yet."""
    return SessionState(
        session_id=session_id,
        phase=Phase.NEW,
        principal=principal,
        instructions=instructions,
        agent=agent,
        client_functions=[],
        metadata={},
        seq=0,
        history=[],
        turn_starts=[],
        notes=[],
        queue=[],
        message_ids=[],
        response=None,
        calls=[],
    )


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(SessionState)
_item_decoder = msgspec.msgpack.Decoder(Item)


def encode_item(item: Item) -> bytes:
    """One transcript item, for a store that keeps the transcript apart from the state."""
    return _encoder.encode(item)


def decode_items(data: list[bytes]) -> list[Item]:
    """The items ``encode_item`` wrote.

    Raises:
        msgspec.ValidationError: one is not an item this gateway can read.
    """
    return [_item_decoder.decode(item) for item in data]


def encode_state(state: SessionState) -> bytes:
    return _encoder.encode(state)


def decode_state(data: bytes) -> SessionState:
    """The state ``encode_state`` wrote.

    Raises:
        msgspec.ValidationError: the data is not a state this gateway can read (another
            ``STATE_VERSION``, or corrupt).
    """
    state = _decoder.decode(data)
    if state.version != STATE_VERSION:
        raise msgspec.ValidationError(
            f"session state version {state.version}; this gateway reads {STATE_VERSION}"
        )
    return state
