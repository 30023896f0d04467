"""This node among the others on a shared store (Redis): the moves of sessions between
nodes.

One node drives a session at a time: the one that holds its lease. ``find_session`` answers
a ``session.resume``: with a session driven here that this node still holds, or with one it
takes over from the store (``adopt``) because another node drove it (it died, it is shutting
down, or the client simply reconnected elsewhere); the session taken over is caught up from
the log with what was sent since its state was saved. Only the session's creator, with its
resume token, gets it. Meanwhile the node renews the leases of the sessions it drives and
listens for what other nodes post to them.

With the in-process store (``MemoryStore``) there is one node: no lease, no log to catch up
from, nothing to listen for.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from collections.abc import Mapping
from typing import Protocol

import msgspec
import structlog

from gateway.auth.admission import SessionQuota
from gateway.core.session import Session
from gateway.core.state import SessionState, decode_items, decode_state
from gateway.errors import Closing, StoreUnavailable, TooManySessions, closing, of_error
from gateway.shell.driver import Driver
from gateway.shell.metrics import Metrics
from gateway.store import Lease, MemoryStore, SessionRecord, Store
from gateway.wire.v1 import SessionAttach, SessionResume, decode_server

__all__ = ["Cluster", "Host", "ResumeRefusal", "token_hash"]

log = structlog.get_logger("gateway.app")

_RENEW_BATCH = 500
"""Leases renewed in one pipeline (one round trip to the store)."""

ResumeRefusal = Closing
"""Why a ``session.resume`` is refused: close code, reason, label for logs."""


def token_hash(token: str) -> str:
    """What the store keeps of a resume token."""
    return hashlib.sha256(token.encode()).hexdigest()


def _caught_up(session: Session, logged: list[bytes]) -> bool:
    """Catch ``session`` up with events its log has after its saved state."""
    try:
        sent = [decode_server(data) for data in logged]
    except msgspec.ValidationError:  # DecodeError too: not events this gateway wrote
        return False
    return session.catch_up(sent)


def _check_owner(
    record: SessionRecord, msg: SessionResume | SessionAttach, principal: str
) -> ResumeRefusal | None:
    """Why ``principal`` may not resume the session of ``record`` with ``msg``, if so."""
    # Both checks run, so the answer's timing tells nothing about which failed.
    owner = hmac.compare_digest(record.principal.encode(), principal.encode())
    token = hmac.compare_digest(record.token_hash, token_hash(msg.resume_token))
    if not owner:
        return closing("not_owner")
    if not token:
        return closing("wrong_resume_token")
    return None


class Host(Protocol):
    """What a cluster asks of the runtime that holds it."""

    @property
    def closing(self) -> bool:
        """The node is shutting down: it takes nothing over."""

    def restore(self, state: SessionState) -> Session:
        """The session ``state`` is, with this node's settings."""

    def run_adopted(
        self, session: Session, principal: str, lease: Lease | None, *, seq: int
    ) -> Driver:
        """Drive ``session``, taken over at ``seq``, here from now on."""


class Cluster:
    """This node's part in the moves of sessions between nodes on a shared store.

    Args:
        host: the runtime that holds it.
        store: where sessions are kept.
        node: this node's name in leases.
        lease_ttl: seconds a lease holds unless renewed.
        drivers: the sessions driven here, by id (the runtime's registry, read only).
        sessions: the session quota a session taken over is counted against.
        metrics: counts the sessions taken over.
    """

    def __init__(
        self,
        host: Host,
        store: Store,
        *,
        node: str,
        lease_ttl: float,
        drivers: Mapping[str, Driver],
        sessions: SessionQuota,
        metrics: Metrics,
    ) -> None:
        self._host = host
        self._store = store
        self._node = node
        self._lease_ttl = lease_ttl
        self._drivers = drivers
        self._sessions = sessions
        self._metrics = metrics
        self.durable = not isinstance(store, MemoryStore)
        """Sessions are saved whole and may move between nodes (a shared store: Redis)."""
        self._adopting: dict[str, asyncio.Future[Driver | ResumeRefusal]] = {}
        self._background: list[asyncio.Task[None]] = []

    async def acquire(self, session_id: str) -> Lease | None:
        """The session's lease for this node, with a durable store (taken from any other)."""
        if not self.durable:
            return None
        return await self._store.acquire(session_id, self._node, ttl=self._lease_ttl)

    async def find_session(
        self, msg: SessionResume | SessionAttach, principal: str
    ) -> Driver | ResumeRefusal:
        """The live session a ``session.resume`` by ``principal`` names, or the close code
        and reason refusing it (only the session's creator may resume it)."""
        driver = self._drivers.get(msg.session_id)
        if driver is not None and self.durable and not await self._still_ours(driver):
            driver = None  # it left this node: take it over again, from the store
        record = await self._store.get_session(msg.session_id)
        if record is not None and driver is None and self.durable:
            refusal = _check_owner(record, msg, principal)
            if refusal is not None:
                return refusal
            return await self._adopt(record)
        if driver is None or record is None:
            if await self._store.ended(msg.session_id):
                return closing("session_expired")
            return closing("unknown_session")
        return _check_owner(record, msg, principal) or driver

    async def _still_ours(self, driver: Driver) -> bool:
        """Whether this node still drives ``driver``'s session. Asked of the store before a
        resume attaches here: a lease renewal late on a busy node must not let a client
        resume a copy another node has moved on from."""
        if driver.moved:
            return False
        if driver.lease is None:
            return True
        if await self._store.renew(driver.session_id, driver.lease, ttl=self._lease_ttl):
            return True
        driver.let_go()
        return False

    async def _adopt(self, record: SessionRecord) -> Driver | ResumeRefusal:
        """Take a session over from the store: another node drove it (it died, it is
        shutting down, or the client simply reconnected elsewhere)."""
        session_id = record.session_id
        adopting = self._adopting.get(session_id)
        if adopting is not None:  # two resumes at once on this node: one adoption
            return await asyncio.shield(adopting)
        future: asyncio.Future[Driver | ResumeRefusal] = asyncio.get_running_loop().create_future()
        self._adopting[session_id] = future
        try:
            found = await self._take_over(record)
            future.set_result(found)
            return found
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: a lone adoption need not be awaited twice
            raise
        finally:
            del self._adopting[session_id]

    async def _take_over(self, record: SessionRecord) -> Driver | ResumeRefusal:
        expired = closing("session_expired")
        if self._host.closing:
            return closing("shutting_down")
        try:
            self._sessions.reserve(record.principal, record.agent)
        except TooManySessions as exc:
            return of_error(exc)
        try:
            lease = await self.acquire(record.session_id)  # first: no write of theirs after
            data = await self._store.load_state(record.session_id)
            if data is None:  # never started, or ended meanwhile
                if lease is not None:
                    await self._store.release(record.session_id, lease)
                self._sessions.release(record.principal, record.agent)
                return expired
            state = decode_state(data)
            state.history = decode_items(await self._store.load_history(record.session_id))
            session = self._host.restore(state)
            # The text a stream sent since the state was last saved is in the log.
            tail = await self._store.events_after(record.session_id, state.seq)
        except BaseException:
            self._sessions.release(record.principal, record.agent)
            raise
        if tail is None or (tail and not _caught_up(session, tail)):
            if lease is not None and not await self._holds(record.session_id, lease):
                # Another node took the session over while this one read it, and moved on
                # (its acks trimmed the log): the client resumes where it is now.
                self._sessions.release(record.principal, record.agent)
                return closing("session_moved")
            # Never, by the driver's rule (the log is not trimmed past the state saved):
            # were it so, the session would go on from an older point than its client's.
            log.error(
                "session_log_not_caught_up",
                session_id=record.session_id,
                saved_seq=state.seq,
                caught_up_to=session.last_seq,
                gap=tail is None,
            )
        session.adopt(time.time())
        log.info("session_adopted", session_id=record.session_id, seq=state.seq)
        self._metrics.note_adoption()
        return self._host.run_adopted(session, record.principal, lease, seq=state.seq)

    async def _holds(self, session_id: str, lease: Lease) -> bool:
        """Whether ``lease`` is still the session's (renewed if so); ``False`` too when
        the store does not answer (the lease will not be renewed either)."""
        try:
            return await self._store.renew(session_id, lease, ttl=self._lease_ttl)
        except StoreUnavailable:
            return False

    def start(self) -> None:
        """With a durable store: renew this node's leases, listen for posts to its
        sessions. Called with each session started here; the first call starts them (they
        need the running loop)."""
        if self.durable and not self._background:
            self._background = [
                asyncio.create_task(self._renew_leases(), name="gateway:leases"),
                asyncio.create_task(self._listen(), name="gateway:listen"),
            ]

    async def aclose(self) -> None:
        """Stop renewing leases and listening."""
        background, self._background = self._background, []
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)

    async def _renew_leases(self) -> None:
        """Renew the lease of every session driven here, every third of ``lease_ttl``, in
        pipelines of ``_RENEW_BATCH``; a session whose lease another node took is let go."""
        while True:
            await asyncio.sleep(self._lease_ttl / 3)
            await self.renew_leases()

    async def renew_leases(self) -> None:
        """One pass of the renewals: every lease of this node, in pipelines of
        ``_RENEW_BATCH``; a session whose lease another node took is let go."""
        drivers = [d for d in self._drivers.values() if d.lease is not None and not d.moved]
        for start in range(0, len(drivers), _RENEW_BATCH):
            batch = [(d, d.lease) for d in drivers[start : start + _RENEW_BATCH] if d.lease]
            try:
                renewed = await self._store.renew_many(
                    [(d.session_id, lease) for d, lease in batch], ttl=self._lease_ttl
                )
            except StoreUnavailable as exc:
                log.warning("leases_not_renewed", sessions=len(batch), error=str(exc))
                continue
            for (driver, _), held in zip(batch, renewed, strict=True):
                if not held:
                    driver.let_go()

    async def _listen(self) -> None:
        """Wake the sessions driven here when something is posted for them."""
        while True:
            try:
                async with self._store.listen(self._node, self._wake):
                    await asyncio.Future()  # until cancelled, or the listener fails
            except StoreUnavailable as exc:
                log.warning("store_listen_failed", error=str(exc))
                await asyncio.sleep(1.0)

    def _wake(self, session_id: str) -> None:
        driver = self._drivers.get(session_id)
        if driver is not None:
            driver.take_posts()
