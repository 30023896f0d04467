"""Where sessions keep what must survive their socket and their process: the ``Store``.

A session's record, its encoded state, the event log, the call ledger, an inbox of
events routed from other nodes, and the lease that says which node drives it. The
``Store`` interface is async and keyed by session id, so that a networked
implementation (``gateway.store.redis``, for sessions that move between gateway nodes)
can stand behind it; nothing here assumes one process. ``gateway.store.memory`` is the
in-process implementation, with the same semantics (the contract test in
tests/test_store_contract.py runs against both).

Ownership: a node drives a session under a ``Lease`` (``acquire``, then ``renew`` it
every fraction of its TTL). Each acquire gives a higher fencing token; ``commit`` under
any older lease raises ``LeaseLost`` and writes nothing, so a node that was taken over
(or paused past its lease) cannot clobber the new owner's state.

Besides sessions, named values (``put_named``, ``get_named``): small blobs with a TTL that
every node reads, for what an edge must find on whichever node a request lands (an A2A
context's session, an A2A task). Last write wins; nothing else is promised.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol

import msgspec

from gateway.core.call import Call

__all__ = ["Lease", "LeaseLost", "SessionRecord", "Store"]


class Lease(msgspec.Struct, frozen=True):
    """The right to drive a session, held by one node."""

    node: str
    """The node id holding it."""
    fence: int
    """Increases by one at every acquire; a write with an older fence fails."""


class LeaseLost(Exception):
    """A write or renew by a node whose lease was taken over (or expired and taken).

    Not a ``GatewayError``: the client did nothing wrong. The node stops driving the
    session; whoever holds the lease now serves it.
    """


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
    """Session records, state, event logs, call ledgers, inboxes and leases; named values."""

    async def create_session(self, record: SessionRecord) -> None: ...

    async def get_session(self, session_id: str) -> SessionRecord | None: ...

    async def end_session(self, session_id: str) -> None:
        """Forget the session's data; remember that it existed (``ended`` says so)."""

    async def ended(self, session_id: str) -> bool:
        """True if the session existed and is gone: ended, or expired unresumed."""

    async def append_event(self, session_id: str, seq: int, data: bytes) -> None:
        """Log an encoded server event. Bounded: the oldest events may be dropped.

        An event whose ``seq`` is not above the newest logged one is ignored, so a
        commit retried after a lost answer does not log twice.
        """

    async def events_after(
        self, session_id: str, seq: int, *, lease: Lease | None = None
    ) -> list[bytes] | None:
        """Every logged event after ``seq``, in order; ``None`` if some are gone (a gap).

        Args:
            lease: read only while it is the session's lease, in one step with the read
                (a node replaying to a resuming client must not answer from a session
                another node took over meanwhile); ``None`` reads unchecked.

        Raises:
            LeaseLost: ``lease`` is not the session's current lease.
        """

    async def trim_events(self, session_id: str, upto_seq: int) -> None:
        """Drop the events up to ``upto_seq`` (the client has them)."""

    async def save_call(self, session_id: str, call: Call) -> None: ...

    async def load_calls(self, session_id: str) -> list[Call]:
        """The session's calls, least recently saved first."""

    async def ping(self) -> None:
        """Return if the store answers (``/readyz``); raise if it cannot serve."""

    async def acquire(self, session_id: str, node: str, *, ttl: float) -> Lease:
        """Take the session's lease for ``node``, whoever holds it now.

        A resume on any node takes the session over: the fence goes up by one and
        writes under any earlier lease fail from then on.
        """

    async def renew(self, session_id: str, lease: Lease, *, ttl: float) -> bool:
        """Extend the lease (and keep every key of the session alive); False if lost."""

    async def renew_many(self, leases: Sequence[tuple[str, Lease]], *, ttl: float) -> list[bool]:
        """``renew`` for each ``(session_id, lease)``, in order, at once."""

    async def release(self, session_id: str, lease: Lease) -> None:
        """Give the lease up (if still held), so ``owner`` says nobody drives the session."""

    async def owner(self, session_id: str) -> str | None:
        """The node holding an unexpired lease, or None."""

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
        """One durable point, all or nothing, in one round trip.

        Appends ``events`` (seq, encoded) to the log with the bounds of
        ``append_event``, saves the encoded session ``state`` if given, saves ``calls``
        into the ledger, drops the ``history_drop`` oldest items of the session's
        transcript and appends ``history`` (encoded items) to it, and takes the
        ``posts_taken`` oldest posts out of the inbox (the ones this commit applied, read
        with ``read_posts``). Nothing is written for a session that does not exist (ended
        or expired).

        Args:
            lease: the lease the write is made under; ``None`` skips the check (one
                node).

        Raises:
            LeaseLost: ``lease`` is not the session's current lease; nothing was written.
        """

    async def load_state(self, session_id: str) -> bytes | None:
        """The encoded state of the last commit that carried one, or None."""

    async def load_history(self, session_id: str) -> list[bytes]:
        """The session's transcript as its commits left it: encoded items, oldest first."""

    async def post(self, session_id: str, data: bytes) -> None:
        """Leave a routed event for whoever owns the session.

        For a server tool's outcome or progress that finished on another node: it is
        appended to the session's inbox (kept until a commit takes it, expires with the session;
        dropped if the session does not exist) and the owning node is woken.
        """

    async def read_posts(self, session_id: str) -> list[bytes]:
        """Everything posted for the session and not yet taken, oldest first. Reading takes
        nothing: the commit that saves what the owner made of them takes them
        (``commit``'s ``posts_taken``), so a node that dies in between loses none."""

    def listen(self, node: str, wake: Callable[[str], None]) -> AbstractAsyncContextManager[None]:
        """While entered, call ``wake(session_id)`` when something is posted for a session
        whose lease ``node`` holds. A wake says "call ``read_posts``"; it carries nothing."""

    async def put_named(self, name: str, value: bytes, *, ttl: float) -> None:
        """Keep ``value`` under ``name`` for ``ttl`` seconds, replacing what was there (and
        its TTL). Callers scope their names (``a2a:context:...``): they share one space.

        Raises:
            StoreUnavailable: the store does not answer.
        """

    async def get_named(self, name: str) -> bytes | None:
        """The value last put under ``name``, or None if none was, or its TTL ran out.

        Raises:
            StoreUnavailable: the store does not answer.
        """

    async def aclose(self) -> None:
        """Let go of connections; the store is not used afterwards."""
