"""``gateway.v1.msgpack``: v1's messages and events as binary MessagePack frames.

The same protocol as v1 JSON (``gateway.wire.v1``): the same message and event types and
fields, the same ``seq``, acks, resume and replay, and the same guarantees; only the framing
differs. Every frame is a binary WebSocket frame holding one MessagePack map with its
``type``, as the JSON object would be. A client asks for it by offering the WebSocket
subprotocol ``gateway.v1.msgpack`` on ``/v1/realtime``.

Audio, which v1 JSON carries in binary frames of its own, is a map here too, its samples raw
bytes (MessagePack ``bin``, no base64): the client sends ``{"type": "audio", "pcm": <bin>}``
(PCM16 at the session's ``input_rate``), and the answer's audio comes as
``{"type": "audio", "response_id", "seq", "offset_ms", "last", "pcm": <bin>}``, the fields of
v1's binary answer frame (``gateway.wire.audio_frame``).

A codec over the core's vocabulary (``gateway.wire.codec``): the core sends its events, and
logs them, as v1 JSON; this codec encodes each event it is given (``msg``) as MessagePack.
Replay decodes the logged JSON back into events first (``Connection``).
"""

from __future__ import annotations

import msgspec

from gateway.wire.audio_frame import decode_answer_audio
from gateway.wire.codec import BinaryFrame, Decoded
from gateway.wire.v1 import CLIENT_MESSAGE_TYPES, DecodeFailure, Inbound, ServerMsg, why_refused

__all__ = ["SUBPROTOCOL_MSGPACK", "AudioIn", "AudioOut", "MsgpackCodec", "decode_client_msgpack"]

SUBPROTOCOL_MSGPACK = "gateway.v1.msgpack"


class AudioIn(msgspec.Struct, tag="audio", forbid_unknown_fields=True):
    """The user's audio: PCM16 little-endian mono at the session's ``input_rate``."""

    pcm: bytes


class AudioOut(msgspec.Struct, tag="audio", kw_only=True):
    """A frame of the answer's audio (v1's binary answer frame, as a map)."""

    response_id: str
    seq: int
    offset_ms: int
    last: bool = False
    pcm: bytes


_decoder = msgspec.msgpack.Decoder(Inbound | AudioIn)
_encoder = msgspec.msgpack.Encoder()
_TOO_DEEP = DecodeFailure(code="invalid_message", message="invalid MessagePack: nested too deeply")


def decode_client_msgpack(data: bytes) -> Inbound | DecodeFailure | bytes:
    """A client frame: a message, the user's audio (its PCM), or why it is refused; never
    raises on bad input."""
    try:
        decoded = _decoder.decode(data)
    except RecursionError:
        return _TOO_DEEP
    except msgspec.ValidationError as exc:
        try:
            raw = msgspec.msgpack.decode(data)
        except (msgspec.DecodeError, RecursionError):
            return DecodeFailure(code="invalid_message", message=f"invalid MessagePack: {exc}")
        if isinstance(raw, dict) and raw.get("type") == "audio":
            return DecodeFailure(code="invalid_audio", message=f"invalid audio: {exc}")
        refused = why_refused(raw, str(exc), "MessagePack map")
        if refused.code == "unknown_type":  # audio is a message here too
            known = ", ".join(sorted({*CLIENT_MESSAGE_TYPES, "audio"}))
            head = refused.message.split("; expected", 1)[0]
            refused = msgspec.structs.replace(refused, message=f"{head}; expected one of: {known}")
        return refused
    except msgspec.DecodeError as exc:
        return DecodeFailure(code="invalid_message", message=f"invalid MessagePack: {exc}")
    return decoded.pcm if isinstance(decoded, AudioIn) else decoded


_TEXT_FRAME = DecodeFailure(
    code="invalid_message",
    message="text frames are not read on gateway.v1.msgpack: send binary MessagePack frames",
)


class MsgpackCodec:
    """v1 as MessagePack, for one socket (stateless: one instance could serve all)."""

    binary = True

    def decode(self, frame: str | bytes) -> Decoded:
        if isinstance(frame, str):
            return Decoded([_TEXT_FRAME], [])
        return Decoded([decode_client_msgpack(frame)], [])

    def encode(self, msg: ServerMsg, data: bytes) -> list[bytes]:
        return [BinaryFrame(_encoder.encode(msg))]

    def encode_audio(self, frame: bytes) -> list[bytes]:
        audio = decode_answer_audio(frame)
        out = AudioOut(
            response_id=audio.response_id,
            seq=audio.seq,
            offset_ms=audio.offset_ms,
            last=audio.last,
            pcm=audio.pcm,
        )
        return [BinaryFrame(_encoder.encode(out))]
