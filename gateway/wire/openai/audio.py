"""Audio on the OpenAI-compatible endpoint: the session's audio settings in OpenAI's shape,
the client's audio in, and the order of the answer's frames out, for ``OpenAIRealtimeCodec``.

Pure: no I/O. The session core hears and speaks PCM16 at 16 or 24 kHz (``gateway.core.audio``);
OpenAI's clients send and get base64 in JSON events, PCM16 at 24 kHz or G.711 at 8 kHz. PCM
passes as it is; G.711 goes through converters the endpoint gives (``Converters``:
``gateway.voice.g711``, which the wire layer may not import), at 16 kHz on the core's side.

The settings map onto v1's ``audio`` (``AudioRequest``): ``output_modalities: ["audio"]``
turns the session's audio on, ``["text"]`` off; ``audio.input.turn_detection`` ``server_vad``
(its ``silence_duration_ms``), ``semantic_vad`` or ``null`` (commit by hand) is v1's
``server_vad``, ``semantic`` or ``manual``; ``audio.output.voice`` is used when the gateway has
that voice. ``docs/openai-compat.md`` says what the rest becomes.

An answer's audio comes after its text (the text is generated, then spoken), and an OpenAI
client takes an item's ``response.output_item.done``, and its response's ``response.done``,
as the end of that item's audio. So the frames that close an item wait until its audio is all
out, and so does every frame of its response after them (``OutputOrder``).
"""

from __future__ import annotations

import base64
import binascii
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from msgspec import UNSET

from gateway.core.audio import AudioRequest
from gateway.wire.openai.inbound import AudioConfig, AudioFormat, Refused

__all__ = [
    "CHUNK_MS",
    "Converter",
    "Converters",
    "OutputOrder",
    "SessionAudio",
    "Wait",
    "audio_update",
    "chunked",
    "decode_audio",
]

PCM = "audio/pcm"
G711 = {"audio/pcmu": "pcmu", "audio/pcma": "pcma"}
"""OpenAI's G.711 formats, to the law's name in ``Converters``."""
PCM_RATE = 24000
"""OpenAI's PCM is 24 kHz, both ways."""
G711_CORE_RATE = 16000
"""The core's rate for a G.711 session (8 kHz resampled): the speech engines' own."""
CHUNK_MS = 100
"""An append's audio goes to the core in pieces of at most this much (its frames may hold
250 ms): a client may append seconds at once."""
TurnDetectionMode = Literal["server_vad", "semantic", "manual"]
SERVER_VAD: dict[str, Any] = {
    "type": "server_vad",
    "silence_duration_ms": 500,
    "create_response": True,
    "interrupt_response": True,
}
"""OpenAI's default turn detection, which is v1's default too."""


class Converter(Protocol):
    """A stream of audio converted chunk by chunk; ``last`` ends a piece (flushes)."""

    def feed(self, data: bytes, *, last: bool = False) -> bytes: ...


Converters = Callable[[str, int, bool], Converter]
"""``(law, core rate, inbound)``: a converter from G.711 ``law`` (``pcmu``, ``pcma``) to PCM16
at the core's rate (``inbound``: the client's audio), or back (the answer's)."""


# ----------------------------------------------------------------- settings


@dataclass(frozen=True, slots=True)
class SessionAudio:
    """A session's audio as OpenAI's session object reports it."""

    spoken: bool = False
    """``output_modalities`` is ``["audio"]``: the core's audio is on."""
    input_format: str = PCM
    output_format: str = PCM
    transcription: dict[str, Any] | None = None
    turn_detection: dict[str, Any] | None = field(default_factory=lambda: dict(SERVER_VAD))
    noise_reduction: dict[str, Any] | None = None
    voice: str | None = None
    """The voice the core speaks in (its answer), or asked for before audio was on."""
    speed: float = 1.0

    def report(self) -> dict[str, Any]:
        return {
            "input": {
                "format": _format(self.input_format),
                "transcription": self.transcription,
                "turn_detection": self.turn_detection,
                "noise_reduction": self.noise_reduction,
            },
            "output": {
                "format": _format(self.output_format),
                "voice": self.voice,
                "speed": self.speed,
            },
        }

    @property
    def modalities(self) -> list[str]:
        return ["audio"] if self.spoken else ["text"]

    def core_rate(self, fmt: str) -> int:
        return PCM_RATE if fmt == PCM else G711_CORE_RATE


def _format(fmt: str) -> dict[str, Any]:
    return {"type": fmt, "rate": PCM_RATE} if fmt == PCM else {"type": fmt}


def audio_update(
    current: SessionAudio,
    modalities: list[str] | None,
    config: AudioConfig | None,
    *,
    voices: tuple[str, ...],
    g711: bool,
) -> tuple[SessionAudio, AudioRequest | bool | None]:
    """What a ``session.update`` makes of the session's audio, and v1's ``audio`` for it:
    ``None`` (no change), ``False`` (off) or the settings to run under.

    Raises:
        Refused: a format, modality or turn detection the gateway does not have.
    """
    updated = current
    if modalities is not None:
        if modalities not in (["text"], ["audio"]):
            why = f"output_modalities {modalities!r}: expected ['text'] or ['audio']"
            raise Refused("invalid_message", why)
        updated = replace(updated, spoken=modalities == ["audio"])
    if config is not None:
        updated = _apply(updated, config, voices, g711)
    if not updated.spoken:
        return updated, False if current.spoken else None
    if updated == current:
        return updated, None
    detection = updated.turn_detection
    request = AudioRequest(
        input_rate=updated.core_rate(updated.input_format),  # type: ignore[arg-type]
        output_rate=updated.core_rate(updated.output_format),  # type: ignore[arg-type]
        voice=updated.voice if updated.voice in voices else None,
        turn_detection="manual" if detection is None else _turn_detection(detection),
        silence_ms=None if detection is None else _silence_ms(detection),
    )
    return updated, request


def _apply(
    audio: SessionAudio, config: AudioConfig, voices: tuple[str, ...], g711: bool
) -> SessionAudio:
    changes: dict[str, Any] = {}
    if (given := config.input) is not None:
        if given.format is not None:
            changes["input_format"] = _checked(given.format, g711)
        if given.transcription is not UNSET:
            changes["transcription"] = given.transcription
        if given.turn_detection is not UNSET:
            detection = given.turn_detection
            if detection is not None:
                _turn_detection(detection)  # refused here when unknown
            changes["turn_detection"] = detection
        if given.noise_reduction is not UNSET:
            changes["noise_reduction"] = given.noise_reduction
    if (out := config.output) is not None:
        if out.format is not None:
            changes["output_format"] = _checked(out.format, g711)
        if out.voice is not None:
            voice = out.voice if isinstance(out.voice, str) else out.voice.get("id")
            if not isinstance(voice, str):
                raise Refused("invalid_message", "audio.output.voice: a name, or {id: name}")
            # A voice the gateway has not (OpenAI's ``ash``, say) leaves its own.
            changes["voice"] = voice if voice in voices else audio.voice
        if out.speed is not None:
            changes["speed"] = out.speed
    return replace(audio, **changes)


def _checked(fmt: AudioFormat, g711: bool) -> str:
    if fmt.type == PCM:
        if fmt.rate not in (None, PCM_RATE):
            raise Refused("invalid_message", f"audio/pcm is {PCM_RATE} Hz, not {fmt.rate}")
        return PCM
    if fmt.type in G711:
        if not g711:
            why = "G.711 needs the gateway's voice extra (numpy, soxr): send audio/pcm"
            raise Refused("unsupported", why)
        return fmt.type
    raise Refused(
        "invalid_message",
        f"audio format {fmt.type[:64]!r}: expected audio/pcm, audio/pcmu or audio/pcma",
    )


def _turn_detection(detection: dict[str, Any]) -> TurnDetectionMode:
    kind = detection.get("type")
    if kind == "server_vad":
        return "server_vad"
    if kind == "semantic_vad":
        return "semantic"
    expected = "expected server_vad, semantic_vad or null"
    raise Refused("invalid_message", f"turn_detection type {str(kind)[:64]!r}: {expected}")


def _silence_ms(detection: dict[str, Any]) -> int | None:
    silence = detection.get("silence_duration_ms")
    if detection.get("type") != "server_vad" or not isinstance(silence, int):
        return None
    return min(max(silence, 100), 5000)  # v1's bounds


# ----------------------------------------------------------------- the client's audio


def decode_audio(encoded: str) -> bytes:
    """An append's ``audio``: base64, else ``invalid_audio``."""
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise Refused("invalid_audio", f"audio must be base64: {exc}") from exc


def chunked(pcm: bytes, rate: int) -> list[bytes]:
    """PCM16 at ``rate`` in pieces of at most ``CHUNK_MS``."""
    step = rate * CHUNK_MS // 1000 * 2
    return [pcm[i : i + step] for i in range(0, len(pcm), step)]


# ----------------------------------------------------------------- the order of frames out


@dataclass(slots=True, eq=False)
class Wait:
    """Frames that can be made only once an item's audio is all out (its closing events);
    ``make`` makes them then."""

    make: Callable[[], list[bytes]]
    ready: bool = False


class OutputOrder:
    """The frames of responses, in order, where some wait for audio (``Wait``).

    ``put`` gives back the frames that can go now: all of them, unless a ``Wait`` not ready
    comes first; the rest go once it is (``release``). Frames that belong to no response
    (the user's speech, errors, the audio itself) never queue here.
    """

    __slots__ = ("_queue",)

    def __init__(self) -> None:
        self._queue: deque[bytes | Wait] = deque()

    def __bool__(self) -> bool:
        return bool(self._queue)

    def put(self, frames: list[bytes | Wait], out: list[bytes]) -> None:
        self._queue.extend(frames)
        self._drain(out)

    def release(self, wait: Wait, out: list[bytes]) -> None:
        wait.ready = True
        self._drain(out)

    def _drain(self, out: list[bytes]) -> None:
        queue = self._queue
        while queue:
            head = queue[0]
            if isinstance(head, Wait):
                if not head.ready:
                    return
                out += head.make()
            else:
                out.append(head)
            queue.popleft()
