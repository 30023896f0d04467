"""The speech engines' interfaces: speech-to-text, text-to-speech and voice activity.

No engine is imported here: ``gateway/voice/offline.py`` holds the offline ones (pocketsphinx,
piper, Silero), and another engine plugs in by implementing these protocols.

Audio everywhere is PCM16: signed 16-bit little-endian samples, mono, as ``bytes``. Each
protocol says which sample rates it takes. The session rates are 16000 and 24000 Hz, and
``gateway.voice.resample.Resampler`` converts between them (and any other pair) for an engine
that takes one rate only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import msgspec

__all__ = [
    "SAMPLE_WIDTH",
    "SpeechToText",
    "SpeechToTextEngine",
    "TextToSpeechEngine",
    "Transcript",
    "VoiceActivityDetector",
    "check_pcm",
]

SAMPLE_WIDTH = 2
"""Bytes per PCM16 sample."""


def check_pcm(pcm: bytes) -> None:
    """Raise ``ValueError`` unless ``pcm`` is whole PCM16 samples (an even number of bytes)."""
    if len(pcm) % SAMPLE_WIDTH:
        raise ValueError(
            f"PCM16 audio must be whole 2-byte samples: got {len(pcm)} bytes, an odd length"
        )


class Transcript(msgspec.Struct, frozen=True):
    """What the user said so far (``final=False``: a partial that may still change) or in
    the end (``final=True``)."""

    text: str
    final: bool


class SpeechToText(Protocol):
    """One utterance being transcribed: audio in as it arrives, text out.

    Not thread-safe: one stream is fed from one place at a time.
    """

    def feed(self, pcm: bytes) -> Transcript | None:
        """Take the next chunk of PCM16 at the engine's ``sample_rate`` (any whole number of
        samples, 20 to 100 ms typically). Return a partial transcript when the text changed,
        else ``None``. Odd-length ``pcm`` raises ``ValueError``."""
        ...

    def finish(self) -> Transcript:
        """End the utterance (at the end of the user's turn) and return the final transcript;
        the stream takes no more audio after it."""
        ...


class SpeechToTextEngine(Protocol):
    """A loaded speech recognizer, which opens one stream per utterance."""

    @property
    def sample_rate(self) -> int:
        """The rate ``SpeechToText.feed`` takes. A session at another rate resamples first."""
        ...

    def stream(self) -> SpeechToText:
        """A new utterance."""
        ...


class TextToSpeechEngine(Protocol):
    """A loaded speech synthesizer."""

    def synthesize(self, text: str, sample_rate: int, voice: str | None = None) -> Iterator[bytes]:
        """Speak ``text`` in ``voice`` (``None``: the engine's own): PCM16 mono chunks at
        ``sample_rate`` (16000 and 24000 Hz at least), the first as early as the engine can
        make it (a sentence at a time, for instance), so playback can start while the rest
        is synthesized. An unsupported rate or a voice the engine lacks raises
        ``ValueError``."""
        ...


class VoiceActivityDetector(Protocol):
    """Frame by frame, how likely the audio is speech (``gateway.voice.turns`` turns that
    into the starts and ends of a turn)."""

    @property
    def sample_rate(self) -> int:
        """The rate the frames must be at."""
        ...

    @property
    def frame_bytes(self) -> int:
        """The exact size of a frame, in bytes."""
        ...

    def speech_probability(self, frame: bytes) -> float:
        """The probability (0 to 1) that ``frame`` (exactly ``frame_bytes`` of PCM16 at
        ``sample_rate``) is speech. A frame of another size raises ``ValueError``. Stateful:
        the detector sees frames in order, one stream per detector."""
        ...
