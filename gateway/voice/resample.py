"""Streaming sample-rate conversion of PCM16 audio, over libsoxr (the ``soxr`` package).

Between a session's rate (16000 or 24000 Hz) and an engine's (pocketsphinx and Silero take
16000 Hz; piper's voice speaks at 22050 Hz). soxr is imported when the first ``Resampler`` is
made, so importing this module costs nothing.
"""

from __future__ import annotations

import importlib
from typing import Any

from gateway.voice.base import check_pcm

__all__ = ["DITHER_SEED", "Resampler"]

DITHER_SEED = 1
"""The seed of every stream's dither (see ``Resampler``)."""


class Resampler:
    """Converts a stream of PCM16 mono from ``from_rate`` to ``to_rate``, chunk by chunk.

    soxr keeps a few milliseconds of filter history between chunks, so the output of a chunk
    lags its input slightly; ``flush()`` at the end returns the rest. The chunks joined are the
    whole signal resampled: its length is within a few samples of ``len * to / from``. Equal
    rates pass the audio through unchanged.

    Deterministic: the same chunks in give the same bytes out, every time. soxr's own PCM16
    output adds TPDF dither (±1 LSB) from a generator it seeds with the clock and the stream's
    address, so the same audio came out different each run (and pocketsphinx, on narrowband
    G.711 speech, heard different words in it). So soxr resamples in float32 here, and the
    samples go back to PCM16 with the same dither from a generator of fixed seed
    (``DITHER_SEED``): the dither stays (it keeps digital silence from being exact zeros, which
    pocketsphinx may hear worse: "hello" from 8 kHz, 33 of 40 heard without it against 23 of
    25 with it), but reproducibly.
    """

    def __init__(self, from_rate: int, to_rate: int) -> None:
        if from_rate <= 0 or to_rate <= 0:
            raise ValueError(f"sample rates must be positive: {from_rate} -> {to_rate}")
        self.from_rate = from_rate
        self.to_rate = to_rate
        self._numpy: Any = importlib.import_module("numpy")
        self._stream: Any = None
        self._dither: Any = self._numpy.random.default_rng(DITHER_SEED)
        if from_rate != to_rate:
            soxr: Any = importlib.import_module("soxr")  # no type hints in the package
            self._stream = soxr.ResampleStream(from_rate, to_rate, 1, dtype="float32", quality="HQ")

    def feed(self, pcm: bytes) -> bytes:
        """The next chunk of PCM16 at ``from_rate`` in; what is ready at ``to_rate`` out."""
        check_pcm(pcm)
        return self._resample(pcm, last=False)

    def flush(self) -> bytes:
        """The end of the stream: the samples soxr still holds. Feed nothing after it."""
        return self._resample(b"", last=True)

    def _resample(self, pcm: bytes, last: bool) -> bytes:
        if self._stream is None:
            return pcm
        np = self._numpy
        samples = np.frombuffer(pcm, dtype="<i2").astype(np.float32)
        resampled = self._stream.resample_chunk(samples, last=last)
        # TPDF dither of ±1 LSB, as soxr's, then rounded (see the class docstring).
        size = len(resampled)
        dithered = resampled + self._dither.random(size) - self._dither.random(size)
        out: bytes = np.clip(np.rint(dithered), -32768, 32767).astype("<i2").tobytes()
        return out
