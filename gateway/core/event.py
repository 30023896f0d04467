"""What flows through the session core: events in, effects out.

Events are everything that can happen to a session besides client messages
(which are ``gateway.wire.v1`` types): model output, tool outcomes, time, the
socket going away. Effects are what the core asks its driver to do.
"""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.core.audio import AudioSettings
from gateway.core.call import Call
from gateway.core.inbound import DecodeFailure, Inbound
from gateway.core.model import ModelEvent, ModelRequest
from gateway.core.outbound import LimitHit, ServerMsg

__all__ = [
    "CallModel",
    "CancelModel",
    "CancelTool",
    "ClearAudio",
    "CommitAudio",
    "Disconnected",
    "Effect",
    "EndSpeech",
    "Event",
    "Listen",
    "ModelFailed",
    "ModelOutput",
    "ResumeTool",
    "RunTool",
    "SaveCall",
    "SegmentSpoken",
    "Send",
    "ShuttingDown",
    "Speak",
    "SpeechDone",
    "SpeechStarted",
    "SpeechStopped",
    "StopSpeaking",
    "Tick",
    "ToolDeferred",
    "ToolFinished",
    "ToolHandle",
    "ToolNews",
    "ToolProgress",
    "Transcribed",
    "VoiceFailed",
]

# --------------------------------------------------------------------- events


class Tick(msgspec.Struct, frozen=True):
    """Time passed; the session expires what is due."""


class ModelOutput(msgspec.Struct, frozen=True):
    """An event of the model stream started by ``CallModel(step_id)``."""

    step_id: str
    event: ModelEvent


class ModelFailed(msgspec.Struct, frozen=True):
    """The model stream of ``step_id`` broke, or the step was not started (a usage limit:
    ``code`` says which, with ``retry_after`` and ``limit``)."""

    step_id: str
    message: str
    retryable: bool = True
    code: str = "provider_error"
    retry_after: float | None = None
    limit: LimitHit | None = None


class ToolFinished(msgspec.Struct, frozen=True, kw_only=True, tag="tool_finished"):
    """A server tool returned (``output``) or raised (``error``)."""

    call_id: str
    output: Any = None
    error: str | None = None
    code: str | None = None
    """With ``error``: ``forbidden`` when the tool refused the caller."""


class ToolProgress(msgspec.Struct, frozen=True, kw_only=True, tag="tool_progress"):
    """A running server tool reported progress (any JSON value)."""

    call_id: str
    payload: Any = None


class ToolDeferred(msgspec.Struct, frozen=True, kw_only=True, tag="tool_deferred"):
    """A running sync server tool said it will take long (a remote agent's task that goes
    on working): its call turns async, so the model step waiting for it goes on."""

    call_id: str


class ToolHandle(msgspec.Struct, frozen=True, kw_only=True, tag="tool_handle"):
    """Where a running server tool's work can be found again (a remote agent's task id):
    kept with its call, so that a node taking the session over re-attaches to it."""

    call_id: str
    handle: dict[str, Any]


ToolNews = ToolFinished | ToolProgress | ToolDeferred | ToolHandle
"""What a running server tool reports about its call, wherever it runs."""


class Disconnected(msgspec.Struct, frozen=True):
    """The session is over (its socket is gone for good): stop all its work."""


class ShuttingDown(msgspec.Struct, frozen=True):
    """The gateway is stopping: cut the running response (``incomplete``)."""


# ------------------------------------------------ events of the voice pipeline (shell)


class SpeechStarted(msgspec.Struct, frozen=True):
    """The user started speaking, ``offset_ms`` into the session's input audio. With
    ``interrupting``, over an answer (running, or still playing: ``played_ms`` of the latest
    spoken response's audio had played, as far as the pipeline knows) for at least the
    session's ``interrupt_min_ms``, and not its own echo: a barge-in."""

    offset_ms: int
    interrupting: bool = False
    played_ms: int = 0


class SpeechStopped(msgspec.Struct, frozen=True):
    """The user stopped speaking, ``offset_ms`` into the audio: the end of their turn
    (its final transcript follows)."""

    offset_ms: int


class Transcribed(msgspec.Struct, frozen=True):
    """What the user said in the turn in progress (``final``: the whole turn)."""

    text: str
    final: bool


class SegmentSpoken(msgspec.Struct, frozen=True):
    """The audio of a segment of ``response_id`` (``chars`` characters of its text) was
    sent: ``audio_ms`` of it."""

    response_id: str
    chars: int
    audio_ms: int


class SpeechDone(msgspec.Struct, frozen=True):
    """The audio of ``response_id`` is all sent (``EndSpeech``), or was stopped
    (``StopSpeaking``: ``interrupted``)."""

    response_id: str
    audio_ms: int = 0
    """The audio of ``response_id`` sent, in all."""
    interrupted: bool = False


class VoiceFailed(msgspec.Struct, frozen=True):
    """A speech engine failed: the user's words were not heard (no ``response_id``), or a
    segment of ``response_id`` was not spoken. The session goes on."""

    message: str
    response_id: str | None = None


Event = (
    Inbound
    | DecodeFailure
    | Tick
    | ModelOutput
    | ModelFailed
    | ToolFinished
    | ToolProgress
    | ToolDeferred
    | ToolHandle
    | Disconnected
    | ShuttingDown
    | SpeechStarted
    | SpeechStopped
    | Transcribed
    | SegmentSpoken
    | SpeechDone
    | VoiceFailed
)

# --------------------------------------------------------------------- effects


class Send(msgspec.Struct, frozen=True):
    """Send this event to the client (its ``seq`` is already set)."""

    msg: ServerMsg


class CallModel(msgspec.Struct, frozen=True):
    """Start a model step; its events come back as ``ModelOutput(step_id)``."""

    step_id: str
    response_id: str
    request: ModelRequest
    agent: str = ""
    """Whose model: the session's agent at the time (``""``: the gateway's own)."""


class CancelModel(msgspec.Struct, frozen=True):
    """Stop the model step now; its later output is ignored anyway."""

    step_id: str


class RunTool(msgspec.Struct, frozen=True, kw_only=True):
    """Run a server tool; its outcome comes back as ``ToolFinished(call_id)``."""

    call_id: str
    tool: str
    args: dict[str, Any]
    response_id: str
    agent: str = ""
    """Whose tool: the session's agent at the time (``""``: the gateway's own)."""


class ResumeTool(msgspec.Struct, frozen=True, kw_only=True):
    """Re-attach to the work of a server tool another node started (this session was
    adopted from it), found by the ``handle`` it kept; its outcome comes back as
    ``ToolFinished(call_id)``."""

    call_id: str
    tool: str
    handle: dict[str, Any]
    response_id: str
    agent: str = ""


class CancelTool(msgspec.Struct, frozen=True):
    """Cancel a running server tool; its late outcome is ignored."""

    call_id: str


class SaveCall(msgspec.Struct, frozen=True):
    """A call's record changed: keep it in the store's ledger."""

    call: Call


class Listen(msgspec.Struct, frozen=True):
    """The session's audio settings changed (``None``: audio is off): the voice pipeline
    takes them for the audio that comes next."""

    audio: AudioSettings | None


class CommitAudio(msgspec.Struct, frozen=True):
    """End the user's turn now (``input_audio.commit``): its final transcript comes back
    as ``Transcribed``."""


class ClearAudio(msgspec.Struct, frozen=True):
    """Drop the audio of the user's turn in progress (``input_audio.clear``)."""


class Speak(msgspec.Struct, frozen=True):
    """Speak ``text``, a segment of ``response_id`` sent as event ``seq``, after the
    segments asked for before it; ``SegmentSpoken`` comes back."""

    response_id: str
    seq: int
    text: str


class EndSpeech(msgspec.Struct, frozen=True):
    """``response_id`` has no more segments: once its audio is all sent, ``SpeechDone``."""

    response_id: str


class StopSpeaking(msgspec.Struct, frozen=True):
    """Barge-in: stop the audio of ``response_id`` now, drop its segments not spoken yet
    (``SpeechDone`` with ``interrupted`` comes back)."""

    response_id: str


Effect = (
    Send
    | CallModel
    | CancelModel
    | RunTool
    | ResumeTool
    | CancelTool
    | SaveCall
    | Listen
    | CommitAudio
    | ClearAudio
    | Speak
    | EndSpeech
    | StopSpeaking
)
