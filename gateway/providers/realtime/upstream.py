"""One conversation's socket to a speech-to-speech model (OpenAI Realtime, Gemini Live),
behind one interface: what the gateway tells the model, and what the model says back.

An ``Upstream`` is opened per session by the session's voice link
(``gateway.shell.realtime_voice``), which keeps the tools, the history and the client's
events in the gateway's hands: the upstream model hears the user's audio and speaks, and
every function call it makes comes back to the gateway as a ``CallRequested``, answered
exactly once with ``send_tool_output``. Adapters translate one vendor protocol each
(``gateway.providers.realtime.openai``, ``gateway.providers.realtime.gemini``); they hold no
state of the conversation beyond what their protocol needs (item ids, call names).

Audio is PCM16 little-endian mono both ways, at the adapter's ``input_rate`` and
``output_rate``; the link resamples.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

import msgspec

from gateway.core.transcript import Item

__all__ = [
    "AudioDelta",
    "CallRequested",
    "CallsCancelled",
    "Closed",
    "Committed",
    "GoingAway",
    "Resumable",
    "SpeechStarted",
    "SpeechStopped",
    "TextDelta",
    "TurnDone",
    "TurnStarted",
    "Upstream",
    "UpstreamEvent",
    "UpstreamSetup",
    "UpstreamUsage",
    "UserTranscript",
]


class UpstreamSetup(msgspec.Struct, frozen=True, kw_only=True):
    """What a new upstream session is told at its start."""

    instructions: str
    tools: tuple[dict[str, Any], ...] = ()
    """Function tools: ``{"name", "description", "parameters"}`` (JSON Schema)."""
    voice: str | None = None
    silence_ms: int = 500
    """The user's turn ends after this much silence (the upstream's own VAD)."""
    history: tuple[Item, ...] = ()
    """The conversation so far, to seed a replacement session with (empty: a new one)."""
    resume_handle: str | None = None
    """A session-resumption handle the previous upstream session gave (Gemini)."""


class UpstreamUsage(msgspec.Struct, frozen=True, kw_only=True):
    input_text_tokens: int = 0
    input_audio_tokens: int = 0
    output_text_tokens: int = 0
    output_audio_tokens: int = 0


# ----------------------------------------------------------------- what the model says


class SpeechStarted(msgspec.Struct, frozen=True):
    """The upstream's VAD heard the user start speaking, ``offset_ms`` into their audio."""

    offset_ms: int


class SpeechStopped(msgspec.Struct, frozen=True):
    offset_ms: int


class Committed(msgspec.Struct, frozen=True):
    """The user's spoken turn is in the upstream's conversation (its model will answer it
    when asked, or has begun already: see ``TurnStarted``)."""


class UserTranscript(msgspec.Struct, frozen=True):
    """What the user said in their latest committed turn (the upstream's transcription)."""

    text: str


class TurnStarted(msgspec.Struct, frozen=True):
    """The model began a response (asked for, or on its own after the user's turn)."""


class TextDelta(msgspec.Struct, frozen=True):
    """A piece of the response's text: the transcript of its audio."""

    text: str


class AudioDelta(msgspec.Struct, frozen=True):
    """A piece of the response's audio, PCM16 at ``output_rate``."""

    pcm: bytes


class CallRequested(msgspec.Struct, frozen=True):
    """The model calls a function; ``call_id`` is the upstream's (answer with it)."""

    call_id: str
    name: str
    args: dict[str, Any]
    args_error: str | None = None


class CallsCancelled(msgspec.Struct, frozen=True):
    """The upstream dropped calls it asked for (Gemini, when the user speaks over them):
    their outputs must not be sent."""

    call_ids: tuple[str, ...]


class TurnDone(msgspec.Struct, frozen=True):
    """The response is over: ``completed`` (it may have asked for calls), ``cancelled``,
    or ``failed`` (``error`` says why)."""

    status: str
    usage: UpstreamUsage | None = None
    error: str | None = None


class GoingAway(msgspec.Struct, frozen=True):
    """The upstream will close this session in ``time_left_s`` (Gemini's ``goAway``)."""

    time_left_s: float


class Resumable(msgspec.Struct, frozen=True):
    """A handle that resumes this upstream session on a new socket (Gemini)."""

    handle: str


class Closed(msgspec.Struct, frozen=True):
    """The upstream socket is gone (``expired``: the upstream's session cap)."""

    reason: str
    expired: bool = False


UpstreamEvent = (
    SpeechStarted
    | SpeechStopped
    | Committed
    | UserTranscript
    | TurnStarted
    | TextDelta
    | AudioDelta
    | CallRequested
    | CallsCancelled
    | TurnDone
    | GoingAway
    | Resumable
    | Closed
)


class Upstream(Protocol):
    """One session with a speech-to-speech model; see the module docstring.

    Every method but ``events`` and ``aclose`` raises ``ProviderError`` when the socket is
    gone (the link then opens another). ``events`` ends after ``Closed``.
    """

    input_rate: int
    output_rate: int
    answers_speech: bool
    """The model answers the user's spoken turn by itself (Gemini): a step for a spoken
    turn takes that answer and asks for none."""

    async def open(self, setup: UpstreamSetup) -> None:
        """Connect and configure (the model's VAD on, its own responses off where the
        protocol allows: the gateway asks for each with ``respond``)."""

    def events(self) -> AsyncIterator[UpstreamEvent]: ...

    async def send_audio(self, pcm: bytes) -> None: ...

    async def commit_audio(self) -> None: ...

    async def clear_audio(self) -> None: ...

    async def send_user_text(self, text: str) -> None: ...

    async def send_context(self, text: str) -> None:
        """Context the model should have (an async tool's result), not said by anyone."""

    async def send_tool_output(self, call_id: str, name: str, output: Any) -> None: ...

    async def respond(self) -> None:
        """Ask for a response to what the conversation holds now."""

    async def cancel(self) -> None:
        """Stop the response in progress, if any."""

    async def truncate(self, audio_end_ms: int) -> None:
        """The user heard only the first ``audio_end_ms`` of the latest response's audio."""

    async def aclose(self) -> None: ...
