"""Speech engines for voice sessions: the first part of voice on the socket (docs/voice.md).

``base`` holds the protocols (``SpeechToTextEngine``, ``TextToSpeechEngine``,
``VoiceActivityDetector``), ``turns`` the pure turn detector, ``resample`` the streaming
resampler, ``offline`` the offline engines (pocketsphinx, piper, Silero; the ``voice`` extra),
``remote`` the engines over the OpenAI-compatible audio APIs (``/audio/transcriptions``, not
streaming, and ``/audio/speech``), ``workers`` the pool of worker processes that runs the
engines off the event loop (``worker_main`` is their entry and wire format).
Importing this package loads no engine: each loads its package when it is built.
"""

from __future__ import annotations

from gateway.voice.base import (
    SpeechToText,
    SpeechToTextEngine,
    TextToSpeechEngine,
    Transcript,
    VoiceActivityDetector,
)
from gateway.voice.turns import SpeechStarted, SpeechStopped, TurnDetector, TurnEvent

__all__ = [
    "SpeechStarted",
    "SpeechStopped",
    "SpeechToText",
    "SpeechToTextEngine",
    "TextToSpeechEngine",
    "Transcript",
    "TurnDetector",
    "TurnEvent",
    "VoiceActivityDetector",
]
