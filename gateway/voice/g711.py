"""G.711 (μ-law and A-law, 8 kHz): telephony's audio, as the OpenAI-compatible endpoint takes
and gives it (``audio/pcmu``, ``audio/pcma``), converted from and to a session's PCM16.

The laws follow ITU-T G.711 as the reference implementation writes them (Sun's ``g711.c``):
each 8-bit code is a sign, a 3-bit segment and a 4-bit step. Decoding is one table of 256
samples, encoding one of 65,536 codes (built once, on first use, in about 60 ms), so a
100 ms frame costs a few tens of microseconds. The rate changes (8 kHz to the session's 16 or
24 kHz and back) go through ``gateway.voice.resample`` (soxr, the ``voice`` extra).
"""

from __future__ import annotations

import functools
import sys
from array import array
from typing import Literal

from gateway.voice.resample import Resampler

__all__ = ["G711_RATE", "Law", "converter", "decode", "encode"]

G711_RATE = 8000
Law = Literal["pcmu", "pcma"]

_BIAS = 0x84
_CLIP = 32635
_A_SEGMENT_ENDS = (0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF)


def _mu_encode(sample: int) -> int:
    sign = 0x80 if sample < 0 else 0
    magnitude = min(abs(sample), _CLIP) + _BIAS
    exponent = max(magnitude.bit_length() - 8, 0)
    mantissa = (magnitude >> (exponent + 3)) & 0x0F
    return ~(sign | exponent << 4 | mantissa) & 0xFF


def _mu_decode(code: int) -> int:
    code = ~code & 0xFF
    magnitude = (((code & 0x0F) << 3) + _BIAS) << ((code >> 4) & 0x07)
    return _BIAS - magnitude if code & 0x80 else magnitude - _BIAS


def _a_encode(sample: int) -> int:
    value = sample >> 3  # A-law codes 13 bits
    if value >= 0:
        mask = 0xD5
    else:
        mask, value = 0x55, -value - 1
    segment = next((n for n, end in enumerate(_A_SEGMENT_ENDS) if value <= end), 8)
    if segment >= 8:
        return 0x7F ^ mask
    code = segment << 4 | ((value >> 1) if segment < 2 else (value >> segment)) & 0x0F
    return code ^ mask


def _a_decode(code: int) -> int:
    code ^= 0x55
    value = (code & 0x0F) << 4
    segment = (code & 0x70) >> 4
    if segment == 0:
        value += 8
    elif segment == 1:
        value += 0x108
    else:
        value = (value + 0x108) << (segment - 1)
    return value if code & 0x80 else -value


@functools.cache
def _decode_table(law: Law) -> tuple[int, ...]:
    decode_one = _mu_decode if law == "pcmu" else _a_decode
    return tuple(decode_one(code) for code in range(256))


@functools.cache
def _encode_table(law: Law) -> bytes:
    """The code of every PCM16 sample, indexed by the sample as an unsigned 16-bit number."""
    encode_one = _mu_encode if law == "pcmu" else _a_encode
    return bytes(encode_one(n - 65536 if n >= 32768 else n) for n in range(65536))


def decode(law: Law, data: bytes) -> bytes:
    """G.711 codes to PCM16 little-endian, sample for sample."""
    table = _decode_table(law)
    samples = array("h", (table[code] for code in data))
    if sys.byteorder == "big":
        samples.byteswap()
    return samples.tobytes()


def encode(law: Law, pcm: bytes) -> bytes:
    """PCM16 little-endian (whole samples) to G.711 codes, sample for sample."""
    samples = array("H", pcm)
    if sys.byteorder == "big":
        samples.byteswap()
    table = _encode_table(law)
    return bytes(table[n] for n in samples)


class _Decoder:
    """G.711 at 8 kHz in, PCM16 at ``rate`` out."""

    def __init__(self, law: Law, rate: int) -> None:
        self._law = law
        self._resampler = Resampler(G711_RATE, rate)

    def feed(self, data: bytes, *, last: bool = False) -> bytes:
        pcm = self._resampler.feed(decode(self._law, data))
        return pcm + self._resampler.flush() if last else pcm


class _Encoder:
    """PCM16 at ``rate`` in, G.711 at 8 kHz out; ``last`` flushes the resampler's tail (the
    end of a segment of speech), so that nothing of it waits for the next."""

    def __init__(self, law: Law, rate: int) -> None:
        self._law, self._rate = law, rate
        self._resampler = Resampler(rate, G711_RATE)

    def feed(self, data: bytes, *, last: bool = False) -> bytes:
        pcm = self._resampler.feed(data)
        if last:
            pcm += self._resampler.flush()
            self._resampler = Resampler(self._rate, G711_RATE)
        return encode(self._law, pcm)


def converter(law: Law, rate: int, *, inbound: bool) -> _Decoder | _Encoder:
    """A stream converter between G.711 ``law`` and PCM16 at ``rate``: from G.711
    (``inbound``, the client's audio) or to it (the answer's)."""
    return _Decoder(law, rate) if inbound else _Encoder(law, rate)
