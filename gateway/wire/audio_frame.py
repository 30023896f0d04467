"""The binary frames of v1's audio: what a client sends is raw PCM, what it gets has a header.

A client's audio is PCM16 little-endian mono at the session's ``input_rate``, one binary
WebSocket frame per 20-100 ms, with nothing else in it. The answer's audio comes back in
binary frames, each a header and then PCM16 little-endian mono at ``output_rate``. The
header, all integers big-endian (docs/voice.md, "Audio frames"):

======  ====  ==============================================================================
offset  size  field
======  ====  ==============================================================================
0       1     kind: ``0x01``, the answer's audio
1       1     flags: bit 0 (``LAST``) set on the last frame of its segment, which may carry
              no PCM; the other bits are 0
2       2     the header's length in bytes: the PCM starts there (later fields go before it)
4       4     seq: the ``seq`` of the ``text.segment`` whose text this frame speaks
8       4     offset_ms: where the frame starts in the response's audio, in ms
12      1     n: the length of the response id
13      n     the response id, ASCII
======  ====  ==============================================================================
"""

from __future__ import annotations

import struct

import msgspec

__all__ = ["ANSWER_AUDIO", "LAST", "AnswerAudio", "decode_answer_audio", "encode_answer_audio"]

ANSWER_AUDIO = 0x01
"""The kind of a frame of the answer's audio."""
LAST = 0x01
"""The flag of the last frame of a segment's audio: a player or a protocol that closes what
a segment spoke (the OpenAI-compatible endpoint's items) knows it has all of it."""
_FIXED = struct.Struct(">BBHIIB")


class AnswerAudio(msgspec.Struct, frozen=True):
    """One binary frame of an answer's audio."""

    response_id: str
    seq: int
    offset_ms: int
    pcm: bytes
    last: bool = False
    """The last frame of its segment (``LAST``)."""


def encode_answer_audio(
    response_id: str, seq: int, offset_ms: int, pcm: bytes, *, last: bool = False
) -> bytes:
    """The binary frame that carries ``pcm`` (header and PCM)."""
    rid = response_id.encode("ascii")
    size = _FIXED.size + len(rid)
    flags = LAST if last else 0
    return _FIXED.pack(ANSWER_AUDIO, flags, size, seq, offset_ms, len(rid)) + rid + pcm


def decode_answer_audio(frame: bytes) -> AnswerAudio:
    """Read a frame ``encode_answer_audio`` made (or a later version of it).

    Raises:
        ValueError: not a frame of the answer's audio, or cut short.
    """
    if len(frame) < _FIXED.size:
        raise ValueError(f"an audio frame has at least {_FIXED.size} bytes, not {len(frame)}")
    kind, flags, size, seq, offset_ms, n = _FIXED.unpack_from(frame)
    if kind != ANSWER_AUDIO or size < _FIXED.size + n or size > len(frame):
        raise ValueError("not a frame of the answer's audio")
    rid = frame[_FIXED.size : _FIXED.size + n].decode("ascii")
    return AnswerAudio(
        response_id=rid, seq=seq, offset_ms=offset_ms, pcm=frame[size:], last=bool(flags & LAST)
    )
