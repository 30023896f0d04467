"""The seam between the session core and a wire protocol: a codec per connection.

The core speaks in v1 messages (``gateway.wire.v1``): it takes ``Inbound`` structs and
sends ``Outbound`` events. A codec translates another wire protocol to and from them,
for one socket: ``decode`` turns a client frame into the core messages it stands for,
``encode`` turns an event the session sent into the frames of the protocol. It may keep
state (ids the protocol needs, items it holds until the client asks for a response),
so there is one codec object per connection, used from that connection's task only.

v1 itself takes no codec object on its hot path: the v1 endpoint decodes with
``gateway.wire.v1.decode_client`` and writes the session's bytes as they are (a
``Connection`` without a codec). ``V1Codec`` says what that path is, as a codec, for
tests and for code that wants to treat every protocol alike. The OpenAI Realtime
endpoint uses ``gateway.wire.openai.codec.OpenAIRealtimeCodec``.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from gateway.wire.v1 import DecodeFailure, Inbound, ServerMsg, decode_client

__all__ = ["BinaryFrame", "Codec", "Decoded", "V1Codec"]


class BinaryFrame(bytes):
    """A frame to send as a binary WebSocket frame (the answer's audio, a MessagePack
    event); every other frame is a text frame, UTF-8 JSON."""

    __slots__ = ()


class Decoded(NamedTuple):
    """What one client frame stands for."""

    messages: list[Inbound | DecodeFailure | bytes]
    """For the core, in order: none, one or more (``bytes``: the user's audio, PCM16 at the
    session's rate, as v1's binary frames carry it)."""
    replies: list[bytes]
    """Frames the codec answers at once, without the core (an item echoed back, an
    error about the frame itself)."""


class Codec(Protocol):
    """A wire protocol for one connection, in front of the v1 session core."""

    def decode(self, text: str) -> Decoded:
        """The core messages a client text frame stands for, and the frames to send back
        at once. Never raises on bad input: it becomes an error, as a reply or a
        ``DecodeFailure`` for the core."""

    def encode(self, msg: ServerMsg, data: bytes) -> list[bytes]:
        """The frames of this protocol for one event the session sent (``msg``, and
        ``data``, its v1 JSON): none, one or more, in order."""

    def encode_audio(self, frame: bytes) -> list[bytes]:
        """The frames of this protocol for one frame of an answer's audio (v1's binary
        frame, ``gateway.wire.audio_frame``): none, one or more, in order."""


class V1Codec:
    """v1 as a codec: frames are the core's messages and events as they are."""

    def decode(self, text: str) -> Decoded:
        return Decoded([decode_client(text)], [])

    def encode(self, msg: ServerMsg, data: bytes) -> list[bytes]:
        return [data]

    def encode_audio(self, frame: bytes) -> list[bytes]:
        return [frame]
