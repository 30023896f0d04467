"""The in-process ``Store``: one node's sessions, their logs, ledgers and leases in memory.

Same semantics as the Redis store (tests/test_store_contract.py runs against both), so the
driver cannot tell them apart; sessions end with their process.
"""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field

import msgspec

from gateway.core.call import Call
from gateway.store.base import Lease, LeaseLost, SessionRecord

__all__ = ["MemoryStore"]


@dataclass
class _Log:
    """Events in two parallel lists, not one of ``(seq, data)`` pairs: a pair per event
    is an object the garbage collector tracks, and a log of thousands of sessions would
    give it hundreds of thousands to walk at every full collection (stalls of 100 ms).
    Lists, not deques: an empty deque is 760 bytes and every session has a log (see
    ``gateway.shell.flag``). The oldest go by moving ``head``; the lists are cut once half of
    them is dropped, so dropping stays O(1) amortized."""

    seqs: list[int] = field(default_factory=list)
    events: list[bytes] = field(default_factory=list)
    head: int = 0
    """Index of the oldest event kept."""
    size: int = 0
    dropped_upto: int = 0
    """Highest seq no longer kept: a replay from before it has a gap."""
    last_seq: int = 0
    """Highest seq ever logged: an event at or below it is a repeat."""

    def __len__(self) -> int:
        return len(self.events) - self.head

    def append(self, seq: int, data: bytes) -> None:
        self.last_seq = seq
        self.seqs.append(seq)
        self.events.append(data)
        self.size += len(data)

    def first_seq(self) -> int | None:
        return self.seqs[self.head] if self.head < len(self.seqs) else None

    def after(self, seq: int) -> list[bytes]:
        """The events kept with a seq above ``seq``, oldest first."""
        return [
            data
            for event_seq, data in zip(
                self.seqs[self.head :], self.events[self.head :], strict=True
            )
            if event_seq > seq
        ]

    def drop_first(self) -> None:
        head = self.head
        self.dropped_upto = self.seqs[head]
        self.size -= len(self.events[head])
        self.events[head] = b""  # its bytes go now, not at the next cut
        self.head = head = head + 1
        if head >= _LOG_CUT and head * 2 >= len(self.events):
            del self.seqs[:head]
            del self.events[:head]
            self.head = 0


_LOG_CUT = 64
"""A log's dropped entries are cut off once there are this many and they are half of it."""


@dataclass
class _Session:
    record: SessionRecord
    log: _Log = field(default_factory=_Log)
    calls: OrderedDict[str, Call] = field(default_factory=OrderedDict)
    settled: OrderedDict[str, None] = field(default_factory=OrderedDict)
    """The settled calls' ids, least recently saved first (the ledger's bound)."""
    state: bytes | None = None
    inbox: list[bytes] = field(default_factory=list)
    history: list[bytes] = field(default_factory=list)


class MemoryStore:
    """A ``Store`` in this process's memory, bounded per session.

    Args:
        max_events: events kept per session (``replay_max_events``).
        max_size: bytes of events kept per session (``replay_max_size``).
        max_calls: settled calls kept per session for duplicate detection.
        max_ended: ended session ids remembered (to tell "expired" from "unknown").
        session_ttl: seconds a session's data lives after its last write or renew (plus
            ``lease_ttl``), like the Redis store's keys; ``None`` keeps it until
            ``end_session`` (one process: the driver ends its sessions itself).
        lease_ttl: added to ``session_ttl``: a node renews before its lease runs out.
    """

    def __init__(
        self,
        *,
        max_events: int = 10_000,
        max_size: int = 4 * 2**20,
        max_calls: int = 1_000,
        max_ended: int = 100_000,
        session_ttl: float | None = None,
        lease_ttl: float = 10.0,
    ) -> None:
        self._max_events = max_events
        self._max_size = max_size
        self._max_calls = max_calls
        self._max_ended = max_ended
        self._ttl = None if session_ttl is None else session_ttl + lease_ttl
        self._sessions: dict[str, _Session] = {}
        self._fences: dict[str, int] = {}
        self._owners: dict[str, tuple[str, float]] = {}
        """session id -> (node, monotonic time its lease runs out)."""
        self._expiry: OrderedDict[str, float] = OrderedDict()
        """session id -> monotonic time its data goes, soonest first (with ``session_ttl``)."""
        self._soonest = 0.0
        """No session's data goes before this: the first deadline when last looked at. The
        first deadline never moves earlier (a touch moves a session to the end, later), so
        it stays a lower bound."""
        self._ended: OrderedDict[str, None] = OrderedDict()
        self._listeners: dict[str, list[Callable[[str], None]]] = {}
        self._named: dict[str, tuple[bytes, float]] = {}
        """name -> (value, monotonic time it goes)."""
        self._named_expiry: list[tuple[float, str]] = []
        """A heap of (time it goes, name), soonest first, one entry per put: an entry whose
        time is no longer its name's (put again since) is stale and skipped."""

    async def create_session(self, record: SessionRecord) -> None:
        self._sessions[record.session_id] = _Session(record)
        self._touch(record.session_id)

    async def get_session(self, session_id: str) -> SessionRecord | None:
        entry = self._get(session_id)
        return entry.record if entry else None

    async def end_session(self, session_id: str) -> None:
        self._expire_due()
        self._forget(session_id)
        self._ended[session_id] = None
        while len(self._ended) > self._max_ended:
            self._ended.popitem(last=False)

    async def ended(self, session_id: str) -> bool:
        self._expire_due()
        return session_id in self._ended

    async def append_event(self, session_id: str, seq: int, data: bytes) -> None:
        await self.commit(session_id, None, state=None, events=[(seq, data)])

    async def events_after(
        self, session_id: str, seq: int, *, lease: Lease | None = None
    ) -> list[bytes] | None:
        if lease is not None and not self._holds(session_id, lease):
            raise LeaseLost(f"session {session_id}: lease {lease.fence} was taken over")
        entry = self._get(session_id)
        if entry is None or seq < entry.log.dropped_upto:
            return None
        return entry.log.after(seq)

    async def trim_events(self, session_id: str, upto_seq: int) -> None:
        entry = self._get(session_id)
        if entry is None:
            return
        log = entry.log
        while (first := log.first_seq()) is not None and first <= upto_seq:
            log.drop_first()

    async def save_call(self, session_id: str, call: Call) -> None:
        await self.commit(session_id, None, state=None, events=(), calls=[call])

    async def load_calls(self, session_id: str) -> list[Call]:
        entry = self._get(session_id)
        return list(entry.calls.values()) if entry else []

    async def ping(self) -> None:
        """Always answers: it is this process's memory."""

    async def acquire(self, session_id: str, node: str, *, ttl: float) -> Lease:
        self._expire_due()
        fence = self._fences.get(session_id, 0) + 1
        self._fences[session_id] = fence
        self._owners[session_id] = (node, time.monotonic() + ttl)
        self._touch(session_id)
        return Lease(node, fence)

    async def renew(self, session_id: str, lease: Lease, *, ttl: float) -> bool:
        if not self._holds(session_id, lease):
            return False
        self._owners[session_id] = (lease.node, time.monotonic() + ttl)
        self._touch(session_id)
        return True

    async def renew_many(self, leases: Sequence[tuple[str, Lease]], *, ttl: float) -> list[bool]:
        return [await self.renew(session_id, lease, ttl=ttl) for session_id, lease in leases]

    async def release(self, session_id: str, lease: Lease) -> None:
        if self._holds(session_id, lease):
            self._owners.pop(session_id, None)

    async def owner(self, session_id: str) -> str | None:
        self._expire_due()
        held = self._owners.get(session_id)
        return held[0] if held and held[1] > time.monotonic() else None

    async def commit(
        self,
        session_id: str,
        lease: Lease | None,
        *,
        state: bytes | None,
        events: Sequence[tuple[int, bytes]],
        calls: Sequence[Call] = (),
        history_drop: int = 0,
        history: Sequence[bytes] = (),
        posts_taken: int = 0,
    ) -> None:
        self.commit_now(
            session_id,
            lease,
            state=state,
            events=events,
            calls=calls,
            history_drop=history_drop,
            history=history,
            posts_taken=posts_taken,
        )

    def commit_now(
        self,
        session_id: str,
        lease: Lease | None,
        *,
        state: bytes | None,
        events: Sequence[tuple[int, bytes]],
        calls: Sequence[Call] = (),
        history_drop: int = 0,
        history: Sequence[bytes] = (),
        posts_taken: int = 0,
    ) -> None:
        """``commit``, done before it returns (nothing here waits): a driver may commit
        from a callback (see ``Journal.flush_now`` in ``gateway.shell.journal``)."""
        if lease is not None and not self._holds(session_id, lease):
            raise LeaseLost(f"session {session_id}: lease {lease.fence} was taken over")
        entry = self._get(session_id)
        if entry is None:
            return
        for seq, data in events:
            self._log(entry.log, seq, data)
        if state is not None:
            entry.state = state
        for call in calls:
            self._save_call(entry, call)
        if history_drop:
            del entry.history[:history_drop]
        if history:
            entry.history += history
        if posts_taken:
            del entry.inbox[:posts_taken]
        self._touch(session_id)

    def log_now(self, session_id: str, events: Iterable[tuple[int, bytes]]) -> None:
        """``commit_now`` of events alone (no lease, state, calls or history): what a
        stream's deltas commit, on the path of every one."""
        entry = self._get(session_id)
        if entry is None:
            return
        log = entry.log
        for seq, data in events:
            self._log(log, seq, data)
        self._touch(session_id)

    async def load_state(self, session_id: str) -> bytes | None:
        entry = self._get(session_id)
        return entry.state if entry else None

    async def load_history(self, session_id: str) -> list[bytes]:
        entry = self._get(session_id)
        return list(entry.history) if entry else []

    async def post(self, session_id: str, data: bytes) -> None:
        entry = self._get(session_id)
        if entry is None:
            return
        entry.inbox.append(data)
        node = await self.owner(session_id)
        for wake in list(self._listeners.get(node, ())) if node else ():
            wake(session_id)

    async def read_posts(self, session_id: str) -> list[bytes]:
        entry = self._get(session_id)
        return list(entry.inbox) if entry else []

    def listen(self, node: str, wake: Callable[[str], None]) -> AbstractAsyncContextManager[None]:
        return self._listen(node, wake)

    @asynccontextmanager
    async def _listen(self, node: str, wake: Callable[[str], None]) -> AsyncIterator[None]:
        self._listeners.setdefault(node, []).append(wake)
        try:
            yield
        finally:
            self._listeners[node].remove(wake)
            if not self._listeners[node]:
                del self._listeners[node]

    async def put_named(self, name: str, value: bytes, *, ttl: float) -> None:
        self._expire_named()
        deadline = time.monotonic() + ttl
        self._named[name] = (value, deadline)
        heapq.heappush(self._named_expiry, (deadline, name))

    async def get_named(self, name: str) -> bytes | None:
        self._expire_named()
        found = self._named.get(name)
        return None if found is None else found[0]

    async def aclose(self) -> None:
        """Nothing to let go of."""

    def log_size(self, session_id: str) -> tuple[int, int]:
        """(events, bytes) logged for a session: for tests and metrics."""
        entry = self._sessions.get(session_id)
        return (len(entry.log), entry.log.size) if entry else (0, 0)

    def _get(self, session_id: str) -> _Session | None:
        self._expire_due()
        return self._sessions.get(session_id)

    def _holds(self, session_id: str, lease: Lease) -> bool:
        self._expire_due()
        return self._fences.get(session_id) == lease.fence

    def _log(self, log: _Log, seq: int, data: bytes) -> None:
        if seq <= log.last_seq:
            return
        log.append(seq, data)
        while (kept := len(log.events) - log.head) and (
            kept > self._max_events or log.size > self._max_size
        ):
            log.drop_first()

    def _save_call(self, entry: _Session, call: Call) -> None:
        entry.calls[call.call_id] = msgspec.structs.replace(call)  # a copy: the core mutates
        entry.calls.move_to_end(call.call_id)
        if call.settled:
            entry.settled[call.call_id] = None
            entry.settled.move_to_end(call.call_id)
        else:
            entry.settled.pop(call.call_id, None)
        while len(entry.settled) > self._max_calls:  # the least recently saved go first
            call_id, _ = entry.settled.popitem(last=False)
            del entry.calls[call_id]

    def _touch(self, session_id: str) -> None:
        if self._ttl is None:
            return
        self._expiry[session_id] = time.monotonic() + self._ttl
        self._expiry.move_to_end(session_id)  # one TTL for all: the order stays soonest first

    def _expire_due(self) -> None:
        """Drop the sessions whose TTL ran out (lazily, as Redis keys expire)."""
        now = time.monotonic()
        if now < self._soonest:
            return  # on every commit: one comparison
        while self._expiry:
            session_id, deadline = next(iter(self._expiry.items()))
            if deadline > now:
                self._soonest = deadline
                return
            existed = session_id in self._sessions
            self._forget(session_id)
            if existed:
                self._ended[session_id] = None

    def _expire_named(self) -> None:
        """Drop the named values whose TTL ran out (lazily, as Redis keys expire)."""
        now = time.monotonic()
        heap = self._named_expiry
        while heap and heap[0][0] <= now:
            deadline, name = heapq.heappop(heap)
            found = self._named.get(name)
            if found is not None and found[1] == deadline:
                del self._named[name]

    def _forget(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)
        self._fences.pop(session_id, None)
        self._owners.pop(session_id, None)
        self._expiry.pop(session_id, None)
