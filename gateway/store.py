"""Where sessions keep what must survive their socket: the event log and the call ledger.

The ``Store`` interface is async and keyed by session id, so that a networked
implementation (Redis, for sessions that move between gateway nodes) can stand
behind it; nothing here assumes one process. ``MemoryStore`` is the in-process
implementation.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Protocol

import msgspec

from gateway.call import Call

__all__ = ["MemoryStore", "SessionRecord", "Store"]


class SessionRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What identifies a session, whoever serves it."""

    session_id: str
    token_hash: str
    """SHA-256 of the resume token, hex: the token itself is never stored."""
    agent: str
    created_at: float
    principal: str = "anonymous"
    """Who created the session (``Principal.name``): only they may resume it, and session
    quotas count by it."""


class Store(Protocol):
    """Session records, event logs and call ledgers."""

    async def create_session(self, record: SessionRecord) -> None: ...

    async def get_session(self, session_id: str) -> SessionRecord | None: ...

    async def end_session(self, session_id: str) -> None:
        """Forget the session's data; remember that it existed (``ended`` says so)."""

    async def ended(self, session_id: str) -> bool: ...

    async def append_event(self, session_id: str, seq: int, data: bytes) -> None:
        """Log an encoded server event. Bounded: the oldest events may be dropped."""

    async def events_after(self, session_id: str, seq: int) -> list[bytes] | None:
        """Every logged event after ``seq``, in order; ``None`` if some are gone (a gap)."""

    async def trim_events(self, session_id: str, upto_seq: int) -> None:
        """Drop the events up to ``upto_seq`` (the client has them)."""

    async def save_call(self, session_id: str, call: Call) -> None: ...

    async def load_calls(self, session_id: str) -> list[Call]: ...

    async def ping(self) -> None:
        """Return if the store answers (``/readyz``); raise if it cannot serve."""


@dataclass
class _Log:
    events: deque[tuple[int, bytes]] = field(default_factory=deque)
    size: int = 0
    dropped_upto: int = 0
    """Highest seq no longer kept: a replay from before it has a gap."""


class MemoryStore:
    """A ``Store`` in this process's memory, bounded per session.

    Args:
        max_events: events kept per session (``replay_max_events``).
        max_size: bytes of events kept per session (``replay_max_size``).
        max_calls: settled calls kept per session for duplicate detection.
        max_ended: ended session ids remembered (to tell "expired" from "unknown").
    """

    def __init__(
        self,
        *,
        max_events: int = 10_000,
        max_size: int = 4 * 2**20,
        max_calls: int = 1_000,
        max_ended: int = 100_000,
    ) -> None:
        self._max_events = max_events
        self._max_size = max_size
        self._max_calls = max_calls
        self._max_ended = max_ended
        self._records: dict[str, SessionRecord] = {}
        self._logs: dict[str, _Log] = {}
        self._calls: dict[str, OrderedDict[str, Call]] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()

    async def create_session(self, record: SessionRecord) -> None:
        self._records[record.session_id] = record
        self._logs[record.session_id] = _Log()
        self._calls[record.session_id] = OrderedDict()

    async def get_session(self, session_id: str) -> SessionRecord | None:
        return self._records.get(session_id)

    async def end_session(self, session_id: str) -> None:
        self._records.pop(session_id, None)
        self._logs.pop(session_id, None)
        self._calls.pop(session_id, None)
        self._ended[session_id] = None
        while len(self._ended) > self._max_ended:
            self._ended.popitem(last=False)

    async def ended(self, session_id: str) -> bool:
        return session_id in self._ended

    async def append_event(self, session_id: str, seq: int, data: bytes) -> None:
        log = self._logs.get(session_id)
        if log is None:
            return
        log.events.append((seq, data))
        log.size += len(data)
        while log.events and (len(log.events) > self._max_events or log.size > self._max_size):
            dropped_seq, dropped = log.events.popleft()
            log.size -= len(dropped)
            log.dropped_upto = dropped_seq

    async def events_after(self, session_id: str, seq: int) -> list[bytes] | None:
        log = self._logs.get(session_id)
        if log is None or seq < log.dropped_upto:
            return None
        return [data for event_seq, data in log.events if event_seq > seq]

    async def trim_events(self, session_id: str, upto_seq: int) -> None:
        log = self._logs.get(session_id)
        if log is None:
            return
        while log.events and log.events[0][0] <= upto_seq:
            dropped_seq, dropped = log.events.popleft()
            log.size -= len(dropped)
            log.dropped_upto = dropped_seq

    async def save_call(self, session_id: str, call: Call) -> None:
        calls = self._calls.get(session_id)
        if calls is None:
            return
        calls[call.call_id] = msgspec.structs.replace(call)  # a copy: the core mutates its own
        calls.move_to_end(call.call_id)
        settled = [c.call_id for c in calls.values() if c.settled]
        for call_id in settled[: max(0, len(settled) - self._max_calls)]:
            del calls[call_id]

    async def load_calls(self, session_id: str) -> list[Call]:
        return list(self._calls.get(session_id, {}).values())

    async def ping(self) -> None:
        """Always answers: it is this process's memory."""

    def log_size(self, session_id: str) -> tuple[int, int]:
        """(events, bytes) logged for a session: for tests and metrics."""
        log = self._logs.get(session_id)
        return (len(log.events), log.size) if log else (0, 0)
