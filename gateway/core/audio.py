"""A session's audio: the settings a client asks for, those applied, and what the user heard.

Part of the pure session core, which never sees a sample: the shell's voice pipeline
(``gateway.shell.voice``) carries the audio, runs the speech engines, and tells the core
what happened in words and milliseconds (``gateway.core.event``: speech started and stopped,
a transcript, a segment spoken). This module holds the values both sides agree on:

- ``AudioRequest``, the ``audio`` field of ``session.start`` / ``session.update``: each field
  given replaces the one in force; ``AudioSettings`` is what the session runs under, echoed
  whole in ``session.created`` / ``session.updated``;
- ``SpokenAudio``, how much of the latest spoken answer's text each millisecond of its audio
  covers, so that a barge-in keeps in the history only what the user heard
  (``heard_chars``).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

__all__ = [
    "RATES",
    "TURN_DETECTION",
    "AudioRequest",
    "AudioSettings",
    "SpokenAudio",
    "apply_request",
    "heard_chars",
    "word_end",
]

Rate = Literal[16000, 24000]
RATES: tuple[int, ...] = (16000, 24000)
"""The sample rates a session's audio may have, both ways."""
TurnDetection = Literal["server_vad", "semantic", "manual"]
TURN_DETECTION: tuple[str, ...] = ("server_vad", "semantic", "manual")
SilenceMs = Annotated[int, msgspec.Meta(ge=100, le=5000)]
InterruptMs = Annotated[int, msgspec.Meta(ge=0, le=2000)]
VoiceName = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]


class AudioRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """The ``audio`` a client asks for; absent fields keep the value in force (the default
    when audio is turned on). Out-of-range values are refused when the frame is decoded."""

    input_rate: Rate | None = None
    output_rate: Rate | None = None
    voice: VoiceName | None = None
    turn_detection: TurnDetection | None = None
    silence_ms: SilenceMs | None = None
    interrupt_min_ms: InterruptMs | None = None


class AudioSettings(msgspec.Struct, kw_only=True, frozen=True):
    """The audio a session runs under: PCM16 mono in at ``input_rate`` and out at
    ``output_rate``, the voice that speaks, how the user's turn ends (``server_vad``: after
    ``silence_ms`` of silence; ``semantic``: sooner when the words are complete, later when
    not; ``manual``: at ``input_audio.commit``), and how long the user must speak over an
    answer before it stops (``interrupt_min_ms``)."""

    input_rate: int = 16000
    output_rate: int = 24000
    voice: str = ""
    turn_detection: str = "server_vad"
    silence_ms: int = 500
    interrupt_min_ms: int = 200


def apply_request(
    current: AudioSettings | None, request: AudioRequest, voices: tuple[str, ...]
) -> AudioSettings | str:
    """The settings ``request`` makes of ``current`` (``None``: audio is off), or why it
    cannot be honoured: the gateway has no speech engines, or no such voice."""
    if not voices:
        return (
            "this gateway has no speech engines: audio is unavailable (install the"
            " conversation-gateway[voice] extra and leave GATEWAY_VOICE on)"
        )
    base = current or AudioSettings(voice=voices[0])
    if request.voice is not None and request.voice not in voices:
        return f"unknown voice {request.voice[:64]!r}: this gateway has {', '.join(voices)}"
    changes = {
        field: value
        for field in request.__struct_fields__
        if (value := getattr(request, field)) is not None
    }
    return msgspec.structs.replace(base, **changes)


class SpokenAudio(msgspec.Struct, kw_only=True):
    """The audio of the latest response spoken so far: after each segment, the characters
    of the response's text it brought the total to, and the milliseconds of audio."""

    response_id: str
    chars: list[int] = msgspec.field(default_factory=list)
    ms: list[int] = msgspec.field(default_factory=list)
    done: bool = False
    """Its ``audio.done`` was sent."""

    @property
    def audio_ms(self) -> int:
        return self.ms[-1] if self.ms else 0

    def add(self, chars: int, audio_ms: int) -> None:
        """Another segment was spoken: ``chars`` characters in ``audio_ms`` of audio."""
        self.chars.append((self.chars[-1] if self.chars else 0) + chars)
        self.ms.append(self.audio_ms + audio_ms)


def heard_chars(spoken: SpokenAudio, audio_end_ms: int) -> int:
    """How many characters of the response's text the first ``audio_end_ms`` of its audio
    said: every segment played in full, and of the segment playing then, a share of its
    characters as large as the share of its audio played (speech runs at an even pace, near
    enough, within one sentence). Past the end of the audio spoken, all of it."""
    chars_before, ms_before = 0, 0
    for chars, ms in zip(spoken.chars, spoken.ms, strict=True):
        if audio_end_ms < ms:
            share = (audio_end_ms - ms_before) / (ms - ms_before)
            return chars_before + int((chars - chars_before) * max(0.0, share))
        chars_before, ms_before = chars, ms
    return chars_before


def word_end(text: str, chars: int) -> int:
    """``chars``, or less: the end of the last word ``text[:chars]`` holds whole (a word
    cut in the middle is dropped, with the spaces before it)."""
    if chars >= len(text) or chars <= 0:
        return max(0, min(chars, len(text)))
    if not text[chars].isspace() and not text[chars - 1].isspace():
        chars = max(text.rfind(" ", 0, chars), 0)
    return len(text[:chars].rstrip())
