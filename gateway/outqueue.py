"""A connection's outbound queue: bounded in bytes, merging text deltas when it backs up.

Pure: no I/O. When the client reads slowly the queue grows; past ``soft_size``
consecutive ``text.delta`` events of one response merge into one (the merged
event keeps the newest ``seq``, so ``seq`` still only increases); past
``hard_size`` ``push`` refuses and the caller closes the socket (1013): the
client resumes and gets the rest by replay.
"""

from __future__ import annotations

from collections import deque

from gateway.protocol import ServerMsg, TextDelta, encode

__all__ = ["OutboundQueue"]


class OutboundQueue:
    """Encoded events waiting for the socket."""

    def __init__(self, *, soft_size: int, hard_size: int) -> None:
        self._soft_size = soft_size
        self._hard_size = hard_size
        self._items: deque[tuple[TextDelta | None, bytes]] = deque()
        self.size = 0
        """Bytes queued now."""
        self.merged = 0
        """Deltas merged into a previous one so far."""

    def __len__(self) -> int:
        return len(self._items)

    def push(self, msg: ServerMsg | None, data: bytes) -> bool:
        """Queue an encoded event; ``False`` when the hard bound is passed (not queued)."""
        if isinstance(msg, TextDelta) and self.size > self._soft_size and self._items:
            last, last_data = self._items[-1]
            if last is not None and last.response_id == msg.response_id:
                merged = TextDelta(
                    seq=msg.seq, response_id=msg.response_id, delta=last.delta + msg.delta
                )
                merged_data = encode(merged)
                self._items[-1] = (merged, merged_data)
                self.size += len(merged_data) - len(last_data)
                self.merged += 1
                return self.size <= self._hard_size
        if self._items and self.size + len(data) > self._hard_size:
            return False  # an event alone may exceed the bound: it must get through somehow
        self._items.append((msg if isinstance(msg, TextDelta) else None, data))
        self.size += len(data)
        return True

    def pop(self) -> bytes | None:
        """The oldest queued event, or ``None``."""
        if not self._items:
            return None
        _, data = self._items.popleft()
        self.size -= len(data)
        return data

    def clear(self) -> None:
        self._items.clear()
        self.size = 0
