"""What one node passes to another about a session: what its server tools report.

A server tool that was running when its session moved to another node (a resume there,
a shutdown here) finishes where it runs; its outcome is posted to the session's inbox in
the store (``Store.post``) and the owning node applies it as if the tool had run there.
"""

from __future__ import annotations

import msgspec

from gateway.core.event import ToolNews

__all__ = ["Routed", "decode_routed", "encode_routed"]

Routed = ToolNews

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Routed)


def encode_routed(event: Routed) -> bytes:
    return _encoder.encode(event)


def decode_routed(data: bytes) -> Routed | None:
    """The event ``encode_routed`` wrote, or ``None`` if ``data`` is not one."""
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError:
        return None
