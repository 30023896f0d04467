"""How the SDK's frames look on a socket: v1 JSON, or v1 as MessagePack.

``connect(url, protocol="msgpack")`` offers the subprotocol ``gateway.v1.msgpack`` before
``gateway.v1``; the gateway picks the first it speaks, and the socket's framing follows what
it picked (``websocket.subprotocol``), so a gateway without MessagePack is spoken to in JSON.
With MessagePack every frame is binary: messages and events are maps, and audio is a map
with its samples as raw bytes (``gateway.wire.msgpack``).
"""

from __future__ import annotations

from typing import Literal

import msgspec
from websockets.asyncio.client import ClientConnection

from client_sdk.connection import sent_fields, text_frame
from gateway.wire.audio_frame import AnswerAudio, decode_answer_audio
from gateway.wire.msgpack import SUBPROTOCOL_MSGPACK, AudioIn, AudioOut
from gateway.wire.v1 import ClientMsg, Outbound, decode_server

__all__ = ["Protocol", "audio_frame", "message_frame", "read_frame", "uses_msgpack"]

Protocol = Literal["json", "msgpack"]

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Outbound | AudioOut)


def uses_msgpack(websocket: ClientConnection) -> bool:
    return websocket.subprotocol == SUBPROTOCOL_MSGPACK


def message_frame(websocket: ClientConnection, msg: ClientMsg) -> str | bytes:
    """``msg`` as a frame of ``websocket``'s framing."""
    if uses_msgpack(websocket):
        return _encoder.encode(sent_fields(msg))
    return text_frame(msg)


def audio_frame(websocket: ClientConnection, pcm: bytes) -> bytes:
    """The user's audio as a frame of ``websocket``'s framing."""
    return _encoder.encode(AudioIn(pcm)) if uses_msgpack(websocket) else pcm


def read_frame(websocket: ClientConnection, frame: str | bytes) -> Outbound | AnswerAudio | None:
    """A frame from the gateway: an event, the answer's audio, or ``None`` for a kind this
    SDK does not know (newer than it)."""
    try:
        if uses_msgpack(websocket):
            if isinstance(frame, str):
                return None
            event: Outbound | AudioOut = _decoder.decode(frame)
            if isinstance(event, AudioOut):
                return AnswerAudio(
                    response_id=event.response_id,
                    seq=event.seq,
                    offset_ms=event.offset_ms,
                    pcm=event.pcm,
                    last=event.last,
                )
            return event
        if isinstance(frame, bytes):
            return decode_answer_audio(frame)
        return decode_server(frame)
    except (msgspec.DecodeError, ValueError):
        return None
