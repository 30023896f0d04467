"""The upstream's audio: a deterministic synthesizer and an energy voice activity detector."""

from __future__ import annotations

import functools
import math
import sys
from array import array
from dataclasses import dataclass
from typing import Literal

OUTPUT_RATE = 24000  # both providers answer in PCM16 mono at 24 kHz
MS_PER_CHAR = 60


@functools.lru_cache(maxsize=32)  # deterministic, and tests compare with it
def tone(text: str, rate: int) -> bytes:
    """The default synthesizer: ``MS_PER_CHAR`` ms per character of a loud tone, PCM16 mono."""
    count = len(text) * MS_PER_CHAR * rate // 1000
    samples = array(
        "h",
        (
            int(6000 * math.sin(2 * math.pi * 220 * i / rate) + 2000 * math.sin(0.37 * i))
            for i in range(count)
        ),
    )
    return _little_endian(samples)


def _little_endian(samples: array[int]) -> bytes:
    if sys.byteorder == "big":
        samples.byteswap()
    return samples.tobytes()


def rms(pcm: bytes) -> float:
    samples = array("h")
    samples.frombytes(pcm[: len(pcm) // 2 * 2])
    if sys.byteorder == "big":
        samples.byteswap()
    return math.sqrt(sum(s * s for s in samples) / len(samples)) if samples else 0.0


def pcm_ms(pcm: bytes, rate: int) -> int:
    return len(pcm) * 1000 // (2 * rate)


@dataclass(frozen=True)
class VadEvent:
    kind: Literal["start", "stop"]
    ms: int
    """Position in all the audio this detector heard: where speech started or ended."""


class EnergyVad:
    """Speech is any 10 ms frame whose RMS reaches ``threshold``; ``silence_ms`` ends it."""

    FRAME_MS = 10

    def __init__(self, rate: int, threshold: float, silence_ms: int) -> None:
        self.rate, self.threshold, self.silence_ms = rate, threshold, silence_ms
        self.position_ms = 0
        self.speaking = False
        self._silent_ms = 0
        self._pending = b""

    def feed(self, pcm: bytes) -> list[VadEvent]:
        events: list[VadEvent] = []
        frame_bytes = self.rate * self.FRAME_MS // 1000 * 2
        self._pending += pcm
        while len(self._pending) >= frame_bytes:
            frame, self._pending = self._pending[:frame_bytes], self._pending[frame_bytes:]
            loud = rms(frame) >= self.threshold
            self.position_ms += self.FRAME_MS
            if loud:
                if not self.speaking:
                    events.append(VadEvent("start", self.position_ms - self.FRAME_MS))
                self.speaking, self._silent_ms = True, 0
            elif self.speaking:
                self._silent_ms += self.FRAME_MS
                if self._silent_ms >= self.silence_ms:
                    events += self.flush()
        return events

    def reset(self) -> None:
        """Forget the speech in progress (the buffer was cleared); the clock goes on."""
        self.speaking, self._silent_ms, self._pending = False, 0, b""

    def flush(self) -> list[VadEvent]:
        """End the speech now (the client said its audio stream ended)."""
        if not self.speaking:
            return []
        self.speaking = False
        return [VadEvent("stop", self.position_ms - self._silent_ms)]
