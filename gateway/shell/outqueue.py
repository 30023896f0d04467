"""A connection's outbound queue: bounded in bytes, merging text deltas when it backs up.

Pure: no I/O. When the client reads slowly the queue grows; past ``soft_size``
consecutive ``text.delta`` events of one response merge into one (the merged
event keeps the newest ``seq``, so ``seq`` still only increases); past
``hard_size`` ``push`` refuses and the caller closes the socket (1013): the
client resumes and gets the rest by replay.
"""

from __future__ import annotations

from collections import deque

import msgspec

from gateway.wire.v1 import ServerMsg, TextDelta, encode

_encode_text = msgspec.json.Encoder().encode

__all__ = ["OutboundQueue"]


class _Merged:
    """Consecutive deltas of one response, grown into one event, encoded on pop."""

    __slots__ = ("delta", "envelope", "pieces", "text_size")

    def __init__(self, delta: TextDelta, data: bytes) -> None:
        self.delta = delta
        self.pieces = [delta.delta]
        self.text_size = _text_size(delta.delta)
        """Encoded bytes of the pieces' text, without quotes (JSON escaping is per character)."""
        self.envelope = len(data) - self.text_size
        """Bytes of the newest delta's encoding without its text."""

    @property
    def size(self) -> int:
        """Bytes of this event once encoded."""
        return self.envelope + self.text_size

    def add(self, delta: TextDelta, data: bytes) -> None:
        added = _text_size(delta.delta)
        self.delta, self.envelope = delta, len(data) - added
        self.pieces.append(delta.delta)
        self.text_size += added


def _text_size(text: str) -> int:
    return len(_encode_text(text)) - 2


class OutboundQueue:
    """Encoded events waiting for the socket: each ``(data, delta)``, ``delta`` being the
    event itself when it is a ``text.delta`` (it may merge), or a ``_Merged``."""

    def __init__(self, *, soft_size: int, hard_size: int) -> None:
        self._soft_size = soft_size
        self._hard_size = hard_size
        self._items: deque[tuple[bytes, TextDelta | None] | _Merged] | None = None
        """Made when the first event waits: most sockets never queue (see gateway.flag)."""
        self.size = 0
        """Bytes queued now."""
        self.merged = 0
        """Deltas merged into a previous one so far."""

    def __len__(self) -> int:
        return len(self._items) if self._items is not None else 0

    def push(self, msg: ServerMsg | None, data: bytes) -> bool:
        """Queue an encoded event; ``False`` when the hard bound is passed (not queued)."""
        delta = msg if type(msg) is TextDelta else None
        if self._items is None:
            self._items = deque()
        if delta is not None and self.size > self._soft_size and self._items:
            # Merge without re-encoding the growing text: that would cost O(text) per delta.
            last = self._items[-1]
            newest = last.delta if isinstance(last, _Merged) else last[1]
            if newest is not None and newest.response_id == delta.response_id:
                if isinstance(last, tuple):
                    last = _Merged(newest, last[0])
                    self._items[-1] = last
                self.size -= last.size
                last.add(delta, data)
                self.size += last.size
                self.merged += 1
                return self.size <= self._hard_size
        if self._items and self.size + len(data) > self._hard_size:
            return False  # an event alone may exceed the bound: it must get through somehow
        self._items.append((data, delta))
        self.size += len(data)
        return True

    def pop(self) -> bytes | None:
        """The oldest queued event, or ``None``."""
        if not self._items:
            return None
        item = self._items.popleft()
        if isinstance(item, tuple):
            self.size -= len(item[0])
            return item[0]
        self.size -= item.size
        delta = item.delta
        return encode(
            TextDelta(seq=delta.seq, response_id=delta.response_id, delta="".join(item.pieces))
        )

    def clear(self) -> None:
        self._items = None
        self.size = 0
