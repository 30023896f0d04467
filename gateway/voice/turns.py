"""Where the user's turn starts and stops, from a voice activity detector's probabilities.

Pure: no engine, no I/O, no clock. Time is the audio itself: the detector counts the samples
of the frames it was given, so the same probabilities always give the same events, however
fast or late the audio arrives.

The rule (``server_vad``):

- A turn **starts** at the first frame of a run of speech frames (probability at or above
  ``threshold``) that lasts ``min_speech_ms``. A shorter blip (a click, a cough) is not a
  start. ``SpeechStarted`` is emitted when the run has lasted that long, with the offset of the
  run's first frame.
- It **stops** at the end of its last speech frame, once ``silence_ms`` of non-speech frames
  followed. ``SpeechStopped`` is emitted then (so ``silence_ms`` after its offset) and a pause
  shorter than ``silence_ms`` does not end the turn: at the default 500 ms, a 700 ms pause
  mid-sentence splits the turn in two; at 800 ms it does not.

Offsets are whole milliseconds of audio since the detector began.
"""

from __future__ import annotations

import msgspec

__all__ = ["SpeechStarted", "SpeechStopped", "TurnDetector", "TurnEvent"]


class SpeechStarted(msgspec.Struct, frozen=True):
    """The user started speaking ``offset_ms`` into the audio."""

    offset_ms: int


class SpeechStopped(msgspec.Struct, frozen=True):
    """The user stopped speaking ``offset_ms`` into the audio: the end of the turn."""

    offset_ms: int


TurnEvent = SpeechStarted | SpeechStopped


class TurnDetector:
    """Turns a stream of per-frame speech probabilities into turn starts and stops.

    ``frame_samples`` is the size of each frame the probabilities are for (512 for Silero at
    16 kHz: 32 ms); ``sample_rate`` converts samples to milliseconds.
    """

    def __init__(
        self,
        sample_rate: int,
        frame_samples: int,
        silence_ms: int = 500,
        threshold: float = 0.5,
        min_speech_ms: int = 100,
    ) -> None:
        if sample_rate <= 0 or frame_samples <= 0:
            raise ValueError("sample_rate and frame_samples must be positive")
        if silence_ms < 0 or min_speech_ms < 0:
            raise ValueError("silence_ms and min_speech_ms must not be negative")
        self.sample_rate = sample_rate
        self.frame_samples = frame_samples
        self.threshold = threshold
        # Durations in samples, rounded up: the detector compares whole frames' samples.
        self._silence = -(-silence_ms * sample_rate // 1000)
        self._min_speech = -(-min_speech_ms * sample_rate // 1000)
        self._position = 0
        """Samples seen so far: the end of the last frame pushed."""
        self._run_start: int | None = None
        """Where the current run of speech frames began, while it is not yet a turn."""
        self._speaking = False
        self._speech_end = 0
        """The end of the last speech frame of the turn in progress."""

    @property
    def speaking(self) -> bool:
        """Whether a turn has started and not yet stopped."""
        return self._speaking

    @property
    def offset_ms(self) -> int:
        """Milliseconds of audio seen so far."""
        return self._ms(self._position)

    def push(self, probability: float) -> list[TurnEvent]:
        """Take the next frame's speech probability; return the events it completes (none,
        or one: a start or a stop)."""
        start, self._position = self._position, self._position + self.frame_samples
        speech = probability >= self.threshold
        if self._speaking:
            if speech:
                self._speech_end = self._position
            elif self._position - self._speech_end >= self._silence:
                self._speaking = False
                return [SpeechStopped(self._ms(self._speech_end))]
            return []
        if not speech:
            self._run_start = None  # a blip shorter than min_speech_ms
            return []
        if self._run_start is None:
            self._run_start = start
        if self._position - self._run_start < self._min_speech:
            return []
        self._speaking, self._speech_end = True, self._position
        run_start, self._run_start = self._run_start, None
        return [SpeechStarted(self._ms(run_start))]

    def _ms(self, samples: int) -> int:
        return samples * 1000 // self.sample_rate
