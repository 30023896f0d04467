"""A session's durable points: what its events produced, committed to the store, then done.

The effects of the events a session applied in a row are committed in one write: the
events to send, the calls, and, with a durable store (Redis), the session's state when it
is due (``gateway.core.durability``). Only then are they carried out (events sent, models
and tools started: ``gateway.shell.effects``). While a commit is in flight new events queue
up and go in the next one, so a fast stream costs one store round trip per batch, not per
delta.

With the memory store (and so no lease) a commit never waits: the short path's batches (text
deltas a model's reader applied, pongs) are committed and carried out at once when they are
the first of this round of the event loop, or else at the end of the round, all the deltas
of a burst in one write (``flush_soon``).

With a durable store the session runs under a lease (``gateway.store.Lease``): a commit
under a lease another node took fails with ``LeaseLost``, and the driver lets the session
go. A store that does not answer loses nothing the session has: it goes on live, the client
is told once, and the next commit saves the whole state again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from gateway.core.call import Call
from gateway.core.durability import Checkpoints, Sends, split_batch
from gateway.core.event import Effect, Event, ToolNews
from gateway.core.session import Session
from gateway.core.state import encode_item, encode_state
from gateway.errors import StoreUnavailable
from gateway.shell.effects import Effects
from gateway.shell.rounds import ROUNDS
from gateway.shell.session_queue import SessionQueue
from gateway.store import Lease, LeaseLost, MemoryStore, Store
from gateway.wire.routing import decode_routed
from gateway.wire.v1 import Error, encode

__all__ = ["Journal", "Outcome"]

log = structlog.get_logger("gateway.driver")

Outcome = ToolNews
"""What a server tool reports: should a commit fail for a lost lease, the session's new
owner is given the ones applied in vain."""

Batch = tuple[list[Effect], Sends, list[Call], list[Outcome]]
"""The effects of the events applied since the last commit, the events among them to
send (encoded), the calls to save, and the tool outcomes they came from."""


class Journal:
    """Commits what a session's events produce, then has it carried out; and what else the
    driver asks of the store (posts, trims, the session's end, the lease's release).

    Args:
        session: the session whose events are committed.
        store: the event log and call ledger.
        lease: the session's lease, with a durable store: every commit is made under it.
        adopted_from: for a session taken over from another node, the ``seq`` of the
            state the store has: the log is never trimmed past it, and the first commit
            saves the whole state again.
        queue: the session's queue: the short path commits only while its loop is parked.
        effects: carries out what was committed.
    """

    __slots__ = (
        "_checkpoints",
        "_effects",
        "_failing",
        "_flush_scheduled",
        "_history_mark",
        "_lease",
        "_loop",
        "_memory",
        "_outcomes",
        "_posts_read",
        "_queue",
        "_round",
        "_session",
        "_store",
        "changed",
        "pending",
        "quick",
    )

    def __init__(
        self,
        session: Session,
        store: Store,
        lease: Lease | None,
        *,
        adopted_from: int | None,
        queue: SessionQueue,
        effects: Effects,
    ) -> None:
        self._session = session
        self._store = store
        self._lease = lease
        self._queue = queue
        self._effects = effects
        self._loop = asyncio.get_running_loop()
        self.pending: list[Effect] = []
        """Effects of the events applied since the last commit, in order."""
        self.changed = False
        """An event was applied since the last commit (the state is to be saved)."""
        self._posts_read = 0
        """Posts at the head of the session's inbox applied since the last commit: the next
        commit takes them out (see ``take_posts``)."""
        self._outcomes: list[Outcome] = []
        """Server tools' outcomes applied since the last commit: should the commit fail
        for a lost lease, they are posted to the session's new owner."""
        self._checkpoints = Checkpoints(
            durable=lease is not None,
            saved_seq=session.last_seq if adopted_from is None else adopted_from,
            log_only=adopted_from is None,
        )
        self._history_mark = session.history_mark
        """Where the transcript stood at the last state saved: the store has it so far."""
        self._failing = False
        """The last commit failed: the client was told (``store_unavailable``)."""
        self._memory = store if isinstance(store, MemoryStore) and lease is None else None
        self.quick = self._memory is not None
        """The store commits at once, never waits (``flush_now``): text deltas may take
        the short path (see ``gateway.shell.driver``)."""
        self._flush_scheduled = False
        """A ``flush_now`` callback is due."""
        self._round = -1
        """The round of the event loop (``ROUNDS``) of the last batch flushed at once."""

    def opened(self, effects: list[Effect]) -> None:
        """What the session asked for before its loop ran: the first commit takes it, and
        for a session adopted from another node, its whole state."""
        self.pending += effects
        self.changed = bool(self.pending) or not self._checkpoints.log_only

    def applied(self, event: Event) -> None:
        """``event`` was applied to the session: the next commit takes what it produced;
        with a durable store, the state too unless the event only added to the log, and a
        tool's outcome is kept until committed (see ``take_outcomes``)."""
        self.pending += self._session.effects()
        self.changed = True
        if self._lease is not None:  # else no state is saved, and no other node takes over
            self._checkpoints.applied(event)
            if isinstance(event, ToolNews):
                self._outcomes.append(event)

    def changed_state(self) -> None:
        """The session's state changed beyond what its log says (its core failed on an
        event): the next commit saves it."""
        self._checkpoints.changed()

    async def flush(self) -> list[Outcome] | None:
        """Commit what the events applied since the last flush produced, then carry it out.

        Returns:
            ``None`` once done (the store's failure included: the session goes on live);
            when the lease is lost, the tool outcomes the batch applied in vain, for the
            session's new owner (nothing was carried out: it is not ours now).
        """
        batch = self._take()
        if batch is None:
            return None
        effects, sends, calls, outcomes = batch
        if not await self._commit(sends, calls, outcomes):
            return outcomes
        self._effects.carry_out(effects, sends)
        return None

    def flush_soon(self) -> None:
        """Flush what the short path applied: at once if it is the first of this round of
        the event loop (most likely alone: a paced delta, a ping), else with the rest of
        the round's, from a callback at its end (a burst, in one write)."""
        if self._flush_scheduled:
            return  # the flush due takes it too
        round_ = ROUNDS.current(self._loop)
        if round_ != self._round:
            self._round = round_
            self.flush_now()
        else:
            self._flush_scheduled = True
            self._loop.call_soon(self.flush_now)

    def flush_now(self) -> None:
        """``flush`` with a store that commits at once, for what the short path applied;
        unless the session's loop is busy with an event: its own flush takes them, in order.
        The path of every delta: the batch is taken and committed here, in one call."""
        self._flush_scheduled = False
        memory = self._memory
        if not self._queue.parked or memory is None or not self.changed:
            return
        effects, self.pending, self.changed = self.pending, [], False
        sends, calls = split_batch(effects, encode)
        events = [(msg.seq or 0, data) for msg, data in sends]
        if calls:
            memory.commit_now(
                self._session.session_id, None, state=None, events=events, calls=calls
            )
        else:  # the usual case: deltas, pongs
            memory.log_now(self._session.session_id, events)
        self._effects.carry_out(effects, sends)

    def _take(self) -> Batch | None:
        """The batch to commit: what the events applied since the last commit produced;
        ``None`` if none was applied."""
        if not self.changed:
            return None
        effects, self.pending, self.changed = self.pending, [], False
        outcomes, self._outcomes = self._outcomes, []
        sends, calls = split_batch(effects, encode)
        return effects, sends, calls, outcomes

    async def _commit(self, sends: Sends, calls: list[Call], outcomes: list[Outcome]) -> bool:
        """Commit a batch to the store, under the lease, with the state if it is due;
        ``False`` when the lease is lost (another node took the session)."""
        session = self._session
        state = None
        if self._checkpoints.saves_state(sends):
            state = encode_state(session.state(with_history=False))
        saved_seq = session.last_seq
        # The transcript goes apart from the rest of the state: only what changed.
        mark = session.history_mark
        dropped, added = session.history_since(self._history_mark) if state else (0, [])
        try:
            await self._store.commit(
                session.session_id,
                self._lease,
                state=state,
                events=[(msg.seq or 0, data) for msg, data in sends],
                calls=calls,
                history_drop=dropped,
                history=[encode_item(item) for item in added],
                posts_taken=self._posts_read,
            )
        except LeaseLost:
            log.warning("session_lease_lost", events=len(sends))
            return False
        except StoreUnavailable as exc:
            # Kept until a commit takes them: should the lease be lost meanwhile, they
            # are posted to the new owner.
            self._outcomes[:0] = outcomes
            self.store_down(exc)
        else:
            self._posts_read = 0
            if state is not None:
                self._history_mark = mark
                self._checkpoints.saved(saved_seq)
            if self._failing:
                log.info("store_recovered")
                self._failing = False
        return True

    def take_outcomes(self) -> list[Outcome]:
        """The tool outcomes applied since the last commit, never to be committed here
        (the session moved): for its new owner."""
        outcomes, self._outcomes = self._outcomes, []
        return outcomes

    async def take_posts(self, apply: Callable[[Event], None]) -> bool:
        """Apply (with ``apply``) what other nodes posted for the session: tool outcomes
        and progress. The next commit takes them out of the inbox: should this node lose
        the session or die first, they stay there for the next owner (so they are not
        posted again).

        Returns:
            Whether anything was read: the caller commits it.
        """
        try:
            posts = await self._store.read_posts(self._session.session_id)
        except StoreUnavailable as exc:
            self.store_down(exc)
            return False
        if not posts:
            return False
        ours = len(self._outcomes)
        for data in posts:
            routed = decode_routed(data)
            if routed is None:
                log.error("post_unreadable", size=len(data))
                continue
            apply(routed)  # again, if read before and not yet taken: applied once
        del self._outcomes[ours:]  # they are in the inbox still
        self._posts_read = len(posts)  # from the inbox's head: what the next commit takes
        self.changed = True
        return True

    async def trim(self, upto_seq: int) -> None:
        """The client has every event up to ``upto_seq``: the log may drop them (but
        those after the last state saved: a node taking the session over needs them)."""
        try:
            await self._store.trim_events(
                self._session.session_id, self._checkpoints.trim_bound(upto_seq)
            )
        except StoreUnavailable as exc:  # they go with a later ack, or with the session
            self.store_down(exc)

    def store_down(self, exc: StoreUnavailable) -> None:
        """The store did not take a commit: the session goes on live (the next commit
        saves the whole state again); a resume meanwhile may find a gap in the log."""
        self.changed = self._lease is not None  # save the state at the next commit
        self._checkpoints.changed()
        if self._failing:
            return
        self._failing = True
        log.warning("store_unavailable", error=str(exc))
        self._effects.send_now(
            Error(
                code="store_unavailable",
                message="the session store does not answer: this conversation goes on, but"
                " a reconnect may lose events until it is back",
                retryable=True,
            )
        )

    async def end(self) -> None:
        """The session ended: the store forgets it."""
        try:
            await self._store.end_session(self._session.session_id)
        except StoreUnavailable as exc:  # its keys expire by themselves
            log.warning("session_not_ended_in_store", error=str(exc))

    async def release(self) -> None:
        """Give the lease back, so that another node can take the session at once."""
        if self._lease is None:
            return
        try:
            await self._store.release(self._session.session_id, self._lease)
        except StoreUnavailable as exc:  # it expires by itself
            log.warning("lease_not_released", error=str(exc))
