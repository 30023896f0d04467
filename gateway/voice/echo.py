"""The echo gate: is the speech the microphone hears the answer's own audio coming back?

While an answer plays on the user's device, its speaker's sound reaches the microphone, and
the VAD hears speech: without a gate, the answer would interrupt itself (barge-in). The gate
keeps the audio the device is playing (the *reference*) and tells whether a window of input
audio is that reference, scaled and delayed, by normalized cross-correlation (NCC): the
cosine between the window and each same-length stretch of the reference. An echo (at any
level, with light noise) scores near 1; other speech (even the same voice) under 0.65; the
user speaking over the echo at the same level about 0.7 (half the window's energy is the
echo's: NCC = 1/sqrt(2)), hence the ``THRESHOLD`` of 0.8. It assumes the echo is mostly the
reference itself: a strong room response, or a device's echo canceller's nonlinear residue,
scores lower (not measured here).

The server sends the answer's audio faster than real time, so the echo of the reference's
sample k comes back at an unknown later time: the first search covers the whole reference
(its last 60 s), by FFT; then, given where each window ends in the input (``end``), the gate
tracks the lag between input and reference and searches only ±250 ms around it, falling back
to the whole reference when that fails.

Measured on the 2-core VM, a 256 ms window at 16 kHz: about 0.4 ms a call while tracking,
whatever the reference's length; a full search about 4 to 8 ms for a 5 s reference, 11 ms for
10 s, 65 to 90 ms for the 60 s cap (the reference's FFT is kept between searches).
A full search that finds nothing is repeated at most every ``SEARCH_EVERY_MS`` of input
(given ``end``), so the user talking over a long answer costs at most a third of that per
32 ms frame.

Pure numpy (and soxr, through ``Resampler``, for a reference at another rate): the ``voice``
extra. Not thread-safe; one gate per input stream.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from gateway.voice.base import check_pcm
from gateway.voice.resample import Resampler

__all__ = ["MAX_REFERENCE_S", "SEARCH_EVERY_MS", "THRESHOLD", "TRACK_MS", "EchoGate"]

THRESHOLD = 0.8
"""The NCC from which a window is echo. Measured (tests/test_voice_echo.py) on piper's voice:
the echo scaled by 0.3 with noise 40 dB under it scores about 1.0; other phrases score at most
0.63; the user's phrase over the echo scores up to 0.71 where the user's window has as much
energy as the echo's, and none of 65 windows with at least 0.7 of its energy was echo."""
MAX_REFERENCE_S = 60
"""The reference kept: its last 60 s."""
TRACK_MS = 250
"""The search around the lag last found, each way."""
SEARCH_EVERY_MS = 96
"""After a full search found nothing, the next waits for this much more input (with ``end``):
the user talking over a long answer would otherwise cost a full search every 32 ms frame."""
_FLOOR = 1e-4
"""The RMS (of full scale 1) under which audio is silence: no echo, no match."""

_Floats = npt.NDArray[np.float64]


class EchoGate:
    """Whether input audio at ``sample_rate`` is the reference's echo (module docstring)."""

    def __init__(self, sample_rate: int) -> None:
        if sample_rate <= 0:
            raise ValueError(f"sample_rate must be positive, not {sample_rate}")
        self.sample_rate = sample_rate
        self._resamplers: dict[int, Resampler] = {}
        self._parts: list[_Floats] = []
        """Reference appended since ``_reference`` was last joined."""
        self._reference: _Floats = np.zeros(0)
        self._dropped = 0
        """Reference samples dropped from the front (the cap): absolute index of [0]."""
        self._lag: int | None = None
        """The input's end minus the reference's end at the last match, in samples."""
        self._searched: int | None = None
        """The input's end at the last full search that found nothing."""
        self._cache: _Floats | None = None
        """``_padded``'s last answer."""
        self._spectrum: _Spectrum | None = None
        """The FFT and energies of ``_cache``, for full searches."""

    @property
    def has_reference(self) -> bool:
        """Whether any reference audio is kept."""
        return bool(self._parts) or self._reference.size > 0

    def reference(self, pcm: bytes, sample_rate: int) -> None:
        """Append audio the device plays: PCM16 at ``sample_rate`` (resampled to the gate's
        rate, one streaming resampler per input rate). Odd-length ``pcm`` raises
        ``ValueError``."""
        check_pcm(pcm)
        if sample_rate != self.sample_rate:
            resampler = self._resamplers.get(sample_rate)
            if resampler is None:
                resampler = self._resamplers[sample_rate] = Resampler(sample_rate, self.sample_rate)
            pcm = resampler.feed(pcm)
        if pcm:
            self._parts.append(_floats(pcm))

    def reset(self) -> None:
        """Drop the reference (a new answer starts, or the playback was flushed)."""
        self._resamplers.clear()
        self._parts.clear()
        self._reference = np.zeros(0)
        self._dropped = 0
        self._lag = None
        self._searched = None
        self._cache = None
        self._spectrum = None

    def is_echo(self, window: bytes, *, end: int | None = None) -> bool:
        """Whether ``window`` (recent input, PCM16 at ``sample_rate``, about 256 ms) is the
        reference's echo. ``end``, the index in the input stream of the sample after the
        window, lets the gate track the lag (module docstring); without it, every call
        searches the whole reference. False with no reference, or for silence."""
        check_pcm(window)
        if not self.has_reference or not window:
            return False
        x = _floats(window)
        if np.sqrt(np.mean(x * x)) < _FLOOR:
            return False
        n = x.size
        padded = self._padded(n)
        last = padded.size - n  # the last start of a window in ``padded``
        score, start = -1.0, 0
        if end is not None and self._lag is not None:
            track = self.sample_rate * TRACK_MS // 1000
            # A stretch starting at ``s`` in ``padded`` ends at the absolute reference index
            # ``s + self._dropped`` (the front pad is the window's length): where it should be.
            predicted = end - self._lag - self._dropped
            lo, hi = max(predicted - track, 0), min(predicted + track, last)
            if lo <= hi:
                score, start = _best(x, padded[lo : hi + n])
                start += lo
        if score < THRESHOLD and self._may_search(end):
            if self._spectrum is None:  # the reference's half of the search, kept
                self._spectrum = _Spectrum(padded)
            score, start = _best(x, padded, self._spectrum)
            if score < THRESHOLD:
                self._searched = end
        if score < THRESHOLD:
            return False
        if end is not None:  # the match's end, as an absolute reference index
            self._lag = end - (start + self._dropped)
        return True

    def _may_search(self, end: int | None) -> bool:
        """Whether a full search is due (``SEARCH_EVERY_MS``)."""
        if end is None or self._searched is None:
            return True
        return end - self._searched >= self.sample_rate * SEARCH_EVERY_MS // 1000

    def _padded(self, n: int) -> _Floats:
        """The reference as one array, capped at its last ``MAX_REFERENCE_S``, with ``n``
        zeros on both sides: a window that holds the echo's start or end (and the silence
        around it) still finds its match. Kept until the reference changes."""
        if self._parts or self._cache is None or self._cache.size != self._reference.size + 2 * n:
            pad = np.zeros(n)
            self._cache = np.concatenate([pad, self._joined(), pad])
            self._spectrum = None
        return self._cache

    def _joined(self) -> _Floats:
        """The reference as one array, capped at its last ``MAX_REFERENCE_S``."""
        if self._parts:
            joined = np.concatenate([self._reference, *self._parts])
            self._parts.clear()
            excess = joined.size - MAX_REFERENCE_S * self.sample_rate
            if excess > 0:
                joined = joined[excess:]
                self._dropped += excess
            self._reference = joined
        return self._reference


def _floats(pcm: bytes) -> _Floats:
    """PCM16 as floats of full scale 1."""
    return np.frombuffer(pcm, dtype="<i2").astype(np.float64) / 32768.0


class _Spectrum:
    """What a search needs of the reference alone: its FFT (at a power-of-two size, the
    fastest) and its running energy."""

    def __init__(self, reference: _Floats) -> None:
        self.size = 1 << max(reference.size - 1, 1).bit_length()
        self.fft = np.fft.rfft(reference, self.size)
        self.energy = np.concatenate([[0.0], np.cumsum(reference * reference)])


def _best(x: _Floats, reference: _Floats, known: _Spectrum | None = None) -> tuple[float, int]:
    """The highest NCC of ``x`` against each stretch of ``reference`` as long as it, and
    where that stretch starts (``reference`` is at least as long as ``x``; ``known``, its
    ``_Spectrum`` if kept)."""
    n = x.size
    count = reference.size - n + 1
    power = float(np.dot(x, x))
    if count <= 0 or power <= 0.0:
        return -1.0, 0
    ref = _Spectrum(reference) if known is None else known
    size, energy = ref.size, ref.energy
    correlation = np.fft.irfft(np.conj(np.fft.rfft(x, size)) * ref.fft, size)[:count]
    stretch = np.maximum(energy[n:] - energy[:count], 0.0)
    # A stretch of (near) silence matches nothing: its NCC would be rounding noise.
    quiet = stretch < n * _FLOOR * _FLOOR
    ncc = correlation / (np.sqrt(np.maximum(stretch, 1e-30)) * np.sqrt(power))
    ncc[quiet] = 0.0
    at = int(np.argmax(ncc))
    return float(ncc[at]), at
