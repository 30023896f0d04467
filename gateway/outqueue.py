"""A connection's outbound queue: bounded in bytes, merging text deltas when it backs up.

Pure: no I/O. When the client reads slowly the queue grows; past ``soft_size``
consecutive ``text.delta`` events of one response merge into one (the merged
event keeps the newest ``seq``, so ``seq`` still only increases); past
``hard_size`` ``push`` refuses and the caller closes the socket (1013): the
client resumes and gets the rest by replay.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import msgspec

from gateway.protocol import ServerMsg, TextDelta, encode

_encode_text = msgspec.json.Encoder().encode

__all__ = ["OutboundQueue"]


@dataclass
class _Item:
    """A queued event; consecutive deltas of one response grow one item, encoded on pop."""

    data: bytes
    delta: TextDelta | None = None
    pieces: list[str] = field(default_factory=list)
    text_size: int = 0
    """Encoded bytes of the pieces' text, without quotes (JSON escaping is per character)."""
    envelope: int = 0
    """Bytes of the newest delta's encoding without its text (once merged)."""

    @property
    def size(self) -> int:
        """Bytes of this event once encoded."""
        return len(self.data) if len(self.pieces) < 2 else self.envelope + self.text_size


def _text_size(text: str) -> int:
    return len(_encode_text(text)) - 2


class OutboundQueue:
    """Encoded events waiting for the socket."""

    def __init__(self, *, soft_size: int, hard_size: int) -> None:
        self._soft_size = soft_size
        self._hard_size = hard_size
        self._items: deque[_Item] = deque()
        self.size = 0
        """Bytes queued now."""
        self.merged = 0
        """Deltas merged into a previous one so far."""

    def __len__(self) -> int:
        return len(self._items)

    def push(self, msg: ServerMsg | None, data: bytes) -> bool:
        """Queue an encoded event; ``False`` when the hard bound is passed (not queued)."""
        delta = msg if isinstance(msg, TextDelta) else None
        last = self._items[-1] if self._items else None
        if (
            delta is not None
            and last is not None
            and last.delta is not None
            and last.delta.response_id == delta.response_id
            and self.size > self._soft_size
        ):
            # Merge without re-encoding the growing text: that would cost O(text) per delta.
            added = _text_size(delta.delta)
            self.size -= last.size
            last.delta, last.envelope = delta, len(data) - added
            last.pieces.append(delta.delta)
            last.text_size += added
            self.size += last.size
            self.merged += 1
            return self.size <= self._hard_size
        if self._items and self.size + len(data) > self._hard_size:
            return False  # an event alone may exceed the bound: it must get through somehow
        item = _Item(data=data, delta=delta)
        if delta is not None:
            item.pieces, item.text_size = [delta.delta], _text_size(delta.delta)
        self._items.append(item)
        self.size += len(data)
        return True

    def pop(self) -> bytes | None:
        """The oldest queued event, or ``None``."""
        if not self._items:
            return None
        item = self._items.popleft()
        self.size -= item.size
        if item.delta is not None and len(item.pieces) > 1:
            delta = item.delta
            return encode(
                TextDelta(seq=delta.seq, response_id=delta.response_id, delta="".join(item.pieces))
            )
        return item.data

    def clear(self) -> None:
        self._items.clear()
        self.size = 0
